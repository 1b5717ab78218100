"""LeRobot's own policies on our trainer, when LeRobot is installed beside us: a
``--policy.type`` we do not implement (or any, with ``--policy.implementation=lerobot``) is
LeRobot's config class (:mod:`.config`) and LeRobot's policy class (:mod:`.policy`), with
LeRobot's processors; the trainer, sharding, checkpoints, resume, evaluation and the pipeline
are ours. The only place lerobot_pipe imports LeRobot (docs/design.md)."""

from __future__ import annotations

from typing import Any

from lerobot_pipe.configs.choice import UnknownChoice
from lerobot_pipe.policies.lerobot_bridge.config import (
    INSTALL_HINT,
    LEROBOT_POLICY_TYPES,
    LeRobotPolicyConfig,
    config_class,
    lerobot_available,
    upstream_config_class,
)
from lerobot_pipe.policies.lerobot_bridge.policy import LeRobotPolicy, policy_class

__all__ = [
    "IMPLEMENTATIONS",
    "INSTALL_HINT",
    "LEROBOT_POLICY_TYPES",
    "LeRobotPolicy",
    "LeRobotPolicyConfig",
    "config_class",
    "lerobot_available",
    "lerobot_config_class",
    "upstream_config_class",
    "make_processors",
    "policy_class",
]

# --policy.implementation: whose code a type both projects implement runs.
IMPLEMENTATIONS = ("lerobot_pipe", "lerobot")
# A type name that asks for LeRobot's class even where we implement the type.
LEROBOT_PREFIX = "lerobot:"


def lerobot_config_class(name: str) -> type[LeRobotPolicyConfig]:
    """PreTrainedConfig's fallback: the config class of a policy type registered nowhere here
    (``lerobot:<type>`` for LeRobot's class of a type we implement too)."""
    policy_type = name.removeprefix(LEROBOT_PREFIX)
    if not policy_type or policy_type.startswith(LEROBOT_PREFIX):
        raise UnknownChoice(name)
    if policy_type != name and not lerobot_available():
        raise ValueError(
            f"--policy.implementation=lerobot trains LeRobot's own {policy_type}, and LeRobot is "
            f"not installed: {INSTALL_HINT}"
        )
    return config_class(policy_type)


def make_processors(
    config: LeRobotPolicyConfig,
    *,
    dataset_stats: Any = None,
    pretrained_path: Any = None,
    device: str | None = None,
    rename_map: dict[str, str] | None = None,
) -> tuple[Any, Any]:
    """LeRobot's (preprocessor, postprocessor) for the policy: built by LeRobot's
    ``make_pre_post_processors`` from the config and the dataset's statistics, or loaded from a
    checkpoint's ``pretrained_model`` (a resumed run) with the device and rename map
    overridden, as LeRobot's train and eval scripts load them."""
    from lerobot.policies.factory import make_pre_post_processors

    upstream = config.upstream()
    if device is not None:
        upstream.device = device
    if pretrained_path is not None:
        overrides = {
            "device_processor": {"device": device or "cpu"},
            "rename_observations_processor": {"rename_map": dict(rename_map or {})},
        }
        return make_pre_post_processors(
            upstream,
            pretrained_path=str(pretrained_path),
            preprocessor_overrides=overrides,
            postprocessor_overrides={"device_processor": {"device": "cpu"}},
        )
    pre, post = make_pre_post_processors(upstream, dataset_stats=dataset_stats)
    if rename_map:
        for step in pre.steps:
            if hasattr(step, "rename_map"):
                step.rename_map = dict(rename_map)
                break
        else:
            raise ValueError(f"the {config.type} preprocessor has no rename step for --rename_map")
    return pre, post
