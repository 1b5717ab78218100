"""--env.type=aloha, a smoke test: gym-aloha (MuJoCo, rendered headless through EGL on the CPU)
takes ~0.5 s a step here, so a tiny ACT on ALOHA's features (observation.images.top 480x640,
observation.state and action (14,)) rolls out one episode of 3 steps with lerobot-eval."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tiny import run_train, tiny_act_flags

from lerobot_pipe.datasets.writer import DatasetWriter, camera_feature

pytest.importorskip("gym_aloha", reason="the [aloha] extra (gym-aloha) is not installed")

STEPS = 3


def _aloha_dataset(root):
    joints = {"dtype": "float32", "shape": [14], "names": None}
    features = {
        "observation.images.top": camera_feature("image", 480, 640),
        "observation.state": joints,
        "action": joints,
    }
    rng = np.random.default_rng(0)
    writer = DatasetWriter(root, 50, features, robot_type="aloha")
    for _ in range(2):
        frames = rng.integers(0, 256, size=(4, 480, 640, 3), dtype=np.uint8)
        columns = {
            k: rng.normal(size=(4, 14)).astype(np.float32) for k in ("observation.state", "action")
        }
        writer.add_episode(
            columns, "Insert the peg into the socket.", {"observation.images.top": frames}
        )
    writer.finish()
    return root


@pytest.mark.slow  # a training run and a MuJoCo rollout (~10 s)
def test_aloha_episode_rolls_out(tmp_path):
    dataset = _aloha_dataset(tmp_path / "ds")
    flags = {
        "dataset.root": dataset,
        "batch_size": 2,
        "steps": 1,
        "save_freq": 1,
        "policy.pretrained_backbone_weights": "null",
    }
    run_train([*tiny_act_flags(**flags), f"--output_dir={tmp_path / 'train'}"])
    policy = tmp_path / "train" / "checkpoints" / "000001" / "pretrained_model"
    out = tmp_path / "eval"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lerobot_pipe.scripts.eval",
            f"--policy.path={policy}",
            "--env.type=aloha",
            f"--env.episode_length={STEPS}",
            "--eval.n_episodes=1",
            "--policy.device=cpu",
            f"--output_dir={out}",
        ],
        env={**os.environ, "MUJOCO_GL": "egl", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((out / "eval_info.json").read_text())
    metrics = info["per_task"][0]["metrics"]
    assert info["per_task"][0]["task_group"] == "aloha"
    assert metrics["seeds"] == [1000] and metrics["successes"] == [False]
    assert 0 <= metrics["max_rewards"][0] <= 4
    assert (out / "videos" / "aloha_0" / "eval_episode_0.mp4").stat().st_size > 0
