"""A small, valid LeRobot v3.0 dataset of a 2-D point reaching its goal, for tests and demos.

The agent starts at a random point in [-1, 1]^2 and a scripted expert commands its next
position: one step of at most ``MAX_SPEED / fps`` towards the goal, plus a little smooth
(AR(1)) noise. The agent tracks the command exactly, so a tiny ACT policy learns it quickly.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_pipe.constants import (
    DATASET_CODEBASE_VERSION,
    DATASET_INFO,
    DATASET_STATS,
    DATASET_TASKS,
)
from lerobot_pipe.datasets.lerobot_dataset import DatasetError

# Bump when the generated content changes, so older copies on disk are not reused.
GENERATOR_VERSION = 1
ROBOT_TYPE = "synthetic_point2d"
TASK = "Move the point to the goal."
MAX_SPEED = 1.0  # units per second
NOISE_STD = 0.01  # stationary std of the smooth action noise
NOISE_CORRELATION = 0.9
CHUNKS_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}

XY = ["x", "y"]
FEATURES: dict[str, dict[str, Any]] = {
    "observation.state": {"dtype": "float32", "shape": [2], "names": XY},
    "observation.environment_state": {"dtype": "float32", "shape": [2], "names": XY},
    "action": {"dtype": "float32", "shape": [2], "names": XY},
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


def _rollout(num_episodes: int, episode_length: int, fps: int, seed: int) -> dict[str, np.ndarray]:
    """Columns of every frame, episode-major; vector features have shape (N, 2)."""
    rng = np.random.default_rng(seed)
    starts = rng.uniform(-1.0, 1.0, size=(num_episodes, 2))
    goals = rng.uniform(-1.0, 1.0, size=(num_episodes, 2))
    innovations = rng.normal(
        0.0, NOISE_STD * np.sqrt(1 - NOISE_CORRELATION**2), size=(episode_length, num_episodes, 2)
    )
    step = MAX_SPEED / fps
    states = np.empty((episode_length, num_episodes, 2))
    actions = np.empty((episode_length, num_episodes, 2))
    position, noise = starts, np.zeros((num_episodes, 2))
    for t in range(episode_length):
        to_goal = goals - position
        distance = np.linalg.norm(to_goal, axis=1, keepdims=True)
        move = to_goal * np.minimum(1.0, step / np.maximum(distance, 1e-12))
        noise = NOISE_CORRELATION * noise + innovations[t]
        states[t] = position
        actions[t] = position + move + noise
        position = actions[t]

    def frames(per_step: np.ndarray) -> np.ndarray:
        return per_step.transpose(1, 0, 2).reshape(-1, 2).astype(np.float32)

    n = num_episodes * episode_length
    frame_index = np.tile(np.arange(episode_length, dtype=np.int64), num_episodes)
    return {
        "observation.state": frames(states),
        "observation.environment_state": np.repeat(goals, episode_length, axis=0).astype(
            np.float32
        ),
        "action": frames(actions),
        "timestamp": (frame_index / fps).astype(np.float32),
        "frame_index": frame_index,
        "episode_index": np.repeat(np.arange(num_episodes, dtype=np.int64), episode_length),
        "index": np.arange(n, dtype=np.int64),
        "task_index": np.zeros(n, dtype=np.int64),
    }


def _stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's per-feature statistics over axis 0 of a (frames, dim) array."""
    values = values.reshape(len(values), -1).astype(np.float64)
    stats = {
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "mean": values.mean(axis=0),
        "std": values.std(axis=0),
        "count": np.array([len(values)]),
    }
    for name, q in QUANTILES.items():
        stats[name] = np.quantile(values, q, axis=0)
    return stats


def _table(columns: dict[str, np.ndarray]) -> pa.Table:
    arrays = {}
    for key, values in columns.items():
        if values.ndim == 2:
            flat = pa.array(values.reshape(-1))
            offsets = pa.array(np.arange(0, values.size + 1, values.shape[1], dtype=np.int32))
            arrays[key] = pa.ListArray.from_arrays(offsets, flat)
        else:
            arrays[key] = pa.array(values)
    return pa.table(arrays)


def _episodes_table(columns: dict[str, np.ndarray], num_episodes: int, length: int) -> pa.Table:
    episode_columns: dict[str, Any] = {
        "episode_index": list(range(num_episodes)),
        "tasks": [[TASK]] * num_episodes,
        "length": [length] * num_episodes,
        "data/chunk_index": [0] * num_episodes,
        "data/file_index": [0] * num_episodes,
        "dataset_from_index": [e * length for e in range(num_episodes)],
        "dataset_to_index": [(e + 1) * length for e in range(num_episodes)],
        "meta/episodes/chunk_index": [0] * num_episodes,
        "meta/episodes/file_index": [0] * num_episodes,
    }
    for key, values in columns.items():
        per_episode = [_stats(values[e * length : (e + 1) * length]) for e in range(num_episodes)]
        for name in per_episode[0]:
            episode_columns[f"stats/{key}/{name}"] = [s[name].tolist() for s in per_episode]
    return pa.table(episode_columns)


def _card(params: dict[str, int]) -> str:
    return f"""---
license: apache-2.0
task_categories:
- robotics
tags:
- LeRobot
- synthetic
configs:
- config_name: default
  data_files: data/*/*.parquet
---

# Synthetic 2-D reaching ({ROBOT_TYPE})

Generated by `lerobot_pipe.datasets.write_synthetic_dataset` with {params}.
A point agent (`observation.state`) moves towards a goal (`observation.environment_state`);
`action` is the scripted expert's commanded next position (speed at most {MAX_SPEED} unit/s,
plus smooth noise). LeRobot dataset format v3.0, no cameras.
"""


def _build(folder: Path, params: dict[str, int]) -> None:
    num_episodes, length, fps = params["num_episodes"], params["episode_length"], params["fps"]
    columns = _rollout(num_episodes, length, fps, params["seed"])
    n = num_episodes * length

    data_file = folder / DATA_PATH.format(chunk_index=0, file_index=0)
    data_file.parent.mkdir(parents=True)
    pq.write_table(_table(columns), data_file)
    episodes_file = folder / EPISODES_PATH
    episodes_file.parent.mkdir(parents=True)
    pq.write_table(_episodes_table(columns, num_episodes, length), episodes_file)
    tasks = pd.DataFrame({"task_index": [0]}, index=pd.Index([TASK], name="task"))
    tasks.to_parquet(folder / DATASET_TASKS)

    stats = {
        key: {k: v.tolist() for k, v in _stats(values).items()} for key, values in columns.items()
    }
    (folder / DATASET_STATS).write_text(json.dumps(stats, indent=4))
    info = {
        "codebase_version": DATASET_CODEBASE_VERSION,
        "robot_type": ROBOT_TYPE,
        "total_episodes": num_episodes,
        "total_frames": n,
        "total_tasks": 1,
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": fps,
        "splits": {"train": f"0:{num_episodes}"},
        "data_path": DATA_PATH,
        "video_path": None,
        "features": FEATURES,
        "synthetic": params,
    }
    (folder / DATASET_INFO).write_text(json.dumps(info, indent=4))
    (folder / "README.md").write_text(_card(params))


def _holds(root: Path, params: dict[str, int]) -> bool:
    """Whether ``root`` already holds the dataset these parameters generate."""
    try:
        info = json.loads((root / DATASET_INFO).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(info, dict) and info.get("synthetic") == params


def write_synthetic_dataset(
    root: str | Path,
    *,
    num_episodes: int = 50,
    episode_length: int = 100,
    fps: int = 10,
    seed: int = 0,
    overwrite: bool = False,
) -> Path:
    """Write the synthetic reaching dataset to ``root`` atomically and return ``root``.

    Returns at once when ``root`` already holds the same dataset (same parameters).
    An existing non-empty ``root`` holding anything else is refused unless ``overwrite``.
    """
    if num_episodes < 1 or episode_length < 1 or fps < 1:
        raise ValueError(
            f"num_episodes ({num_episodes}), episode_length ({episode_length}) and fps ({fps}) "
            "must all be at least 1."
        )
    root = Path(root).expanduser().absolute()
    params = {
        "generator_version": GENERATOR_VERSION,
        "num_episodes": num_episodes,
        "episode_length": episode_length,
        "fps": fps,
        "seed": seed,
    }
    if _holds(root, params):
        return root
    if (root.is_file() or (root.is_dir() and any(root.iterdir()))) and not overwrite:
        raise DatasetError(
            f"{root}: folder exists and is not empty (and does not hold this synthetic dataset "
            f"{params}). Pass overwrite=True to replace it, or choose another folder."
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    # A sibling folder, so the final rename stays on one filesystem; mkdir honours the umask.
    tmp = root.with_name(f".tmp-{root.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        _build(tmp, params)
        _move_into_place(tmp, root, params, overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _move_into_place(tmp: Path, root: Path, params: dict[str, int], overwrite: bool) -> None:
    """Rename ``tmp`` to ``root``; an existing ``root`` is moved aside first when allowed."""
    try:
        os.replace(tmp, root)  # succeeds when root is absent or an empty folder
        return
    except OSError as exc:
        if _holds(root, params):  # another process wrote the same dataset meanwhile
            return
        if not overwrite:
            raise DatasetError(
                f"{root}: could not move the new dataset into place ({exc}); another process "
                "may have written something else there. Pass overwrite=True or choose another "
                "folder."
            ) from exc
    old = root.with_name(f"{tmp.name}-old")
    os.replace(root, old)
    os.replace(tmp, root)
    shutil.rmtree(old, ignore_errors=True)
