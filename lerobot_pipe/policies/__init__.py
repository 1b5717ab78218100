"""Policies: configs, modules and the factory that builds them by type name.

Importing this package registers every policy type: each subpackage ``<type>/`` that holds
``configuration_<type>.py`` and ``modeling_<type>.py`` (LeRobot's layout) is imported by
``factory.discover_policies``. A new policy is one such package plus its tests:

- ``configuration_<type>.py``: a dataclass config decorated with
  ``@PreTrainedConfig.register_subclass("<type>")`` (its fields are ``--policy.*`` flags and
  config.json), with ``validate_features``, ``observation_delta_indices`` /
  ``action_delta_indices``, ``get_optimizer_preset`` / ``get_scheduler_preset`` and
  ``normalization_mapping``; a ``drop_n_last_frames`` field keeps the sampler off each episode's
  last frames, as LeRobot's sampler does;
- ``modeling_<type>.py``: a ``PreTrainedPolicy`` subclass with ``name = "<type>"`` and
  ``config_class`` (it registers itself), its ``_fsdp_wrap_modules`` (class names of the FSDP2
  units) and ``_peft_target_modules``;
- ``__init__.py`` importing both (and any processor steps of its own, which register with
  ``register_step``); the config's ``processor_steps`` arranges its pipelines (LeRobot's default
  steps unless it overrides it, as SmolVLA does for its tokenizer).

Nothing else names policy types: the trainer, processors, checkpoints, converter, Hub publishing
and the pipeline take any registered type (``--policy.type=<type>``).
"""

from lerobot_pipe.policies.act import ACTConfig, ACTPolicy
from lerobot_pipe.policies.factory import get_policy_class, make_policy, make_policy_config
from lerobot_pipe.policies.pretrained import PreTrainedPolicy, dataset_to_policy_features

__all__ = [
    "ACTConfig",
    "ACTPolicy",
    "PreTrainedPolicy",
    "dataset_to_policy_features",
    "get_policy_class",
    "make_policy",
    "make_policy_config",
]
