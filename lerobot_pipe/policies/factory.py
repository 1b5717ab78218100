"""Build policy configs, policies and their processors by type name (LeRobot's
``lerobot.policies.factory`` API: scripts written against it port by changing the import).

Importing this module imports every policy package (:func:`discover_policies`), which registers
their configs, classes and processor steps: a saved processor pipeline that names a policy's own
step loads once this module is imported.

``make_pre_post_processors(policy_cfg, dataset_stats=...)`` builds the policy's pair: the
config's ``processor_steps`` arranges LeRobot's default steps (:class:`DefaultSteps`) and any of
its own; by default LeRobot's default pair::

    preprocessor:  rename_observations_processor -> to_batch_processor -> device_processor
                   -> normalizer_processor
    postprocessor: unnormalizer_processor -> device_processor (cpu)

``make_pre_post_processors(policy_cfg, pretrained_path=...)`` loads a saved pair (ours or
LeRobot's), with ``preprocessor_overrides`` / ``postprocessor_overrides`` keyed by step registry
name, exactly as LeRobot's eval, record and train tools pass them."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lerobot_pipe.configs.choice import UnknownChoice
from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.constants import POLICY_POSTPROCESSOR_NAME, POLICY_PREPROCESSOR_NAME
from lerobot_pipe.policies import lerobot_bridge
from lerobot_pipe.policies.pretrained import PreTrainedPolicy, dataset_to_policy_features
from lerobot_pipe.processors.normalize import NormalizerProcessorStep, UnnormalizerProcessorStep
from lerobot_pipe.processors.pipeline import PolicyProcessorPipeline, ProcessorStep
from lerobot_pipe.processors.steps import (
    AddBatchDimensionProcessorStep,
    DeviceProcessorStep,
    RenameObservationsProcessorStep,
)
from lerobot_pipe.utils.locate import local_policy_folder

__all__ = [
    "DefaultSteps",
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


def get_policy_class(policy: str | PreTrainedConfig) -> type[PreTrainedPolicy]:
    """The policy class of a config, or of a type name: ours where we implement the type, else
    LeRobot's own (installed beside us; lerobot_bridge), and LeRobot's for a config of
    LeRobot's class (``--policy.implementation=lerobot``). ValueError listing known types, or
    naming LeRobot's install for one of its types."""
    if isinstance(policy, lerobot_bridge.LeRobotPolicyConfig):
        return lerobot_bridge.policy_class(policy.type)
    policy_type = policy if isinstance(policy, str) else policy.type
    classes = PreTrainedPolicy.policy_classes()
    if policy_type in classes:
        return classes[policy_type]
    try:
        lerobot_bridge.upstream_config_class(policy_type)
    except UnknownChoice:
        raise ValueError(
            f"unknown policy type {policy_type!r}; known types: {sorted(classes)}"
        ) from None
    return lerobot_bridge.policy_class(policy_type)


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
    policy_cls = get_policy_class(cfg)
    if cfg.pretrained_path:
        from lerobot_pipe.policies.peft import load_pretrained_policy

        return load_pretrained_policy(cfg.pretrained_path, config=cfg)
    return policy_cls(cfg, pretrained_parts=pretrained_parts)


@dataclass(frozen=True)
class DefaultSteps:
    """LeRobot's default steps, built for one policy config; a config's ``processor_steps``
    arranges them (and its own steps) into its pipelines."""

    rename: ProcessorStep
    to_batch: ProcessorStep
    to_device: ProcessorStep
    normalize: ProcessorStep
    unnormalize: ProcessorStep
    to_cpu: ProcessorStep


def make_pre_post_processors(
    policy_cfg: PreTrainedConfig,
    pretrained_path: str | Path | None = None,
    pretrained_revision: str | None = None,
    *,
    dataset_stats: Mapping[str, Mapping[str, Any]] | None = None,
    preprocessor_overrides: Mapping[str, Mapping[str, Any]] | None = None,
    postprocessor_overrides: Mapping[str, Mapping[str, Any]] | None = None,
    preprocessor_config_filename: str = f"{POLICY_PREPROCESSOR_NAME}.json",
    postprocessor_config_filename: str = f"{POLICY_POSTPROCESSOR_NAME}.json",
) -> tuple[PolicyProcessorPipeline, PolicyProcessorPipeline]:
    """The policy's (preprocessor, postprocessor): loaded from ``pretrained_path`` (a folder or
    a Hub repo id) when given, else built from ``policy_cfg`` and ``dataset_stats``. LeRobot's
    own (its pipelines and steps) for a LeRobot policy's config."""
    if isinstance(policy_cfg, lerobot_bridge.LeRobotPolicyConfig):
        return lerobot_bridge.make_processors(
            policy_cfg,
            dataset_stats=dataset_stats,
            pretrained_path=pretrained_path,
            device=policy_cfg.device,
        )
    if pretrained_path is not None:
        folder = local_policy_folder(
            str(pretrained_path), pretrained_revision, required_file=preprocessor_config_filename
        )
        pre = PolicyProcessorPipeline.from_pretrained(
            folder, preprocessor_config_filename, overrides=preprocessor_overrides
        )
        post = PolicyProcessorPipeline.from_pretrained(
            folder,
            postprocessor_config_filename,
            overrides=postprocessor_overrides,
            for_actions=True,
        )
        return pre, post
    stats = {k: dict(v) for k, v in (dataset_stats or {}).items()}
    norm_map = policy_cfg.normalization_mapping
    defaults = DefaultSteps(
        rename=RenameObservationsProcessorStep(rename_map={}),
        to_batch=AddBatchDimensionProcessorStep(),
        to_device=DeviceProcessorStep(device=policy_cfg.device or "cpu"),
        normalize=NormalizerProcessorStep(
            features={**policy_cfg.input_features, **policy_cfg.output_features},
            norm_map=norm_map,
            stats=stats,
        ),
        unnormalize=UnnormalizerProcessorStep(
            features=policy_cfg.output_features, norm_map=norm_map, stats=stats
        ),
        to_cpu=DeviceProcessorStep(device="cpu"),
    )
    pre_steps, post_steps = policy_cfg.processor_steps(defaults)
    pre = PolicyProcessorPipeline(pre_steps, POLICY_PREPROCESSOR_NAME)
    post = PolicyProcessorPipeline(post_steps, POLICY_POSTPROCESSOR_NAME, for_actions=True)
    return pre, post


discover_policies()
# A --policy.type registered nowhere here: LeRobot's own, when LeRobot is installed beside us.
PreTrainedConfig.choice_fallback = staticmethod(lerobot_bridge.lerobot_config_class)
