"""The synthetic reaching task (lerobot_pipe.datasets.synthetic) as a gymnasium environment,
``--env.type=synthetic`` (gym id ``lerobot_pipe/Reach-v0``).

The same dynamics as the dataset: the agent moves to the position it is commanded (the action,
absolute, as the dataset's), its observations are the dataset's (``agent_pos`` ->
observation.state, ``environment_state`` = the goal -> observation.environment_state, unless
``pixels_only``) and its cameras are rendered by the dataset's own ``render`` (``pixels/<view>``
-> observation.images.<view>). Each dataset episode is the scripted expert's rollout from the
start and goal its own stream draws (``datasets.synthetic.episode_rng``): ``reset(options=
{"dataset_episode": [seed, episode]})`` starts that episode here, and stepping its actions
reproduces its states and frames bit for bit (``options={"start": ..., "goal": ...}`` sets any).

Reward: minus the distance to the goal. Success, which ends the episode (terminated): the agent
within ``success_distance`` (default 0.1: ten times the dataset's action noise, 0.01 a step and
an axis, and one step of the expert at 10 fps) of the goal. Episodes are truncated at
``max_episode_steps`` (the config's ``episode_length``, 50: the expert needs at most 29 steps at
10 fps across the [-1, 1]^2 workspace).

Seeds: ``reset(seed=s)`` draws start and goal from ``numpy.random.default_rng([s, EVAL_STREAM])``,
a stream no dataset uses (episode e of a dataset of seed s draws from ``[s, e, DATASET_STREAM]``),
so evaluation episodes are never training episodes.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from lerobot_pipe.datasets.synthetic import (
    TASK,
    VIEWS,
    draw_start_goal,
    episode_rng,
    expert_move,
    render,
)

GYM_ID = "lerobot_pipe/Reach-v0"
# The second word of every evaluation episode's seed sequence ([seed, EVAL_STREAM]).
EVAL_STREAM = 0x5EED_E7A1


class SyntheticReachEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        fps: int = 10,
        cameras: list[str] | tuple[str, ...] = (),
        image_size: int = 64,
        pixels_only: bool = False,
        success_distance: float = 0.1,
        visualization_size: int = 256,
        render_mode: str | None = "rgb_array",
    ) -> None:
        unknown = sorted(set(cameras) - set(VIEWS))
        if unknown:
            raise ValueError(f"cameras {list(cameras)}: each must be one of {list(VIEWS)}")
        if pixels_only and not cameras:
            raise ValueError("pixels_only needs at least one camera (cameras=['top'])")
        self.fps = fps
        self.cameras = list(cameras)
        self.image_size = image_size
        self.pixels_only = pixels_only
        self.success_distance = success_distance
        self.visualization_size = visualization_size
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "render_fps": fps}
        self.task = TASK
        self.task_description = TASK
        obs: dict[str, spaces.Space] = {
            "agent_pos": spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32),
        }
        if not pixels_only:
            obs["environment_state"] = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        if self.cameras:
            obs["pixels"] = spaces.Dict(
                {
                    view: spaces.Box(0, 255, shape=(image_size, image_size, 3), dtype=np.uint8)
                    for view in self.cameras
                }
            )
        self.observation_space = spaces.Dict(obs)
        self.action_space = spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self._rng: np.random.Generator | None = None
        self._position = np.zeros(2)
        self._goal = np.zeros(2)

    def _observation(self) -> dict[str, Any]:
        agent = self._position.astype(np.float32)
        out: dict[str, Any] = {"agent_pos": agent}
        if not self.pixels_only:
            out["environment_state"] = self._goal.astype(np.float32)
        if self.cameras:
            # As the dataset renders: the stored (float32) state, the float64 goal.
            out["pixels"] = {
                view: render(view, agent[None], self._goal[None], self.image_size)[0]
                for view in self.cameras
            }
        return out

    def _distance(self) -> float:
        return float(np.linalg.norm(self._goal - self._position))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "dataset_episode" in options:  # [seed, episode] of a synthetic dataset
            start, goal = draw_start_goal(episode_rng(*options["dataset_episode"]))
        else:
            if seed is not None:
                self._rng = np.random.default_rng([seed, EVAL_STREAM])
            elif self._rng is None:
                self._rng = np.random.default_rng()
            start, goal = draw_start_goal(self._rng)
        if "start" in options:
            start = np.asarray(options["start"], dtype=np.float64).reshape(2)
        if "goal" in options:
            goal = np.asarray(options["goal"], dtype=np.float64).reshape(2)
        self._position, self._goal = start, goal
        return self._observation(), {"is_success": False, "distance": self._distance()}

    def step(self, action):
        self._position = np.asarray(action, dtype=np.float64).reshape(2).copy()
        distance = self._distance()
        success = distance < self.success_distance
        info = {"is_success": success, "distance": distance}
        return self._observation(), -distance, success, False, info

    def render(self):
        size = self.visualization_size
        return render("top", self._position[None], self._goal[None], size)[0]


def register() -> None:
    if GYM_ID not in gym.registry:
        gym.register(id=GYM_ID, entry_point=f"{__name__}:SyntheticReachEnv")


register()


class ScriptedExpert:
    """The dataset's scripted expert, noise-free, as a policy over the environment's state
    features (observation.state, observation.environment_state): its command is the position
    plus one expert move towards the goal. Needs the goal (not ``pixels_only``)."""

    training = False

    def __init__(self, fps: int = 10) -> None:
        self.fps = fps

    def reset(self) -> None:
        pass

    def eval(self):
        return self

    def train(self, mode: bool = True):
        return self

    def select_action(self, batch: dict):
        import torch

        from lerobot_pipe.configs.types import OBS_ENV_STATE, OBS_STATE

        position = batch[OBS_STATE].double().cpu().numpy()
        goal = batch[OBS_ENV_STATE].double().cpu().numpy()
        return torch.from_numpy(position + expert_move(position, goal, self.fps)).float()
