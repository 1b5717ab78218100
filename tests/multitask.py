"""A small dataset of several tasks (the synthetic generator writes one), for the held-out split."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lerobot_pipe.datasets.synthetic import STATE_FEATURES
from lerobot_pipe.datasets.writer import DatasetWriter

# Episode e's task and length: uneven, so that no share of the held-out frames divides evenly.
TASKS = ["a", "b", "a", "a", "b", "c", "a", "b", "a"]
LENGTHS = [12, 13, 14, 15, 16, 18, 18, 19, 20]


def write_multitask(root: Path) -> Path:
    """The synthetic task's features (straight reaches to a goal), episodes carrying TASKS."""
    writer = DatasetWriter(root, 10, dict(STATE_FEATURES))
    rng = np.random.default_rng(0)
    for task, n in zip(TASKS, LENGTHS, strict=True):
        t = np.linspace(0, 1, n, dtype=np.float32)[:, None]
        start = rng.uniform(-1, 1, size=(1, 2)).astype(np.float32)
        goal = rng.uniform(-1, 1, size=(1, 2)).astype(np.float32)
        state = start + t * (goal - start)
        columns = {
            "observation.state": state,
            "observation.environment_state": np.repeat(goal, n, axis=0),
            "action": state + (goal - start) / n,
        }
        writer.add_episode(columns, task, {})
    writer.finish()
    return root
