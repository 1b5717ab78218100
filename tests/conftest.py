"""Shared fixtures: a small synthetic LeRobot v3.0 dataset and the tiny ACT flags."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from tiny import tiny_act_flags  # noqa: E402,F401  - re-exported for tests


@pytest.fixture(scope="session")
def dataset_root(tmp_path_factory):
    from lerobot_pipe.datasets import write_synthetic_dataset

    return write_synthetic_dataset(
        tmp_path_factory.mktemp("data") / "ds", num_episodes=20, episode_length=50
    )
