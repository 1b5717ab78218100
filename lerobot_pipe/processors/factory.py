"""The pre- and postprocessor of a policy, built new or loaded, with LeRobot's call conventions.

``make_pre_post_processors(policy_cfg, dataset_stats=...)`` builds the policy's pair: the
config's ``processor_steps`` arranges LeRobot's default steps (:class:`DefaultSteps`) and any of
its own; by default LeRobot's default pair::

    preprocessor:  rename_observations_processor -> to_batch_processor -> device_processor
                   -> normalizer_processor
    postprocessor: unnormalizer_processor -> device_processor (cpu)

Each policy package declares its own pipeline there; nothing here names a policy type.

``make_pre_post_processors(policy_cfg, pretrained_path=...)`` loads a saved pair (ours or
LeRobot's), with ``preprocessor_overrides`` / ``postprocessor_overrides`` keyed by step registry
name, exactly as LeRobot's eval, record and train tools pass them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lerobot_pipe.constants import POLICY_POSTPROCESSOR_NAME, POLICY_PREPROCESSOR_NAME
from lerobot_pipe.processors.normalize import NormalizerProcessorStep, UnnormalizerProcessorStep
from lerobot_pipe.processors.pipeline import PolicyProcessorPipeline, ProcessorStep
from lerobot_pipe.processors.steps import (
    AddBatchDimensionProcessorStep,
    DeviceProcessorStep,
    RenameObservationsProcessorStep,
)

if TYPE_CHECKING:
    from lerobot_pipe.policies.pretrained import PreTrainedConfig


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
    a Hub repo id) when given, else built from ``policy_cfg`` and ``dataset_stats``."""
    if pretrained_path is not None:
        from lerobot_pipe.policies.locate import local_policy_folder

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
