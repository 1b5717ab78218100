"""The base of every policy config (config.json), as LeRobot keeps it in
``lerobot/configs/policies.py``: the fields all policies share, feature checks, presets and
serialization.

Each policy's config subclasses it in ``lerobot_pipe/policies/<type>/`` and registers its
``type`` there when that package is imported: code that turns a ``type`` into a config class
(parsing a train config, reading a config.json) needs ``lerobot_pipe.policies`` imported first,
which imports every policy package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from lerobot_pipe.configs.choice import ChoiceRegistry
from lerobot_pipe.configs.parser import ConfigError, from_dict, to_dict
from lerobot_pipe.configs.types import (
    ACTION,
    FEATURE_TYPES,
    NORMALIZATION_MODES,
    OBS_ENV_STATE,
    OBS_STATE,
)
from lerobot_pipe.constants import CONFIG_NAME

if TYPE_CHECKING:
    from lerobot_pipe.configs.optim import OptimizerConfig, SchedulerConfig


def _check_features(features: Any, field_name: str) -> None:
    """Raise ValueError unless ``features`` maps names to ``{"type": ..., "shape": [...]}``."""
    if not isinstance(features, dict):
        raise ValueError(f"{field_name} must be a dict of feature name -> {{'type', 'shape'}}")
    for key, ft in features.items():
        if not isinstance(ft, dict) or set(ft) != {"type", "shape"}:
            raise ValueError(
                f"{field_name}[{key!r}] must be a dict with exactly the keys 'type' and 'shape', "
                f"got {ft!r}"
            )
        if ft["type"] not in FEATURE_TYPES:
            raise ValueError(
                f"{field_name}[{key!r}]['type'] is {ft['type']!r}; expected one of {FEATURE_TYPES}"
            )
        shape = ft["shape"]
        if (
            not isinstance(shape, list | tuple)
            or not shape
            or not all(isinstance(d, int) and d > 0 for d in shape)
        ):
            raise ValueError(
                f"{field_name}[{key!r}]['shape'] must be a non-empty list of positive ints, "
                f"got {shape!r}"
            )


@dataclass
class PreTrainedConfig(ChoiceRegistry, choice_base=True, choice_kind="policy"):
    """Base of every policy config: LeRobot's base fields. Subclasses register a ``type`` name
    with ``@PreTrainedConfig.register_subclass(name)`` and define their own fields, among them
    ``normalization_mapping`` (feature type -> mode).

    ``input_features`` / ``output_features`` map feature names to
    ``{"type": "STATE" | "ENV" | "ACTION" | "VISUAL", "shape": [...]}``; ``make_policy``
    fills them from the dataset when they are left empty. ``device`` None lets the trainer pick
    (the rank's GPU, else the CPU). ``use_amp`` asks for automatic mixed precision (bf16 on CPU,
    fp16 on CUDA, as torch.autocast's defaults). ``use_peft`` marks a checkpoint that holds LoRA
    adapters over the base policy named in its adapter_config.json. ``push_to_hub`` defaults to
    False here (LeRobot: True), so that a run without ``--policy.repo_id`` does not fail.
    """

    # LeRobot policy types refused by name, with the reason.
    refused_choices: ClassVar[dict[str, str]] = {
        "pi0_fast": (
            "pi0-FAST predicts FAST action tokens through a tokenizer built from remote code "
            "(lerobot/fast-action-tokenizer, trust_remote_code) when the policy is constructed; "
            "train --policy.type=pi0 or pi05 (flow matching, sharded here)"
        ),
    }
    n_obs_steps: int = 1  # observation frames the policy sees per prediction
    # name -> {"type", "shape"} of the policy's inputs (default: from the dataset)
    input_features: dict[str, dict] = field(default_factory=dict)
    # name -> {"type", "shape"} of the policy's outputs (default: from the dataset)
    output_features: dict[str, dict] = field(default_factory=dict)
    device: str | None = None  # cpu, cuda, ... (default: the rank's GPU, else the CPU)
    use_amp: bool = False  # automatic mixed precision (bf16 on CPU, fp16 on CUDA)
    use_peft: bool = False  # set in a checkpoint's config.json that holds LoRA adapters
    push_to_hub: bool = False  # publish the final checkpoint to --policy.repo_id
    repo_id: str | None = None  # Hub model repo (namespace/name) to push to
    private: bool | None = None  # create that repo private
    tags: list[str] | None = None  # tags of the model card
    license: str | None = None  # license of the model card
    pretrained_path: str | None = None  # set by --policy.path: the folder the weights came from
    pretrained_revision: str | None = None  # Hub revision of --policy.path

    # feature type (VISUAL, STATE, ENV, ACTION) -> MEAN_STD, MIN_MAX or IDENTITY
    normalization_mapping: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.n_obs_steps < 1:
            raise ValueError(f"n_obs_steps must be >= 1, got {self.n_obs_steps}")
        for feature_type, mode in self.normalization_mapping.items():
            if feature_type not in FEATURE_TYPES:
                raise ValueError(
                    f"normalization_mapping has unknown feature type {feature_type!r}; "
                    f"expected one of {FEATURE_TYPES}"
                )
            if mode not in NORMALIZATION_MODES:
                raise ValueError(
                    f"normalization_mapping[{feature_type!r}] is {mode!r}; "
                    f"expected one of {NORMALIZATION_MODES}"
                )

    # --- features -------------------------------------------------------------------------

    def validate_features(self) -> None:
        """Check the feature dicts; subclasses add their own requirements."""
        _check_features(self.input_features, "input_features")
        _check_features(self.output_features, "output_features")
        if ACTION not in self.output_features:
            raise ValueError(
                f"output_features must contain {ACTION!r}, got {sorted(self.output_features)}"
            )
        for key, ft in self.output_features.items():
            if ft["type"] != "ACTION":
                raise ValueError(f"output_features[{key!r}] must have type 'ACTION'")
        for key, ft in self.input_features.items():
            if ft["type"] == "ACTION":
                raise ValueError(f"input_features[{key!r}] has type 'ACTION'; actions are outputs")

    @property
    def image_features(self) -> dict[str, dict]:
        return {k: ft for k, ft in self.input_features.items() if ft["type"] == "VISUAL"}

    @property
    def robot_state_feature(self) -> dict | None:
        return self.input_features.get(OBS_STATE)

    @property
    def env_state_feature(self) -> dict | None:
        return self.input_features.get(OBS_ENV_STATE)

    @property
    def action_feature(self) -> dict:
        return self.output_features[ACTION]

    @property
    def observation_delta_indices(self) -> list[int] | None:
        """Frame offsets loaded for each observation; None means the current frame only."""
        return None

    @property
    def action_delta_indices(self) -> list[int] | None:
        """Frame offsets loaded for the action target; None means the current frame only."""
        return None

    # --- optimizer presets ----------------------------------------------------------------

    def get_optimizer_preset(self) -> OptimizerConfig:
        """The optimizer the policy trains with by default (``use_policy_training_preset``)."""
        raise NotImplementedError(f"{type(self).__name__} defines no optimizer preset")

    def get_scheduler_preset(self) -> SchedulerConfig | None:
        """The learning-rate scheduler the policy trains with by default; None for a constant lr."""
        return None

    # --- processors -----------------------------------------------------------------------

    def processor_steps(self, defaults: Any) -> tuple[list, list]:
        """The steps of this policy's (preprocessor, postprocessor), from ``defaults``
        (``lerobot_pipe.policies.factory.DefaultSteps``): LeRobot's default pipelines unless
        a policy adds its own steps (e.g. a tokenizer)."""
        return (
            [defaults.rename, defaults.to_batch, defaults.to_device, defaults.normalize],
            [defaults.unnormalize, defaults.to_cpu],
        )

    def sharding_problem(self) -> str | None:
        """Why this config cannot be sharded (FSDP2/HSDP), or None; checked before launch."""
        return None

    def publish_problem(self) -> str | None:
        """Why a published checkpoint of this config could not be rebuilt by others (e.g. it
        names a local folder they do not have), or None. Publishing refuses it before upload."""
        return None

    # --- serialization --------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """``{"type": <name>, **fields}``, the content of config.json."""
        if getattr(type(self), "type", None) is None:
            raise TypeError(f"{type(self).__name__} is not registered with register_subclass")
        return to_dict(self)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` into ``directory`` (created if needed)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), indent=4)
        (directory / CONFIG_NAME).write_text(text + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> PreTrainedConfig:
        """Read ``config.json`` from ``directory`` and build the config class named by its type.

        Keys this version does not know (a field of another LeRobot release) are kept and written
        back; values are checked as flags are (ValueError naming the key)."""
        path = Path(directory) / CONFIG_NAME
        if not path.is_file():
            raise FileNotFoundError(f"no {CONFIG_NAME} in {directory}")
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a JSON object")
        if "type" not in data:
            raise ValueError(f"{path} has no 'type' key; known types: {cls.known_choices()}")
        try:
            config = from_dict(PreTrainedConfig, data, "policy.", lenient=True)
        except ConfigError as e:
            raise ValueError(f"{path}: {e}") from None
        if not isinstance(config, cls):
            raise ValueError(f"{path} holds a {config.type!r} config, not a {cls.__name__}")
        config.__post_init__()
        return config
