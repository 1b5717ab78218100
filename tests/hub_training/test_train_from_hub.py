"""lerobot-train against a Hub (the local Hub-compatible server, real huggingface_hub client):
train on a dataset repo (--dataset.repo_id, no root), push the final policy with
--policy.push_to_hub, fine-tune from it with --policy.path=<repo_id>."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest_hub import hub_server  # noqa: F401 - fixture
from huggingface_hub import HfApi
from tiny import tiny_act_flags


def _train(argv, hub, tmp_path):
    env = {**os.environ, **hub.env(), "HF_HOME": str(tmp_path / "hf_home"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "lerobot_pipe.scripts.train", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )


@pytest.mark.slow
def test_dataset_repo_push_and_policy_path(hub_server, dataset_root, tmp_path):  # noqa: F811
    api = HfApi(endpoint=hub_server.url, token=hub_server.token)
    api.create_repo("alice/point2d", repo_type="dataset")
    api.upload_folder(repo_id="alice/point2d", repo_type="dataset", folder_path=dataset_root)

    flags = [f for f in tiny_act_flags(steps=4, save_freq=4) if not f.startswith("--dataset.root")]
    first = _train(
        [
            *flags,
            "--dataset.repo_id=alice/point2d",
            f"--output_dir={tmp_path / 'a'}",
            "--policy.push_to_hub=true",
            "--policy.repo_id=alice/act-point2d",
        ],
        hub_server,
        tmp_path,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    files = set(hub_server.list_files("alice/act-point2d"))
    assert {"model.safetensors", "config.json", "README.md", "train_config.json"} <= files
    assert not any("training_state" in f or f.endswith(".distcp") for f in files)
    assert (
        hub_server.token
        not in hub_server.read_file("alice/act-point2d", "train_config.json").decode()
    )

    second = _train(
        [
            *flags,
            "--dataset.repo_id=alice/point2d",
            "--policy.path=alice/act-point2d",
            "--policy.type=act",
            f"--output_dir={tmp_path / 'b'}",
        ],
        hub_server,
        tmp_path,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert (tmp_path / "b/checkpoints/000004/pretrained_model/model.safetensors").is_file()


def test_missing_root_and_unreachable_repo_names_both(hub_server, tmp_path):  # noqa: F811
    flags = [f for f in tiny_act_flags(steps=4) if not f.startswith("--dataset.root")]
    proc = _train(
        [
            *flags,
            f"--dataset.root={tmp_path / 'nowhere'}",
            "--dataset.repo_id=alice/missing",
            f"--output_dir={tmp_path / 'o'}",
        ],
        hub_server,
        tmp_path,
    )
    assert proc.returncode == 2
    assert str(tmp_path / "nowhere") in proc.stderr and "alice/missing" in proc.stderr
    assert "Traceback" not in proc.stderr
