"""The base class of every policy module (model.safetensors); its config's base,
:class:`~lerobot_pipe.configs.policies.PreTrainedConfig`, is in configs/ (LeRobot's place).

Names and files follow LeRobot's so a user's checkpoints, scripts and habits carry over:
a policy folder holds ``config.json`` (the config's fields plus its registered ``type``)
and ``model.safetensors`` (the full fp32 state dict). Weights are only ever read with
safetensors, never with pickle.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.configs.types import (  # noqa: F401 - re-exported: the policies' names
    ACTION,
    FEATURE_TYPES,
    NORMALIZATION_MODES,
    OBS_ENV_STATE,
    OBS_IMAGES_PREFIX,
    OBS_PREFIX,
    OBS_STATE,
)
from lerobot_pipe.constants import MODEL_DCP_DIR, MODEL_SAFETENSORS


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
        from lerobot_pipe.utils.locate import local_policy_folder

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
        file_state = load_file(str(model_file), device="cpu")
        mapping, ignored = policy.map_file_keys(set(file_state))
        state_dict = {name: file_state[key] for name, key in mapping.items()}
        unread = sorted(set(file_state) - set(mapping.values()) - ignored)
        try:
            result = policy.load_state_dict(state_dict, strict=False)
        except RuntimeError as err:
            raise RuntimeError(f"cannot load {model_file}: {err}") from err
        unexpected = sorted({*result.unexpected_keys, *unread})
        if strict and (result.missing_keys or unexpected):
            raise RuntimeError(
                f"{model_file} does not match {cls.__name__}: "
                f"missing keys {result.missing_keys}, unexpected keys {unexpected}"
            )
        policy.to(map_location)
        policy.eval()
        return policy

    def map_file_keys(self, file_keys: set[str]) -> tuple[dict[str, str], set[str]]:
        """Where each state-dict entry is in a ``model.safetensors`` with ``file_keys``:
        (state-dict key -> file key, file keys to ignore). The identity here; a policy whose
        published files use other names (pi0's openpi-style keys) maps them."""
        return {key: key for key in file_keys}, set()

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
