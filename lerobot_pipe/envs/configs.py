"""``--env.*``: the simulated environments lerobot-eval rolls policies out in, as LeRobot 0.6.1's
EnvConfig names them (``--env.type=pusht``, ``aloha``) plus the synthetic reaching task
(``synthetic``).

Each config names its gym id (``<package>/<task>``), the keyword arguments ``gym.make`` gets,
the features it declares (LeRobot's ``features``: HWC images, by raw observation key) and the
map from raw observation keys to the policy's (``features_map``). What an environment really
delivers is read from its observation space when it is made (``envs.factory``): gym-pusht
declares 384x384 here, as LeRobot's config does, and returns 96x96.

Importing this module needs neither gymnasium nor a simulator; ``factory.make_env`` says what to
install when one is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from lerobot_pipe.configs.envs import EnvConfig
from lerobot_pipe.configs.types import ACTION, OBS_ENV_STATE, OBS_STATE

OBS_IMAGE = "observation.image"
OBS_IMAGES = "observation.images"


def _simulator_kwargs(cfg: EnvConfig, **extra: Any) -> dict[str, Any]:
    """``gym.make``'s keywords that LeRobot passes every simulator, with ``extra`` (LeRobot's)."""
    return {
        "obs_type": cfg.obs_type,
        "render_mode": cfg.render_mode,
        **extra,
        "max_episode_steps": cfg.episode_length,
    }


@EnvConfig.register_subclass("pusht")
@dataclass
class PushtEnv(EnvConfig):
    """gym-pusht's PushT: push a T onto its target (2-D, absolute target actions in [0, 512])."""

    task: str | None = "PushT-v0"
    fps: int = 10
    episode_length: int = 300  # max_episode_steps
    obs_type: str = "pixels_agent_pos"  # or environment_state_agent_pos, pixels, state
    render_mode: str = "rgb_array"  # how frames are rendered (the videos)
    visualization_width: int = 384  # width of the rendered (video) frames
    visualization_height: int = 384  # height of the rendered (video) frames
    # Declared as LeRobot declares them; not passed to gym-pusht (it returns 96x96)
    observation_height: int = 384  # declared image height (gym-pusht delivers 96)
    observation_width: int = 384  # declared image width (gym-pusht delivers 96)
    features_map: dict[str, str] = field(
        default_factory=lambda: {
            ACTION: ACTION,
            "agent_pos": OBS_STATE,
            "environment_state": OBS_ENV_STATE,
            "pixels": OBS_IMAGE,
        }
    )

    package_name: ClassVar[str] = "gym_pusht"
    install_hint: ClassVar[str] = (
        "pip install 'lerobot_pipe[sim]' (gym-pusht>=0.1.5,<0.2, pymunk>=6.6,<7, gymnasium)"
    )

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        out = {
            ACTION: {"type": "ACTION", "shape": [2]},
            "agent_pos": {"type": "STATE", "shape": [2]},
        }
        if self.obs_type == "pixels_agent_pos":
            shape = [self.observation_height, self.observation_width, 3]
            out["pixels"] = {"type": "VISUAL", "shape": shape}
        elif self.obs_type == "environment_state_agent_pos":
            out["environment_state"] = {"type": "ENV", "shape": [16]}
        return out

    @property
    def gym_kwargs(self) -> dict[str, Any]:
        return _simulator_kwargs(
            self,
            visualization_width=self.visualization_width,
            visualization_height=self.visualization_height,
        )


@EnvConfig.register_subclass("aloha")
@dataclass
class AlohaEnv(EnvConfig):
    """gym-aloha's bimanual ALOHA tasks (MuJoCo; headless through MUJOCO_GL=egl)."""

    task: str | None = "AlohaInsertion-v0"  # or AlohaTransferCube-v0
    fps: int = 50
    episode_length: int = 400  # max_episode_steps
    obs_type: str = "pixels_agent_pos"  # or pixels
    observation_height: int = 480  # height of the top camera's images
    observation_width: int = 640  # width of the top camera's images
    render_mode: str = "rgb_array"  # how frames are rendered (the videos)
    features_map: dict[str, str] = field(
        default_factory=lambda: {
            ACTION: ACTION,
            "agent_pos": OBS_STATE,
            "top": f"{OBS_IMAGE}.top",
            "pixels/top": f"{OBS_IMAGES}.top",
        }
    )

    package_name: ClassVar[str] = "gym_aloha"
    install_hint: ClassVar[str] = (
        "pip install 'lerobot_pipe[aloha]' (gym-aloha>=0.1.4,<0.2, MuJoCo; set MUJOCO_GL=egl on a "
        "machine without a display)"
    )

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        image = {"type": "VISUAL", "shape": [self.observation_height, self.observation_width, 3]}
        out: dict[str, dict[str, Any]] = {ACTION: {"type": "ACTION", "shape": [14]}}
        if self.obs_type == "pixels":
            out["top"] = image
        elif self.obs_type == "pixels_agent_pos":
            out["agent_pos"] = {"type": "STATE", "shape": [14]}
            out["pixels/top"] = image
        return out

    @property
    def gym_kwargs(self) -> dict[str, Any]:
        return _simulator_kwargs(self)


@EnvConfig.register_subclass("synthetic")
@dataclass
class SyntheticEnv(EnvConfig):
    """The synthetic 2-D reaching task (the dataset ``make run`` trains on) as an environment:
    the same dynamics, observations and cameras as ``lerobot_pipe.datasets.synthetic``. The
    fields mirror the dataset generator's parameters; pass the ones the dataset was made with."""

    task: str | None = "Reach-v0"
    fps: int = 10
    episode_length: int = 50  # max_episode_steps (the expert needs at most 29 at 10 fps)
    cameras: list[str] = field(default_factory=list)  # rendered views: top, wrist
    image_size: int = 64  # square side of the camera images
    pixels_only: bool = False  # no environment_state (the goal): only the images show it
    success_distance: float = 0.1  # success: the agent this close to the goal (10x the noise)
    visualization_size: int = 256  # side of the video frames (the top view)
    render_mode: str = "rgb_array"  # how frames are rendered (the videos)
    features_map: dict[str, str] = field(
        default_factory=lambda: {
            ACTION: ACTION,
            "agent_pos": OBS_STATE,
            "environment_state": OBS_ENV_STATE,
            "pixels": OBS_IMAGE,  # LeRobot's map; cameras arrive as pixels/<view>
        }
    )

    package_name: ClassVar[str] = "lerobot_pipe"
    install_hint: ClassVar[str] = "pip install 'lerobot_pipe[sim]' (gymnasium)"

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        out = {
            ACTION: {"type": "ACTION", "shape": [2]},
            "agent_pos": {"type": "STATE", "shape": [2]},
        }
        if not self.pixels_only:
            out["environment_state"] = {"type": "ENV", "shape": [2]}
        for view in self.cameras:
            out[f"pixels/{view}"] = {
                "type": "VISUAL",
                "shape": [self.image_size, self.image_size, 3],
            }
        return out

    @property
    def gym_kwargs(self) -> dict[str, Any]:
        return {
            "fps": self.fps,
            "cameras": list(self.cameras),
            "image_size": self.image_size,
            "pixels_only": self.pixels_only,
            "success_distance": self.success_distance,
            "visualization_size": self.visualization_size,
            "render_mode": self.render_mode,
            "max_episode_steps": self.episode_length,
        }


def make_env_config(env_type: str, **fields: Any) -> EnvConfig:
    return EnvConfig.get_choice_class(env_type)(**fields)
