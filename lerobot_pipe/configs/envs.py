"""The base of ``--env.*``, LeRobot 0.6.1's EnvConfig fields: what every simulated environment
config shares. The environments themselves (``--env.type=pusht``, ``aloha``, ``synthetic``)
subclass it in :mod:`lerobot_pipe.envs.configs` and register their ``type`` when
``lerobot_pipe.envs`` is imported: code that parses an ``--env.type`` imports that first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from lerobot_pipe.configs.choice import ChoiceRegistry


@dataclass
class EnvConfig(ChoiceRegistry, choice_base=True, choice_kind="env"):
    """Base of ``--env.type=...``: LeRobot 0.6.1's EnvConfig fields."""

    task: str | None = None  # the gym task id within the package (PushT-v0, ...)
    fps: int = 30  # control frequency (frames per second of the eval videos)
    # raw observation key -> the policy's feature key
    features_map: dict[str, str] = field(default_factory=dict)
    max_parallel_tasks: int = 1  # tasks evaluated at once (single-task envs: 1)
    disable_env_checker: bool = True  # gym.make's passive env checker off, as LeRobot

    # The importable package that registers the gym ids, and what to pip install for it.
    package_name: ClassVar[str] = ""
    install_hint: ClassVar[str] = ""

    @property
    def gym_id(self) -> str:
        return f"{self.package_name}/{self.task}"

    @property
    def gym_kwargs(self) -> dict[str, Any]:
        return {}

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        """What the config declares, by raw key: ``{"type", "shape"}`` (images HWC)."""
        return {}

    def task_groups(self) -> list[tuple[str, int]]:
        """The (task_group, task_id) pairs evaluated: one for a single-task environment."""
        return [(self.type, 0)]
