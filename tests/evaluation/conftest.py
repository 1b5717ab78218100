from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def untrained_policy(tmp_path_factory):
    """A tiny ACT on the synthetic task's state features, trained one step (near untrained)."""
    from tiny import run_train, tiny_act_flags

    from lerobot_pipe.datasets import write_synthetic_dataset

    root = tmp_path_factory.mktemp("untrained")
    dataset = write_synthetic_dataset(root / "ds", num_episodes=4, episode_length=20)
    out = root / "train"
    flags = {"dataset.root": dataset, "batch_size": 4, "steps": 1, "save_freq": 1}
    run_train([*tiny_act_flags(**flags), f"--output_dir={out}"])
    return out / "checkpoints" / "000001" / "pretrained_model"
