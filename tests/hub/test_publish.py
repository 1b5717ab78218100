"""publish_folder / publish_checkpoint against the local Hub server with the real client."""

import hashlib
import json
from pathlib import Path

import pytest
from conftest_hub import hub_snapshot, local_files

from lerobot_pipe.hub import (
    ALLOW_PATTERNS,
    PublishError,
    collect_publish_files,
    make_model_card,
    publish_checkpoint,
    publish_folder,
)

# huggingface_hub's LFS PUT passes a file object as data=, which httpx2 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")

REPO = "alice/act-policy"
EXPECTED = {
    "config.json",
    "train_config.json",
    "policy_preprocessor.json",
    "policy_preprocessor_step_0_normalizer_processor.safetensors",
    "model.safetensors",
}


def tree_state(folder: Path) -> dict[str, tuple[str, int]]:
    return {
        p.relative_to(folder).as_posix(): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_mtime_ns,
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def commit_posts(server):
    return server.find_requests(r"/commit/", method="POST")


def test_allow_list_excludes_dcp_and_training_state(make_checkpoint):
    step_dir = make_checkpoint()
    assert set(collect_publish_files(step_dir / "pretrained_model")) == EXPECTED
    # From the step folder itself training_state/ is still excluded.
    assert set(collect_publish_files(step_dir)) == {f"pretrained_model/{p}" for p in EXPECTED}
    assert ALLOW_PATTERNS == ["*.safetensors", "*.json", "*.yaml", "*.md"]


def test_roundtrip_is_byte_identical(small_lfs_hub, make_checkpoint, tmp_path):
    server = small_lfs_hub
    step_dir = make_checkpoint()
    pm = step_dir / "pretrained_model"
    before = tree_state(step_dir)

    receipt = publish_folder(pm, REPO, token=server.token, endpoint=server.url, backoff_s=0.01)

    assert receipt.created_commit
    assert receipt.repo_id == REPO and receipt.repo_type == "model" and receipt.revision == "main"
    assert receipt.commit_id == server.head(REPO)
    assert receipt.commit_url.endswith(f"/{REPO}/commit/{receipt.commit_id}")
    assert set(receipt.files) == EXPECTED
    # One LFS file (above the 1 KiB threshold) and regular small files.
    assert server.file_info(REPO, "model.safetensors")["lfs"] is True
    assert server.file_info(REPO, "config.json")["lfs"] is False
    assert server.find_requests(r"^/_lfs/upload/", method="PUT")
    # Never DCP shards, .metadata or training state.
    remote = set(server.list_files(REPO))
    assert remote == EXPECTED | {".gitattributes"}

    downloaded = local_files(hub_snapshot(server, REPO, tmp_path / "dl"))
    downloaded.pop(".gitattributes")
    assert downloaded == {p: (pm / p).read_bytes() for p in EXPECTED}
    # Publishing never touches local files.
    assert tree_state(step_dir) == before


def test_republish_unchanged_makes_no_commit(small_lfs_hub, make_checkpoint):
    server = small_lfs_hub
    pm = make_checkpoint() / "pretrained_model"
    first = publish_folder(pm, REPO, token=server.token, endpoint=server.url)
    count = server.commit_count(REPO)
    posts = len(commit_posts(server))

    second = publish_folder(pm, REPO, token=server.token, endpoint=server.url)

    assert not second.created_commit
    assert second.commit_id == first.commit_id == server.head(REPO)
    assert server.commit_count(REPO) == count
    # Decided client-side: no commit request at all, whatever the server does with empty commits.
    assert len(commit_posts(server)) == posts

    (pm / "config.json").write_text(json.dumps({"type": "act", "chunk_size": 20}))
    third = publish_folder(pm, REPO, token=server.token, endpoint=server.url)

    assert third.created_commit and third.commit_id != first.commit_id
    assert server.commit_count(REPO) == count + 1
    assert server.read_file(REPO, "config.json") == (pm / "config.json").read_bytes()
    # Only the changed file was sent in that commit.
    assert len(commit_posts(server)) == posts + 1


def test_model_card_in_same_commit_and_path_in_repo(small_lfs_hub, make_checkpoint):
    server = small_lfs_hub
    pm = make_checkpoint() / "pretrained_model"
    card = make_model_card(
        repo_id=REPO,
        policy_type="act",
        dataset_repo_id="alice/pusht",
        base_model=None,
        train_summary={"steps": 5000},
        metrics={"loss": 0.5},
    )
    receipt = publish_folder(
        pm, REPO, path_in_repo="sub/dir", model_card=card, token=server.token, endpoint=server.url
    )
    assert (
        server.commit_count(REPO) == 2
    )  # the repo's initial commit + ONE commit with files and card
    assert receipt.path_in_repo == "sub/dir"
    assert set(receipt.files) == {f"sub/dir/{p}" for p in EXPECTED} | {"README.md"}
    assert server.read_file(REPO, "README.md").decode() == card


def test_final_checkpoint_goes_to_root(small_lfs_hub, make_checkpoint):
    server = small_lfs_hub
    step_dir = make_checkpoint(20000)
    receipt = publish_checkpoint(
        step_dir, REPO, intermediate=False, step=20000, token=server.token, endpoint=server.url
    )
    assert receipt.path_in_repo == "" and receipt.tag is None
    # The final model gets a model card made from its train_config.json.
    assert set(server.list_files(REPO)) == EXPECTED | {".gitattributes", "README.md"}
    card = server.read_file(REPO, "README.md").decode()
    assert "library_name: lerobot" in card and "pipeline_tag: robotics" in card
    assert server.tags(REPO) == {}
    # The pretrained_model/ folder itself is accepted too (same content: no new commit).
    again = publish_checkpoint(
        step_dir / "pretrained_model",
        REPO,
        intermediate=False,
        step=20000,
        token=server.token,
        endpoint=server.url,
    )
    assert not again.created_commit


def test_intermediate_checkpoint_tagged(small_lfs_hub, make_checkpoint, tmp_path):
    server = small_lfs_hub
    step_dir = make_checkpoint(5000)
    receipt = publish_checkpoint(
        step_dir, REPO, intermediate=True, step=5000, token=server.token, endpoint=server.url
    )
    assert receipt.path_in_repo == "checkpoints/005000"
    assert receipt.tag == "step-005000"
    assert server.tags(REPO) == {"step-005000": receipt.commit_id}
    assert {p for p in server.list_files(REPO) if p.startswith("checkpoints/")} == {
        f"checkpoints/005000/{p}" for p in EXPECTED
    }
    # The tag is a usable revision.
    got = local_files(hub_snapshot(server, REPO, tmp_path / "dl", revision="step-005000"))
    assert (
        got["checkpoints/005000/model.safetensors"]
        == (step_dir / "pretrained_model" / "model.safetensors").read_bytes()
    )

    # A later checkpoint, then re-publishing the first one: no commit, the tag stays put.
    later = publish_checkpoint(
        make_checkpoint(10000, seed=1),
        REPO,
        intermediate=True,
        step=10000,
        token=server.token,
        endpoint=server.url,
    )
    again = publish_checkpoint(
        step_dir, REPO, intermediate=True, step=5000, token=server.token, endpoint=server.url
    )
    assert not again.created_commit and again.commit_id == later.commit_id
    assert server.tags(REPO) == {
        "step-005000": receipt.commit_id,
        "step-010000": later.commit_id,
    }

    # Different weights under an existing tag: refused unless move_tag=True.
    (step_dir / "pretrained_model" / "model.safetensors").write_bytes(b"\1" * 5000)
    with pytest.raises(PublishError, match="move_tag=True"):
        publish_checkpoint(
            step_dir, REPO, intermediate=True, step=5000, token=server.token, endpoint=server.url
        )
    moved = publish_checkpoint(
        step_dir,
        REPO,
        intermediate=True,
        step=5000,
        token=server.token,
        endpoint=server.url,
        move_tag=True,
    )
    assert server.tags(REPO)["step-005000"] == moved.commit_id == server.head(REPO)


def test_dcp_only_checkpoint_refused(small_lfs_hub, make_checkpoint):
    step_dir = make_checkpoint(weights=False)
    with pytest.raises(PublishError, match="convert first: lerobot-convert-dcp --checkpoint_dir="):
        publish_checkpoint(
            step_dir,
            REPO,
            intermediate=False,
            step=5000,
            token=small_lfs_hub.token,
            endpoint=small_lfs_hub.url,
        )
    assert small_lfs_hub.requests == []


def test_step_mismatch_and_nothing_to_publish(small_lfs_hub, make_checkpoint, tmp_path):
    with pytest.raises(PublishError, match="not step 6000"):
        publish_checkpoint(make_checkpoint(5000), REPO, intermediate=True, step=6000)
    empty = tmp_path / "empty"
    (empty / "training_state").mkdir(parents=True)
    (empty / "training_state" / "rng_state.safetensors").write_bytes(b"x")
    with pytest.raises(PublishError, match="nothing to publish"):
        publish_folder(empty, REPO, token=small_lfs_hub.token, endpoint=small_lfs_hub.url)
    assert small_lfs_hub.requests == []


def test_cli_writes_the_receipt(small_lfs_hub, make_checkpoint, tmp_path, monkeypatch):
    from lerobot_pipe.scripts.cli import main

    server = small_lfs_hub
    monkeypatch.setenv("HF_TOKEN", server.token)
    step_dir = make_checkpoint()
    path = tmp_path / "published" / "publish_receipt.json"
    argv = [f"--pretrained_dir={step_dir}", f"--repo_id={REPO}", "--step=5000"]
    assert main(["publish", *argv, f"--endpoint={server.url}", f"--receipt={path}"]) == 0
    data = json.loads(path.read_text())
    # The same receipt as the library returns (re-publishing: the same commit, no new one).
    receipt = publish_checkpoint(
        step_dir, REPO, intermediate=False, step=5000, token=server.token, endpoint=server.url
    )
    assert data == {**receipt.to_json(), "created_commit": True}
    assert data["commit_id"] == server.head(REPO) and not receipt.created_commit
    assert set(data) == {
        "repo_id",
        "repo_type",
        "revision",
        "commit_id",
        "commit_url",
        "created_commit",
        "files",
        "path_in_repo",
        "tag",
    }


def test_bare_pretrained_folder_and_last_link(small_lfs_hub, make_checkpoint, tmp_path):
    server = small_lfs_hub
    step_dir = make_checkpoint(7000)
    bare = tmp_path / "converted"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((step_dir / "pretrained_model" / name).read_bytes())
    receipt = publish_checkpoint(
        bare, REPO, intermediate=True, step=7000, token=server.token, endpoint=server.url
    )
    assert receipt.path_in_repo == "checkpoints/007000" and receipt.tag == "step-007000"
    # checkpoints/last -> 008000 resolves to the step folder's name.
    make_checkpoint(8000, seed=2)
    (step_dir.parent / "last").symlink_to("008000")
    again = publish_checkpoint(
        step_dir.parent / "last",
        REPO,
        intermediate=True,
        step=8000,
        token=server.token,
        endpoint=server.url,
    )
    assert again.path_in_repo == "checkpoints/008000" and again.tag == "step-008000"
    with pytest.raises(PublishError, match="not a checkpoint"):
        publish_checkpoint(tmp_path / "out", REPO, intermediate=False, step=1)
