"""Two "nodes" on one machine: two launcher invocations meeting at a c10d rendezvous."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from launch import free_port, launcher_env
from tiny import tiny_act_flags

pytestmark = pytest.mark.slow


def _run_nodes(commands, out):
    procs = [
        subprocess.Popen(
            cmd, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for cmd in commands
    ]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-3000:]
    step = json.loads((out / "checkpoints/last/training_state/training_step.json").read_text())
    assert step["world_size"] == 2 and step["parallelism"]["mode"] == "fsdp2"
    return logs


def _flags(dataset_root, out):
    return [
        *tiny_act_flags(
            **{
                "dataset.root": dataset_root,
                "output_dir": out,
                "steps": 4,
                "save_freq": 2,
                "batch_size": 4,
            }
        ),
        "--parallelism.dp_shard=-1",
        "--checkpoint_format=dcp",
    ]


def test_torchrun_two_nodes_c10d_fsdp2(dataset_root, tmp_path):
    port = free_port()
    out = tmp_path / "out"
    commands = [
        [
            "torchrun",
            "--nnodes=2",
            "--nproc-per-node=1",
            f"--node-rank={rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=lerobot-pipe-test",
            shutil.which("lerobot-train"),
            *_flags(dataset_root, out),
        ]
        for rank in (0, 1)
    ]
    logs = _run_nodes(commands, out)
    assert "dp_shard=2" in logs[0]


def test_accelerate_launch_two_machines(dataset_root, tmp_path):
    port = free_port()
    out = tmp_path / "out"
    commands = [
        [
            "accelerate",
            "launch",
            "--multi_gpu",
            "--num_machines=2",
            f"--machine_rank={rank}",
            "--num_processes=2",
            "--main_process_ip=127.0.0.1",
            f"--main_process_port={port}",
            shutil.which("lerobot-train"),
            *_flags(dataset_root, out),
        ]
        for rank in (0, 1)
    ]
    _run_nodes(commands, out)
