"""End to end through the real launchers: torchrun and accelerate launch (2 CPU processes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from launch import free_port, launcher_env
from tiny import tiny_act_flags

pytestmark = pytest.mark.slow
BIN = os.path.dirname(shutil.which("lerobot-train") or "")


def _flags(dataset_root, out):
    return tiny_act_flags(
        **{
            "dataset.root": dataset_root,
            "output_dir": out,
            "steps": 4,
            "save_freq": 2,
            "batch_size": 4,
            "log_freq": 2,
        }
    )


# Our trainer as lerobot-train (our own venv) and as `lerobot-pipe train` (everywhere, LeRobot's
# venv included: `torchrun $(which lerobot-pipe) train ...`).
@pytest.mark.parametrize("command", [["lerobot-train"], ["lerobot-pipe", "train"]], ids=" ".join)
def test_torchrun_two_processes(dataset_root, tmp_path, command):
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            "torchrun",
            "--nproc-per-node=2",
            f"--master-port={free_port()}",
            shutil.which(command[0]),
            *command[1:],
            *_flags(dataset_root, out),
        ],
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Effective batch size: 4 x 2 dp workers x 1 grad accum = 8" in proc.stderr
    step = json.loads((out / "checkpoints/last/training_state/training_step.json").read_text())
    assert step["step"] == 4 and step["dp_world_size"] == 2 and step["parallelism"]["mode"] == "ddp"


def _accelerate(dataset_root, out, **env):
    return subprocess.run(
        [
            "accelerate",
            "launch",
            "--multi_gpu",
            "--num_processes=2",
            f"--main_process_port={free_port()}",
            shutil.which("lerobot-train"),
            *_flags(dataset_root, out),
        ],
        env=launcher_env(**env),
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_accelerate_launch_plain_refused_and_acknowledged(dataset_root, tmp_path):
    plain = _accelerate(dataset_root, tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "2 dp workers" in plain.stderr
    assert (tmp_path / "plain/checkpoints/000004/training_state/training_step.json").is_file()

    refused = _accelerate(dataset_root, tmp_path / "refused", ACCELERATE_USE_FSDP="true")
    assert refused.returncode != 0
    assert (
        "ACCELERATE_USE_FSDP=true" in refused.stderr and "--parallelism.dp_shard" in refused.stderr
    )
    assert not (tmp_path / "refused").exists()

    ok = _accelerate(
        dataset_root, tmp_path / "ack", ACCELERATE_USE_FSDP="true", LEROBOT_ALLOW_ACCELERATE_ENV="1"
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "acknowledged" in ok.stderr
