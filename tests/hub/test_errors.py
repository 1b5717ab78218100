"""Retries, permanent errors and token hygiene of the publisher."""

import json
import logging
import re
import socket

import pytest

from lerobot_pipe.hub import PublishError, make_model_card, publish_checkpoint, publish_folder

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")

REPO = "alice/act-policy"
BAD_TOKEN = "hf_ThisTokenIsNotKnownToTheServer123"


def publish(server, folder, **kwargs):
    kwargs.setdefault("token", server.token)
    kwargs.setdefault("backoff_s", 0.01)
    return publish_folder(folder, REPO, endpoint=server.url, **kwargs)


def statuses(server, pattern, method="POST"):
    return [r.status for r in server.find_requests(pattern, method=method)]


def test_transient_500s_are_retried(small_lfs_hub, make_checkpoint, caplog):
    server = small_lfs_hub
    pm = make_checkpoint() / "pretrained_model"
    server.inject_fault(r"/commit/main$", times=2, status=500)
    caplog.set_level(logging.WARNING, logger="lerobot_pipe")

    receipt = publish(server, pm)

    assert receipt.created_commit
    assert statuses(server, r"/commit/main$") == [500, 500, 200]
    assert server.commit_count(REPO) == 2
    retries = [
        r for r in caplog.records if r.name.startswith("lerobot_pipe") and "retry" in r.message
    ]
    assert len(retries) == 2 and all(r.levelno == logging.WARNING for r in retries)


def test_connection_drop_and_503_on_create_are_retried(small_lfs_hub, make_checkpoint):
    server = small_lfs_hub
    pm = make_checkpoint() / "pretrained_model"
    server.inject_fault(r"^/api/repos/create$", times=1, status=0)  # connection closed
    server.inject_fault(r"^/api/repos/create$", times=1, status=503)
    server.inject_fault(r"/commit/main$", times=1, status=429, headers={"Retry-After": "0"})

    receipt = publish(server, pm)

    assert receipt.created_commit
    assert statuses(server, r"^/api/repos/create$") == [0, 503, 200]
    assert statuses(server, r"/commit/main$") == [429, 200]


def test_lost_commit_answer_is_not_a_second_commit(small_lfs_hub, make_checkpoint):
    server = small_lfs_hub
    pm = make_checkpoint() / "pretrained_model"
    server.create_repo(REPO)
    # The commit is made, then its answer is lost (connection dropped): the retry finds the files
    # already there and sends no second commit.
    server.inject_fault(r"/commit/main$", times=1, status=0, after=True)

    receipt = publish(server, pm)

    assert statuses(server, r"/commit/main$") == [0]
    assert server.commit_count(REPO) == 2
    assert receipt.created_commit and receipt.commit_id == server.head(REPO)


def test_retries_exhausted(small_lfs_hub, make_checkpoint):
    server = small_lfs_hub
    pm = make_checkpoint() / "pretrained_model"
    server.inject_fault(r"/commit/main$", times=10, status=502)
    with pytest.raises(PublishError, match="after 3 attempts"):
        publish(server, pm, max_retries=2)
    assert statuses(server, r"/commit/main$") == [502, 502, 502]
    assert server.commit_count(REPO) == 1


def test_preupload_is_retried_by_huggingface_hub(small_lfs_hub, make_checkpoint):
    """The preupload goes through huggingface_hub's own http_backoff (about 1 s here)."""
    server = small_lfs_hub
    pm = make_checkpoint() / "pretrained_model"
    server.inject_fault(r"/preupload/main$", times=1, status=503)

    receipt = publish(server, pm, max_retries=0)

    assert receipt.created_commit
    assert statuses(server, r"/preupload/main$") == [503, 200]


def test_no_network_says_why_and_for_how_long(small_lfs_hub, make_checkpoint):
    pm = make_checkpoint() / "pretrained_model"
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(PublishError) as info:
        publish_folder(pm, REPO, endpoint=endpoint, token=BAD_TOKEN, max_retries=2, backoff_s=0.01)
    message = str(info.value)
    assert f"cannot reach {endpoint} while trying to create the repo" in message
    assert "connection refused by 127.0.0.1" in message and "HF_ENDPOINT" in message
    assert re.search(r"gave up after 3 attempts over \d+\.\d s", message)
    assert BAD_TOKEN not in message

    with pytest.raises(PublishError, match=r"name resolution failed for no-such-host\.invalid"):
        publish_folder(
            pm, REPO, endpoint="http://no-such-host.invalid", token=BAD_TOKEN, max_retries=0
        )


def test_bad_token_fails_fast(small_lfs_hub, make_checkpoint):
    server = small_lfs_hub
    pm = make_checkpoint() / "pretrained_model"
    with pytest.raises(PublishError) as info:
        publish(server, pm, token=BAD_TOKEN, max_retries=5, backoff_s=10.0)
    message = str(info.value)
    assert "401" in message and "hf auth login" in message and "HF_TOKEN" in message
    assert "token=" not in message  # speaks to a command-line user, not of a keyword argument
    assert BAD_TOKEN not in message
    # No retry: the create request was sent once, nothing else was written.
    assert statuses(server, r"^/api/repos/create$") == [401]
    assert not server.find_requests(r"/(preupload|commit)/")
    assert not server.repo_exists(REPO)


def test_read_only_token_is_403(small_lfs_hub, make_checkpoint):
    server = small_lfs_hub
    pm = make_checkpoint() / "pretrained_model"
    # New repo: the create itself is refused.
    with pytest.raises(PublishError, match=f"no write access to model repo {REPO}"):
        publish(server, pm, token=server.read_token)
    assert statuses(server, r"^/api/repos/create$") == [403]
    # Existing repo: create_repo(exist_ok) passes, the upload is refused, once.
    server.create_repo(REPO)
    server.clear_requests()
    with pytest.raises(PublishError, match="403") as info:
        publish(server, pm, token=server.read_token)
    assert server.read_token not in str(info.value)
    assert statuses(server, r"/preupload/") == [403]


def test_not_found_is_404(small_lfs_hub, make_checkpoint):
    server = small_lfs_hub
    pm = make_checkpoint() / "pretrained_model"
    with pytest.raises(PublishError, match="revision 'no-such-branch' not found"):
        publish(server, pm, revision="no-such-branch")
    assert statuses(server, r"/revision/no-such-branch$", method="GET") == [404]

    server.inject_fault(r"/commit/main$", status=404, headers={"X-Error-Code": "RepoNotFound"})
    with pytest.raises(PublishError, match=f"model repo {REPO} not found"):
        publish(server, pm)
    assert statuses(server, r"/commit/main$") == [404]


def test_token_never_leaks(small_lfs_hub, make_checkpoint, tmp_path, caplog, monkeypatch):
    server = small_lfs_hub
    token = server.token
    caplog.set_level(logging.DEBUG)
    step_dir = make_checkpoint()
    card = make_model_card(
        repo_id=REPO,
        policy_type="act",
        dataset_repo_id="alice/pusht",
        base_model=None,
        train_summary={"steps": 5000, "hub_token": token, "wandb": {"api_token": token}},
        metrics={"loss": 0.1},
    )
    assert token not in card

    # Token from the environment (huggingface_hub's usual source).
    monkeypatch.setenv("HF_TOKEN", token)
    receipt = publish_checkpoint(
        step_dir,
        REPO,
        intermediate=True,
        step=5000,
        endpoint=server.url,
        model_card=card,
        backoff_s=0.01,
    )

    # The receipt file lerobot-pipe publish writes from to_json(): tests/security checks it.
    assert token not in json.dumps(receipt.to_json())
    for path in step_dir.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path
    for path in server.list_files(REPO):
        assert token.encode() not in server.read_file(REPO, path), path
    assert token not in caplog.text
    # The client did authenticate with it.
    assert server.find_requests(r"/commit/main$")[0].headers["Authorization"] == f"Bearer {token}"


def test_file_containing_token_is_refused(small_lfs_hub, make_checkpoint):
    server = small_lfs_hub
    pm = make_checkpoint() / "pretrained_model"
    (pm / "train_config.json").write_text(json.dumps({"hub_token": server.token}))
    with pytest.raises(PublishError, match="contains your Hugging Face token") as info:
        publish(server, pm)
    assert server.token not in str(info.value)
    assert server.requests == []
