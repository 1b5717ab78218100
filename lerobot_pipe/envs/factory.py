"""Make an environment from its config, map its observations to the policy's keys, and check a
policy's features against what the environment really delivers.

``make_env`` builds the vector environment LeRobot 0.6.1 builds: ``gym.make(<gym id>,
disable_env_checker=..., **gym_kwargs)`` per sub-env, in a SyncVectorEnv (an AsyncVectorEnv,
forkserver, when ``use_async_envs`` and more than one env), autoreset SAME_STEP. A missing
simulator package fails here, before any rollout, naming what to install.

``preprocess_observation`` is LeRobot's key mapping: ``pixels`` -> observation.image (a dict of
cameras -> observation.images.<camera>), HWC uint8 -> CHW float32 in [0, 1];
``environment_state`` -> observation.environment_state; ``agent_pos`` -> observation.state; any
other array ``<key>`` -> observation.<key>.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import numpy as np
import torch

from lerobot_pipe.configs.envs import EnvConfig
from lerobot_pipe.configs.types import ACTION, OBS_ENV_STATE, OBS_STATE
from lerobot_pipe.envs.configs import OBS_IMAGE, OBS_IMAGES

TASK_ATTRIBUTES = ("task_description", "task")


class EnvError(ValueError):
    """An environment that cannot be made, or does not fit the policy (a one-line message)."""


def import_gymnasium():
    try:
        import gymnasium
    except ModuleNotFoundError:
        raise EnvError(
            "simulation needs gymnasium and a simulator: pip install 'lerobot_pipe[sim]'"
        ) from None
    return gymnasium


def _import_env_package(cfg: EnvConfig) -> None:
    """Import the package that registers ``cfg``'s gym ids, or say what to install."""
    gym = import_gymnasium()
    module = "lerobot_pipe.envs.synthetic" if cfg.type == "synthetic" else cfg.package_name
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise EnvError(
            f"--env.type={cfg.type} needs the {cfg.package_name} package ({e.name} is not "
            f"installed): {cfg.install_hint}"
        ) from None
    if cfg.gym_id not in gym.registry:
        known = sorted(k for k in gym.registry if k.startswith(f"{cfg.package_name}/"))
        raise EnvError(
            f"--env.task={cfg.task!r}: {cfg.gym_id} is not registered by {cfg.package_name}; "
            f"its tasks: {[k.split('/', 1)[1] for k in known]}"
        )


def _env_factory(cfg: EnvConfig):
    gym_id, kwargs, checker = cfg.gym_id, dict(cfg.gym_kwargs), cfg.disable_env_checker
    module = "lerobot_pipe.envs.synthetic" if cfg.type == "synthetic" else cfg.package_name

    def make_one():
        import gymnasium as gym

        importlib.import_module(module)  # registers the id (again) in a worker process
        return gym.make(gym_id, disable_env_checker=checker, **kwargs)

    return make_one


def make_env(cfg: EnvConfig, n_envs: int = 1, use_async_envs: bool = False):
    """The vector environment of ``n_envs`` sub-environments (LeRobot's construction); EnvError
    (one line) when its simulator is missing or fails to start."""
    if n_envs < 1:
        raise EnvError(f"--eval.batch_size: at least one environment is needed, got {n_envs}")
    _import_env_package(cfg)
    gym = import_gymnasium()
    fns = [_env_factory(cfg) for _ in range(n_envs)]
    mode = gym.vector.AutoresetMode.SAME_STEP
    try:
        if use_async_envs and n_envs > 1:
            env = gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode, context="forkserver")
            # A failed env.call (an attribute a sub-env lacks) shuts an async worker down: the
            # task attribute is looked up once, on an env of this process.
            env.task_attribute = _task_attribute(fns[0])
            return env
        return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    except Exception as e:  # a simulator that fails to start (e.g. no EGL for MuJoCo)
        raise EnvError(
            f"--env.type={cfg.type}: making {cfg.gym_id} failed: {type(e).__name__}: {e}"
        ) from None


def _task_attribute(make_one) -> str | None:
    """Which attribute holds the task string: task_description, else task, else none."""
    probe = make_one()
    try:
        for name in TASK_ATTRIBUTES:
            try:
                probe.get_wrapper_attr(name)
                return name
            except AttributeError:
                continue
        return None
    finally:
        probe.close()


def auto_batch_size(n_episodes: int) -> int:
    """``--eval.batch_size=0``: LeRobot 0.6.1's rule, 70 % of the CPU cores (at least one),
    at most ``n_episodes`` and 64."""
    import os

    by_cpu = max(1, math.floor((os.cpu_count() or 4) * 0.7))
    return min(by_cpu, n_episodes, 64)


def _image(array: np.ndarray) -> torch.Tensor:
    image = torch.from_numpy(np.ascontiguousarray(array))
    if image.ndim == 3:
        image = image.unsqueeze(0)
    if image.dtype != torch.uint8:
        raise EnvError(f"environment images must be uint8 HWC, got {image.dtype}")
    return image.permute(0, 3, 1, 2).contiguous().to(torch.float32) / 255


def _vector(array: np.ndarray) -> torch.Tensor:
    out = torch.from_numpy(np.asarray(array)).float()
    return out.unsqueeze(0) if out.dim() == 1 else out


def preprocess_observation(observation: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A (batched) raw observation as the policy's features (LeRobot's mapping)."""
    out: dict[str, torch.Tensor] = {}
    pixels = observation.get("pixels")
    if isinstance(pixels, dict):
        for camera, image in pixels.items():
            out[f"{OBS_IMAGES}.{camera}"] = _image(image)
    elif pixels is not None:
        out[OBS_IMAGE] = _image(pixels)
    if "environment_state" in observation:
        out[OBS_ENV_STATE] = _vector(observation["environment_state"])
    if "agent_pos" in observation:
        out[OBS_STATE] = _vector(observation["agent_pos"])
    for key, value in observation.items():
        if key in ("pixels", "environment_state", "agent_pos"):
            continue
        if isinstance(value, np.ndarray) and f"observation.{key}" not in out:
            out[f"observation.{key}"] = _vector(value)
    return out


def delivered_features(observation_space, action_space) -> dict[str, dict[str, Any]]:
    """What a (single) environment really delivers, as policy features (images CHW)."""

    def image(space) -> dict[str, Any]:
        h, w, c = space.shape
        return {"type": "VISUAL", "shape": [c, h, w]}

    spaces = dict(observation_space.spaces)
    out: dict[str, dict[str, Any]] = {}
    pixels = spaces.pop("pixels", None)
    if pixels is not None and hasattr(pixels, "spaces"):
        for camera, space in pixels.spaces.items():
            out[f"{OBS_IMAGES}.{camera}"] = image(space)
    elif pixels is not None:
        out[OBS_IMAGE] = image(pixels)
    named = {"environment_state": (OBS_ENV_STATE, "ENV"), "agent_pos": (OBS_STATE, "STATE")}
    for key, space in spaces.items():
        policy_key, kind = named.get(key, (f"observation.{key}", "STATE"))
        if getattr(space, "shape", None) is not None:
            out[policy_key] = {"type": kind, "shape": list(space.shape)}
    out[ACTION] = {"type": "ACTION", "shape": list(action_space.shape)}
    return out


def check_policy_features(
    input_features: dict[str, dict[str, Any]],
    output_features: dict[str, dict[str, Any]],
    delivered: dict[str, dict[str, Any]],
    rename_map: dict[str, str],
    env_name: str,
) -> None:
    """Refuse a policy whose inputs the environment does not deliver (after ``--rename_map``,
    as the policy's preprocessor renames them) or whose action does not fit, saying which."""
    renamed = {rename_map.get(k, k): v for k, v in delivered.items() if k != ACTION}
    problems = []
    for key, ft in input_features.items():
        got = renamed.get(key)
        if got is None:
            problems.append(f"{key} {list(ft['shape'])} is not delivered")
        elif list(got["shape"]) != list(ft["shape"]):
            problems.append(
                f"{key}: the policy expects {list(ft['shape'])}, the environment delivers {got['shape']}"
            )
    action = output_features.get(ACTION)
    if action is not None and list(action["shape"]) != delivered[ACTION]["shape"]:
        problems.append(
            f"action: the policy outputs {list(action['shape'])}, the environment takes {delivered[ACTION]['shape']}"
        )
    if problems:
        offered = {k: v["shape"] for k, v in renamed.items()}
        raise EnvError(
            f"the policy does not fit {env_name}: {'; '.join(problems)} (it delivers {offered}; "
            'map other names with --rename_map=\'{"<env key>": "<policy key>"}\' or pass the '
            "matching --env.* options)"
        )
