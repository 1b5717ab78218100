"""Base classes of every policy: its config (config.json) and its module (model.safetensors).

Names and files follow LeRobot's so a user's checkpoints, scripts and habits carry over:
a policy folder holds ``config.json`` (the config's fields plus its registered ``type``)
and ``model.safetensors`` (the full fp32 state dict). Weights are only ever read with
safetensors, never with pickle.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from lerobot_pipe.configs.choice import ChoiceRegistry
from lerobot_pipe.configs.types import (  # noqa: F401 - re-exported: the policies' names
    ACTION,
    FEATURE_TYPES,
    NORMALIZATION_MODES,
    OBS_ENV_STATE,
    OBS_IMAGES_PREFIX,
    OBS_PREFIX,
    OBS_STATE,
)
from lerobot_pipe.constants import CONFIG_NAME, MODEL_DCP_DIR, MODEL_SAFETENSORS

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
        (``lerobot_pipe.processors.factory.DefaultSteps``): LeRobot's default pipelines unless
        a policy adds its own steps (e.g. a tokenizer)."""
        return (
            [defaults.rename, defaults.to_batch, defaults.to_device, defaults.normalize],
            [defaults.unnormalize, defaults.to_cpu],
        )

    def publish_problem(self) -> str | None:
        """Why a published checkpoint of this config could not be rebuilt by others (e.g. it
        names a local folder they do not have), or None. Publishing refuses it before upload."""
        return None

    # --- serialization --------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """``{"type": <name>, **fields}``, the content of config.json."""
        from lerobot_pipe.configs.parser import to_dict

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
        from lerobot_pipe.configs.parser import ConfigError, from_dict

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


def dataset_to_policy_features(info_features: dict) -> dict[str, dict]:
    """Map a dataset's ``info["features"]`` onto policy features.

    Images and videos become VISUAL (shape as channels-first), ``observation.environment_state``
    ENV, other ``observation.*`` keys STATE and ``action`` ACTION; bookkeeping columns
    (index, timestamp, frame_index, ...) are left out.
    """
    features: dict[str, dict] = {}
    for key, ft in info_features.items():
        shape = [int(d) for d in ft["shape"]]
        if ft.get("dtype") in ("image", "video"):
            names = ft.get("names")
            if len(shape) == 3 and names and names[2] in ("channel", "channels"):
                shape = [shape[2], shape[0], shape[1]]
            features[key] = {"type": "VISUAL", "shape": shape}
        elif key == OBS_ENV_STATE:
            features[key] = {"type": "ENV", "shape": shape}
        elif key.startswith(OBS_PREFIX):
            features[key] = {"type": "STATE", "shape": shape}
        elif key == ACTION:
            features[key] = {"type": "ACTION", "shape": shape}
    return features


def _prepare_for_safetensors(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Detached, contiguous CPU tensors, with no two sharing storage (safetensors refuses that)."""
    prepared: dict[str, Tensor] = {}
    seen_storages: set[int] = set()
    for key, tensor in state_dict.items():
        if isinstance(tensor, DTensor):
            raise ValueError(
                f"state dict entry {key!r} is a sharded DTensor; gather a full state dict "
                "and pass it as save_pretrained(..., state_dict=...)"
            )
        tensor = tensor.detach().to("cpu").contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if storage in seen_storages:
            tensor = tensor.clone()
        else:
            seen_storages.add(storage)
        prepared[key] = tensor
    return prepared


class PreTrainedPolicy(nn.Module, abc.ABC):
    """Base of every policy module.

    ``forward`` takes an already normalized batch and returns ``(loss, loss_dict)``; the
    processors in ``lerobot_pipe.processors`` normalize inputs and unnormalize actions.

    A subclass that sets ``name`` registers itself under it (``policy_classes()``); its
    ``config_class`` must be the config registered under the same name.
    """

    config_class: ClassVar[type[PreTrainedConfig]]
    name: ClassVar[str]
    _registry: ClassVar[dict[str, type[PreTrainedPolicy]]] = {}
    # Class names of the submodules that become FSDP2 wrap units.
    _fsdp_wrap_modules: ClassVar[list[str]] = []
    # Module names LoRA adapts when --peft.target_modules is not given.
    _peft_target_modules: ClassVar[list[str] | str] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is None:  # an intermediate base, or a class that only wraps a policy
            return
        config_type = getattr(cls.__dict__.get("config_class"), "type", None)
        if config_type != name:
            raise TypeError(
                f"{cls.__qualname__}.name is {name!r} but its config_class is registered as "
                f"{config_type!r}: decorate the config with @PreTrainedConfig.register_subclass"
                f"({name!r}) and set config_class to it"
            )
        registered = PreTrainedPolicy._registry.get(name)
        if registered is not None and registered is not cls:
            raise ValueError(f"policy {name!r} is already registered by {registered.__qualname__}")
        PreTrainedPolicy._registry[name] = cls

    @staticmethod
    def policy_classes() -> dict[str, type[PreTrainedPolicy]]:
        """Every registered policy class by type name."""
        return dict(PreTrainedPolicy._registry)

    def __init__(self, config: PreTrainedConfig, *, pretrained_parts: bool = True) -> None:
        """``pretrained_parts``: load the pretrained sub-networks the config names (e.g. an
        ImageNet backbone, as LeRobot's constructors do). False leaves them randomly initialized:
        for a policy whose full weights are loaded right after, or one built on the meta device.
        """
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs a {self.config_class.__name__}, "
                f"got {type(config).__name__}"
            )
        config.validate_features()
        self.config = config

    def save_pretrained(
        self, directory: str | Path, state_dict: dict[str, Tensor] | None = None
    ) -> None:
        """Write ``config.json`` and ``model.safetensors`` into ``directory``.

        ``state_dict`` lets a caller pass a full state dict it gathered itself (FSDP2);
        by default the module's own state dict is saved. Tensors keep their dtype.
        """
        directory = Path(directory)
        self.config.save_pretrained(directory)
        tensors = _prepare_for_safetensors(self.state_dict() if state_dict is None else state_dict)
        save_file(tensors, str(directory / MODEL_SAFETENSORS), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        config: PreTrainedConfig | None = None,
        map_location: str | torch.device = "cpu",
        strict: bool = True,
        revision: str | None = None,
    ) -> Self:
        """Build the policy from ``path`` — a folder (or the checkpoint step folder around it) or
        a Hub repo id at ``revision`` — from its config.json unless ``config`` is given, and load
        its weights from ``model.safetensors``. Returned in eval mode, on ``map_location``."""
        from lerobot_pipe.policies.locate import local_policy_folder

        path = local_policy_folder(str(path), revision=revision)
        model_file = path / MODEL_SAFETENSORS
        if not model_file.is_file():
            if (path / MODEL_DCP_DIR).is_dir():
                raise FileNotFoundError(
                    f"{path} has no {MODEL_SAFETENSORS}: this checkpoint holds DCP shards only; "
                    f"convert it first with: lerobot-convert-dcp --checkpoint_dir={path}"
                )
            raise FileNotFoundError(f"no {MODEL_SAFETENSORS} in {path}")
        if config is None:
            config = cls.config_class.from_pretrained(path)
        policy = cls(config, pretrained_parts=False)  # every weight comes from the file
        state_dict = load_file(str(model_file), device="cpu")
        try:
            result = policy.load_state_dict(state_dict, strict=False)
        except RuntimeError as err:
            raise RuntimeError(f"cannot load {model_file}: {err}") from err
        if strict and (result.missing_keys or result.unexpected_keys):
            raise RuntimeError(
                f"{model_file} does not match {cls.__name__}: "
                f"missing keys {result.missing_keys}, unexpected keys {result.unexpected_keys}"
            )
        policy.to(map_location)
        policy.eval()
        return policy

    def pretrained_weight_sources(self) -> list[tuple[str, str, Path | dict[str, Path]]]:
        """Parts built on the meta device (distributed/meta_init.py) whose weights the eager
        build would have loaded from their own pretrained files: ``(prefix of their names in
        state_dict, the Hub id or folder they come from, its safetensors file or each key's
        shard file)``; each rank reads its shards of them when it materializes. Empty for most
        policies."""
        return []

    def get_optim_params(self) -> list[dict]:
        """The optimizer's parameter groups (LeRobot's hook): one group of the trainable
        parameters unless a policy trains parts at their own learning rate."""
        return [{"params": [p for p in self.parameters() if p.requires_grad]}]

    def loss_normalizers(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Integer denominators of the loss terms that average over a count other than the batch
        size (e.g. non-padded steps), counted on ``batch``; the trainer sums them over a whole
        data-parallel batch and passes them back to ``forward(batch, normalizers=...)``. Empty
        when every term is a mean over samples."""
        return {}

    @abc.abstractmethod
    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Training loss on a normalized batch, and its parts as detached scalar tensors (reading
        them is left to the caller, so a step costs no device sync)."""

    @abc.abstractmethod
    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        """The next (normalized) action for a batch of observations."""

    @abc.abstractmethod
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """A chunk of (normalized) actions for a batch of observations."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Clear the state kept between select_action calls (call at each episode start)."""
