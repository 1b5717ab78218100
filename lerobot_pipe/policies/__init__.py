"""Policies: configs, modules and the factory that builds them by type name.

Importing this package registers every policy type (``act``).
"""

from lerobot_pipe.policies.act import ACTConfig, ACTPolicy
from lerobot_pipe.policies.factory import get_policy_class, make_policy, make_policy_config
from lerobot_pipe.policies.pretrained import (
    PreTrainedConfig,
    PreTrainedPolicy,
    dataset_to_policy_features,
)

__all__ = [
    "ACTConfig",
    "ACTPolicy",
    "PreTrainedConfig",
    "PreTrainedPolicy",
    "dataset_to_policy_features",
    "get_policy_class",
    "make_policy",
    "make_policy_config",
]
