"""LeRobot 0.6.1's ``relative_actions_processor`` / ``absolute_actions_processor`` steps, as its
pi0 / pi0.5 pipelines save them: present even when disabled (``enabled: false``), so that the
pipelines saved here and LeRobot's list the same steps. Disabled, each passes the batch through;
enabling them is refused (relative actions are not built here)."""

from __future__ import annotations

from typing import Any

from lerobot_pipe.processors.pipeline import Batch, ProcessorError, ProcessorStep, register_step


def _refuse_enabled(name: str, enabled: bool) -> None:
    if enabled:
        raise ProcessorError(
            f"{name}: enabled=true converts actions relative to the state, which is not built "
            "here; train with --policy.use_relative_actions=false"
        )


@register_step
class RelativeActionsProcessorStep(ProcessorStep):
    """Absolute -> relative actions (disabled: the identity)."""

    registry_name = "relative_actions_processor"

    def __init__(
        self,
        enabled: bool = False,
        exclude_joints: list[str] | None = None,
        action_names: list[str] | None = None,
    ) -> None:
        _refuse_enabled(self.registry_name, enabled)
        self.enabled = bool(enabled)
        self.exclude_joints = list(exclude_joints or [])
        self.action_names = None if action_names is None else list(action_names)

    def __call__(self, batch: Batch) -> Batch:
        return batch

    def get_config(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "exclude_joints": self.exclude_joints,
            "action_names": self.action_names,
        }


@register_step
class AbsoluteActionsProcessorStep(ProcessorStep):
    """Relative -> absolute actions (disabled: the identity)."""

    registry_name = "absolute_actions_processor"

    def __init__(self, enabled: bool = False) -> None:
        _refuse_enabled(self.registry_name, enabled)
        self.enabled = bool(enabled)

    def __call__(self, batch: Batch) -> Batch:
        return batch

    def get_config(self) -> dict[str, Any]:
        return {"enabled": self.enabled}
