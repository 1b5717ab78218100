"""lerobot-train --dataset.streaming=true from the local test Hub: 2 ranks, resumed on 2 ranks
sample-exactly (the same losses as an uninterrupted run) and on 1 rank (the stream's unread
samples carried over), the commit sha and position in every checkpoint."""

from __future__ import annotations

import json
import queue
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from launch import run_distributed
from tiny import DETERMINISTIC, losses, run_train, tiny_act_flags

from lerobot_pipe.constants import STREAM_STATE

REPO = "alice/point2d-stream"


def _flags(tmp: Path) -> list[str]:
    return tiny_act_flags(
        **DETERMINISTIC,
        **{
            "dataset.repo_id": REPO,
            "dataset.streaming": "true",
            "dataset.root": tmp / "cache",
            "dataset.streaming_shuffle_buffer": 64,
            "batch_size": 4,
            "save_freq": 4,
            "num_workers": 2,
        },
    )


@pytest.fixture(scope="module")
def streamed(hub_server_module, dataset_root, tmp_path_factory):
    hub = hub_server_module
    api = HfApi(endpoint=hub.url, token=hub.token)
    api.create_repo(REPO, repo_type="dataset")
    api.upload_folder(repo_id=REPO, repo_type="dataset", folder_path=dataset_root)
    tmp = tmp_path_factory.mktemp("streamed")
    flags = _flags(tmp)
    run_distributed(run_train, 2, [*flags, f"--output_dir={tmp / 'full'}", "--steps=8"])
    run_distributed(run_train, 2, [*flags, f"--output_dir={tmp / 'part'}", "--steps=4"])
    hub.clear_requests()
    run_distributed(
        run_train,
        2,
        ["--resume=true", f"--config_path={tmp / 'part/checkpoints/last'}", "--steps=8"],
    )
    run_train(
        [
            "--resume=true",
            f"--config_path={tmp / 'part/checkpoints/000004/pretrained_model'}",
            f"--output_dir={tmp / 'one'}",
            "--batch_size=8",
            "--steps=8",
        ]
    )
    return tmp, hub


def _stream_state(step_dir: Path) -> dict:
    return json.loads((step_dir / "training_state" / STREAM_STATE).read_text())


def test_resume_on_two_ranks_is_sample_exact(streamed):
    tmp, _ = streamed
    ref, resumed = losses(tmp / "full"), losses(tmp / "part")
    assert set(range(1, 9)) <= set(ref)
    for step in range(5, 9):
        assert abs(ref[step] - resumed[step]) < 1e-5, (step, ref[step], resumed[step])
    assert _stream_state(tmp / "full/checkpoints/000008") == _stream_state(
        tmp / "part/checkpoints/000008"
    )


def test_the_checkpoint_holds_the_commit_and_the_position(streamed):
    tmp, hub = streamed
    state = _stream_state(tmp / "part/checkpoints/000004")
    assert state["revision"] == hub.head(REPO, "dataset")
    assert state["samples_consumed"] == 4 * 4 * 2 and state["dp_world_size"] == 2
    config = json.loads(
        (tmp / "part/checkpoints/000004/pretrained_model/train_config.json").read_text()
    )
    assert config["dataset"]["streaming"] is True
    assert "streaming_cache_mb" not in config["dataset"]  # omitted at its default
    # The resumed run read nothing from any other commit.
    files = hub.find_requests(r"/resolve/", method="GET")
    assert files and all(state["revision"] in r.path for r in files)


def test_resume_on_one_rank_carries_the_unread_samples(streamed):
    tmp, _ = streamed
    state = _stream_state(tmp / "one/checkpoints/000008")
    assert state["dp_world_size"] == 1 and state["base_sample"] == 32
    assert len(state["carry"]) == 1 and state["carry"][0]
    assert len(losses(tmp / "one")) >= 4


def test_a_rank_killed_while_loading_resumes_sample_exactly(streamed, tmp_path):
    tmp, _ = streamed
    argv = [*_flags(tmp), f"--output_dir={tmp_path / 'out'}", "--steps=8"]
    with pytest.raises((RuntimeError, queue.Empty)):
        run_distributed(
            run_train, 2, argv, env={"LEROBOT_PIPE_FAULT_POINT": "data:load_batch@6:rank1"}
        )
    assert not (tmp_path / "out/checkpoints/000008").exists()
    run_distributed(run_train, 2, ["--resume=true", *argv])
    ref, resumed = losses(tmp / "full"), losses(tmp_path / "out")
    for step in range(5, 9):
        assert abs(ref[step] - resumed[step]) < 1e-5, (step, ref[step], resumed[step])
