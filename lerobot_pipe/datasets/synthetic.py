"""A small, valid LeRobot v3.0 dataset of a 2-D point reaching its goal, for tests and demos.

The agent starts at a random point in [-1, 1]^2 and a scripted expert commands its next
position: one step of at most ``MAX_SPEED / fps`` towards the goal, plus a little smooth
(AR(1)) noise. The agent tracks the command exactly, so a tiny ACT policy learns it quickly.

With ``cameras`` the scene is also rendered: ``top`` sees the whole workspace (goal and agent
as soft blobs, smooth enough that AV1 at LeRobot's crf 30 keeps them), ``wrist`` is centred on
the agent and sees the goal's offset. ``pixels_only`` drops ``observation.environment_state``
(the goal), so that only the images tell where to go.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lerobot_pipe.constants import DATASET_SYNTHETIC_PARAMS
from lerobot_pipe.datasets.metadata import DatasetError
from lerobot_pipe.datasets.writer import DatasetWriter, camera_feature

# Bump when the generated content changes, so older copies on disk are not reused.
# 3: each episode drawn from its own stream (episode_rng), as the environment's reset draws it.
GENERATOR_VERSION = 3
# The last word of every dataset episode's seed sequence ([seed, episode, DATASET_STREAM]).
DATASET_STREAM = 0xDA7A5E7
ROBOT_TYPE = "synthetic_point2d"
TASK = "Move the point to the goal."
# With num_tasks > 1, episode e is given TASKS[e % num_tasks] (TASKS[0] is TASK).
TASKS = (
    TASK,
    "Reach the green dot.",
    "Bring the red point onto the target.",
    "Go to the goal and stop there.",
)
MAX_SPEED = 1.0  # units per second
NOISE_STD = 0.01  # stationary std of the smooth action noise
NOISE_CORRELATION = 0.9
CAMERA_KEY = "observation.images.{}"
CAMERA_DTYPES = ("video", "image")
# Half-width of the workspace each camera sees (world units), around its centre.
VIEWS = {"top": 1.25, "wrist": 2.25}
BLOB_SIGMA = 1 / 16  # of the image size
BACKGROUND = np.array([0.2, 0.2, 0.2])  # a grey that survives RGB -> YUV -> RGB exactly
GOAL_COLOUR = np.array([0.2, 0.9, 0.3])
AGENT_COLOUR = np.array([0.95, 0.3, 0.2])

XY = ["x", "y"]
STATE_FEATURES: dict[str, dict[str, Any]] = {
    "observation.state": {"dtype": "float32", "shape": [2], "names": XY},
    "observation.environment_state": {"dtype": "float32", "shape": [2], "names": XY},
    "action": {"dtype": "float32", "shape": [2], "names": XY},
}


def expert_move(position: np.ndarray, goal: np.ndarray, fps: int) -> np.ndarray:
    """The scripted expert's move ``(n, 2)`` from ``position`` towards ``goal`` (both ``(n, 2)``):
    straight at it, at most ``MAX_SPEED / fps`` long. Its command is ``position + move`` (plus
    noise in the dataset); the agent then is where it was commanded to be. The synthetic
    environment (lerobot_pipe.envs.synthetic) steps the same dynamics."""
    to_goal = goal - position
    distance = np.linalg.norm(to_goal, axis=1, keepdims=True)
    return to_goal * np.minimum(1.0, (MAX_SPEED / fps) / np.maximum(distance, 1e-12))


def episode_rng(seed: int, episode: int) -> np.random.Generator:
    """The random stream of episode ``episode`` of the dataset of ``seed``: its start, goal and
    action noise, independent of how many episodes the dataset has. The synthetic environment's
    ``reset(options={"dataset_episode": [seed, episode]})`` draws the same start and goal; its
    ``reset(seed=s)`` draws from another stream (``[s, EVAL_STREAM]``)."""
    return np.random.default_rng([seed, episode, DATASET_STREAM])


def draw_start_goal(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """An episode's start and goal, uniform in [-1, 1]^2 (the dataset's and the environment's)."""
    start = rng.uniform(-1.0, 1.0, size=2)
    goal = rng.uniform(-1.0, 1.0, size=2)
    return start, goal


def _rollout(
    num_episodes: int, episode_length: int, fps: int, seed: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Columns of every frame, episode-major, vector features of shape (N, 2); and the goals.

    Episode e is the scripted expert's rollout from ``episode_rng(seed, e)``'s start and goal,
    with that stream's noise: the synthetic environment's dynamics, stepped for every episode
    at once."""
    starts, goals, innovations = [], [], []
    for e in range(num_episodes):
        rng = episode_rng(seed, e)
        start, goal = draw_start_goal(rng)
        starts.append(start)
        goals.append(goal)
        innovations.append(
            rng.normal(0.0, NOISE_STD * np.sqrt(1 - NOISE_CORRELATION**2), size=(episode_length, 2))
        )
    starts, goals = np.stack(starts), np.stack(goals)
    innovations = np.stack(innovations, axis=1)  # (episode_length, num_episodes, 2)
    states = np.empty((episode_length, num_episodes, 2))
    actions = np.empty((episode_length, num_episodes, 2))
    position, noise = starts, np.zeros((num_episodes, 2))
    for t in range(episode_length):
        move = expert_move(position, goals, fps)
        noise = NOISE_CORRELATION * noise + innovations[t]
        states[t] = position
        actions[t] = position + move + noise
        position = actions[t]

    def frames(per_step: np.ndarray) -> np.ndarray:
        return per_step.transpose(1, 0, 2).reshape(-1, 2).astype(np.float32)

    columns = {
        "observation.state": frames(states),
        "observation.environment_state": np.repeat(goals, episode_length, axis=0).astype(
            np.float32
        ),
        "action": frames(actions),
    }
    return columns, goals


def _blob(centres: np.ndarray, size: int) -> np.ndarray:
    """Soft discs ``(n, size, size)`` in [0, 1] at pixel ``centres`` ``(n, 2)`` (x, y)."""
    pixels = np.arange(size) + 0.5
    sigma = BLOB_SIGMA * size
    gx = np.exp(-0.5 * ((pixels[None, :] - centres[:, :1]) / sigma) ** 2)
    gy = np.exp(-0.5 * ((pixels[None, :] - centres[:, 1:]) / sigma) ** 2)
    return gy[:, :, None] * gx[:, None, :]


def render(view: str, agent: np.ndarray, goal: np.ndarray, size: int) -> np.ndarray:
    """uint8 RGB frames ``(n, size, size, 3)`` of ``view`` for agent/goal positions ``(n, 2)``.

    World +y points up in the image; ``wrist`` is centred on the agent."""
    half = VIEWS[view]
    centre = agent if view == "wrist" else np.zeros_like(agent)

    def to_pixels(xy: np.ndarray) -> np.ndarray:
        unit = (xy - centre) / (2 * half) + 0.5
        return np.stack([unit[:, 0], 1 - unit[:, 1]], axis=1) * size

    image = np.broadcast_to(BACKGROUND, (len(agent), size, size, 3)).copy()
    for colour, where in ((GOAL_COLOUR, goal), (AGENT_COLOUR, agent)):
        alpha = _blob(to_pixels(where), size)[..., None]
        image = image * (1 - alpha) + colour * alpha
    return np.round(image * 255).astype(np.uint8)


def _card(params: dict[str, Any]) -> str:
    cameras = params["cameras"]
    seen = (
        f"Cameras {', '.join(CAMERA_KEY.format(c) for c in cameras)} "
        f"({params['image_size']}x{params['image_size']}, stored as {params['camera_dtype']})."
        if cameras
        else "No cameras."
    )
    goal = (
        "The goal is only visible in the images."
        if params["pixels_only"]
        else "The goal is `observation.environment_state`."
    )
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
A point agent (`observation.state`) moves towards a goal. {goal}
`action` is the scripted expert's commanded next position (speed at most {MAX_SPEED} unit/s,
plus smooth noise). {seen} LeRobot dataset format v3.0.
"""


def _build(folder: Path, params: dict[str, Any]) -> None:
    num_episodes, length, fps = params["num_episodes"], params["episode_length"], params["fps"]
    size, cameras = params["image_size"], params["cameras"]
    columns, goals = _rollout(num_episodes, length, fps, params["seed"])
    if params["pixels_only"]:
        del columns["observation.environment_state"]
    features = {key: STATE_FEATURES[key] for key in columns} | {
        CAMERA_KEY.format(view): camera_feature(params["camera_dtype"], size, size)
        for view in cameras
    }
    writer = DatasetWriter(folder, fps, features, robot_type=ROBOT_TYPE)
    for e in range(num_episodes):
        rows = slice(e * length, (e + 1) * length)
        agent = columns["observation.state"][rows]
        goal = np.broadcast_to(goals[e], agent.shape)
        writer.add_episode(
            {key: values[rows] for key, values in columns.items()},
            TASKS[e % params.get("num_tasks", 1)],
            {CAMERA_KEY.format(view): render(view, agent, goal, size) for view in cameras},
        )
    writer.finish()
    (folder / DATASET_SYNTHETIC_PARAMS).write_text(json.dumps(params, indent=4))
    (folder / "README.md").write_text(_card(params))


def _holds(root: Path, params: dict[str, Any]) -> bool:
    """Whether ``root`` already holds the dataset these parameters generate."""
    try:
        return json.loads((root / DATASET_SYNTHETIC_PARAMS).read_text()) == params
    except (OSError, json.JSONDecodeError):
        return False


def write_synthetic_dataset(
    root: str | Path,
    *,
    num_episodes: int = 50,
    episode_length: int = 100,
    fps: int = 10,
    seed: int = 0,
    cameras: Sequence[str] = (),
    image_size: int = 64,
    camera_dtype: str = "video",
    pixels_only: bool = False,
    num_tasks: int = 1,
    overwrite: bool = False,
) -> Path:
    """Write the synthetic reaching dataset to ``root`` atomically and return ``root``.

    ``cameras`` names the rendered views (``top``, ``wrist``; none by default: numeric
    features only), ``image_size`` their square side in pixels, ``camera_dtype`` how they are
    stored (``video``: AV1 mp4 as LeRobot encodes it; ``image``: PNG in the parquet), and
    ``pixels_only`` leaves out ``observation.environment_state`` (the goal), and ``num_tasks``
    (1 to 4) gives the episodes that many task strings in turn (meta/tasks.parquet).

    Returns at once when ``root`` already holds the same dataset (same parameters).
    An existing non-empty ``root`` holding anything else is refused unless ``overwrite``.
    """
    if num_episodes < 1 or episode_length < 1 or fps < 1:
        raise ValueError(
            f"num_episodes ({num_episodes}), episode_length ({episode_length}) and fps ({fps}) "
            "must all be at least 1."
        )
    unknown = sorted(set(cameras) - set(VIEWS))
    if unknown or len(set(cameras)) != len(cameras):
        raise ValueError(f"cameras {list(cameras)}: each must be one of {list(VIEWS)}, once")
    if camera_dtype not in CAMERA_DTYPES:
        raise ValueError(f"camera_dtype {camera_dtype!r} must be one of {list(CAMERA_DTYPES)}")
    if pixels_only and not cameras:
        raise ValueError("pixels_only needs at least one camera (cameras=['top'])")
    if cameras and not 16 <= image_size <= 1024:
        raise ValueError(f"image_size {image_size} must lie in [16, 1024]")
    if not 1 <= num_tasks <= len(TASKS):
        raise ValueError(f"num_tasks {num_tasks} must lie in [1, {len(TASKS)}]")
    root = Path(root).expanduser().absolute()
    params = {
        "generator_version": GENERATOR_VERSION,
        "num_episodes": num_episodes,
        "episode_length": episode_length,
        "fps": fps,
        "seed": seed,
        "cameras": list(cameras),
        "image_size": image_size if cameras else None,
        "camera_dtype": camera_dtype if cameras else None,
        "pixels_only": pixels_only,
    }
    if num_tasks != 1:  # absent at 1: the default datasets' files stay as they were
        params["num_tasks"] = num_tasks
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


def _move_into_place(tmp: Path, root: Path, params: dict[str, Any], overwrite: bool) -> None:
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
