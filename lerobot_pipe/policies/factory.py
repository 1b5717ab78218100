"""Build policy configs, policies and their processors by type name (LeRobot's
``lerobot.policies.factory`` API: scripts written against it port by changing the import).

Importing this module imports every policy package (:func:`discover_policies`), which registers
their configs and classes."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from typing import Any

from lerobot_pipe.policies.pretrained import (
    PreTrainedConfig,
    PreTrainedPolicy,
    dataset_to_policy_features,
)
from lerobot_pipe.processors import make_pre_post_processors

__all__ = [
    "discover_policies",
    "fill_features",
    "get_policy_class",
    "make_policy",
    "make_policy_config",
    "make_pre_post_processors",
]

_PACKAGE = __name__.rpartition(".")[0]


def discover_policies() -> list[str]:
    """Import each policy package of ``lerobot_pipe.policies``: a subpackage ``<type>/`` holding
    ``modeling_<type>.py`` (LeRobot's layout; ``vision/`` and other shared packages hold none).
    Its config registers with ``@PreTrainedConfig.register_subclass("<type>")`` and its policy
    class by setting ``name = "<type>"``. Returns the packages found."""
    package = importlib.import_module(_PACKAGE)
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg and importlib.util.find_spec(f"{_PACKAGE}.{info.name}.modeling_{info.name}"):
            importlib.import_module(f"{_PACKAGE}.{info.name}")
            found.append(info.name)
    return found


def make_policy_config(policy_type: str, **fields: Any) -> PreTrainedConfig:
    """The config of ``policy_type`` with ``fields`` set; ValueError listing known types."""
    return PreTrainedConfig.get_choice_class(policy_type)(**fields)


def get_policy_class(policy_type: str) -> type[PreTrainedPolicy]:
    """The policy class of ``policy_type``; ValueError listing known types."""
    classes = PreTrainedPolicy.policy_classes()
    try:
        return classes[policy_type]
    except KeyError:
        raise ValueError(
            f"unknown policy type {policy_type!r}; known types: {sorted(classes)}"
        ) from None


def fill_features(cfg: PreTrainedConfig, dataset_features: dict | None) -> None:
    """Fill empty ``cfg.input_features`` / ``cfg.output_features`` (in place) from a dataset's
    ``info["features"]``, then validate them (ValueError)."""
    if not cfg.input_features or not cfg.output_features:
        if dataset_features is None:
            raise ValueError(
                f"the {cfg.type!r} config has no input_features/output_features; pass the "
                "dataset's info['features'] as dataset_features to fill them"
            )
        features = dataset_to_policy_features(dataset_features)
        if not cfg.output_features:
            cfg.output_features = {k: ft for k, ft in features.items() if ft["type"] == "ACTION"}
        if not cfg.input_features:
            cfg.input_features = {k: ft for k, ft in features.items() if ft["type"] != "ACTION"}
    cfg.validate_features()


def make_policy(
    cfg: PreTrainedConfig, dataset_features: dict | None = None, *, pretrained_parts: bool = True
) -> PreTrainedPolicy:
    """Build the policy ``cfg`` describes.

    Empty ``cfg.input_features`` / ``cfg.output_features`` are filled (in place) from
    ``dataset_features``, a dataset's ``info["features"]``. With ``cfg.pretrained_path`` set
    the weights are loaded from that folder (the policy then comes back in eval mode, like
    LeRobot's; a LoRA checkpoint, ``use_peft``, comes back with its adapter merged); otherwise
    they are freshly initialized, with the pretrained sub-networks the config names (an ImageNet
    backbone) loaded unless ``pretrained_parts`` is False (a resumed run, whose checkpoint holds
    every weight).
    """
    fill_features(cfg, dataset_features)
    policy_cls = get_policy_class(cfg.type)
    if cfg.pretrained_path:
        from lerobot_pipe.policies.peft import load_pretrained_policy

        return load_pretrained_policy(cfg.pretrained_path, config=cfg)
    return policy_cls(cfg, pretrained_parts=pretrained_parts)


discover_policies()
