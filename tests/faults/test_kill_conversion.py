"""Kill lerobot-convert-dcp --delete_dcp=true at each point of its write-verify-delete sequence:
nothing is lost, the checkpoint stays resumable, and the same command then finishes the job."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from tiny import train_fsdp2_dcp

from lerobot_pipe.checkpoint.resume import validate_checkpoint as validate_checkpoint_layout
from lerobot_pipe.convert import load_dcp_state_dict

POINTS = ["convert:before_replace", "convert:after_replace", "convert:during_delete"]
# A training run (the fixture) and a conversion killed per case: the rest tier.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sharded_run(dataset_root, tmp_path_factory):
    return train_fsdp2_dcp(dataset_root, tmp_path_factory.mktemp("run") / "out")


def _convert(step, fault=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if fault:
        env["LEROBOT_PIPE_FAULT_POINT"] = fault
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "lerobot_pipe.scripts.convert_dcp",
            f"--checkpoint_dir={step}",
            "--delete_dcp=true",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("point", POINTS)
def test_kill_during_conversion(sharded_run, tmp_path, point):
    out = tmp_path / "out"
    shutil.copytree(sharded_run, out, symlinks=True)
    step = out / "checkpoints/000002"
    reference = load_dcp_state_dict(step / "pretrained_model/pytorch_model_fsdp_0")

    killed = _convert(step, point)
    assert killed.returncode == -9, killed.stderr[-2000:]
    weights = step / "pretrained_model/model.safetensors"
    shards = step / "pretrained_model/pytorch_model_fsdp_0"
    assert weights.is_file() or (shards / ".metadata").is_file(), "weights lost"
    if point == "convert:before_replace":
        assert not weights.exists() and shards.is_dir()
    validate_checkpoint_layout(step)  # still a usable checkpoint

    again = _convert(step)
    assert again.returncode == 0, again.stderr[-2000:]
    converted = load_file(weights)
    assert all(torch.equal(converted[k], reference[k]) for k in reference)
    assert not shards.exists()
    assert [p.name for p in (step / "pretrained_model").iterdir() if p.name.startswith(".")] == []
    validate_checkpoint_layout(step)
