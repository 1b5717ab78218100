"""`dataset.streaming: true` through the pipeline (issue #23 item 6): a dataset on a local Hub
server trains from its repo id on 2 processes with no dataset job and nothing downloaded
before training; the checkpoint pins the commit it streamed, and every file read came from
that commit over HTTP."""

from __future__ import annotations

import json

import pytest
import yaml
from huggingface_hub import HfApi
from snakemake_runs import RUN, Workspace

from lerobot_pipe.constants import CHECKPOINTS_DIR, STREAM_STATE, TRAINING_STATE_DIR
from lerobot_pipe.datasets import write_synthetic_dataset

pytestmark = pytest.mark.slow

REPO = "alice/streamed-reach"


def test_a_streamed_hub_dataset_trains_through_the_pipeline(hub_server, tmp_path):
    root = write_synthetic_dataset(
        tmp_path / "ds", num_episodes=4, episode_length=20, cameras=["top"], image_size=64
    )  # the default config's dataset, on the Hub
    api = HfApi(endpoint=hub_server.url, token=hub_server.token)
    api.create_repo(REPO, repo_type="dataset")
    api.upload_folder(repo_id=REPO, repo_type="dataset", folder_path=root)
    hub_server.clear_requests()

    workspace = Workspace.fresh(tmp_path / "repo")
    config = yaml.safe_load(workspace.path("config/config.yaml").read_text())
    config["dataset"].update(repo_id=REPO, streaming=True, streaming_cache_mb=64)
    config["train"].update(steps=4, save_freq=2, log_freq=1, batch_size=4)
    config["eval"]["env"] = None
    workspace.write_config("config/config.yaml", config)
    env = hub_server.env()
    result = workspace.run_ok("--cores", "2", env=env)

    jobs = result.jobs()
    assert "dataset" not in jobs and jobs["train"] == 1
    assert workspace.complete_checkpoints() == ["000002", "000004"]
    assert workspace.final_checkpoint()["step"] == 4
    sha = hub_server.head(REPO, "dataset")
    state = json.loads(
        workspace.path(
            f"{RUN}/train/{CHECKPOINTS_DIR}/000004/{TRAINING_STATE_DIR}/{STREAM_STATE}"
        ).read_text()
    )
    assert state["revision"] == sha and state["samples_consumed"] == 4 * 4 * 2
    # Read over HTTP at that commit only; no copy of the dataset in the workspace.
    reads = hub_server.find_requests(rf"/datasets/{REPO}/resolve/", method="GET")
    assert reads and all(sha in r.path for r in reads)
    assert any("/data/" in r.path for r in reads)
    assert not list(workspace.path(".").rglob("*.parquet"))
