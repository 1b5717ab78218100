"""pi0's and pi0.5's processor steps and pipelines, LeRobot 0.6.1's (same registry names, config
keys and outputs), so the pipelines saved here load in LeRobot's ``make_pre_post_processors``
and LeRobot's load here:

- pi0: rename, to_batch, ``pi0_new_line_processor``, ``tokenizer_processor`` (PaliGemma's
  tokenizer, right padding to ``tokenizer_max_length``), device, relative actions (disabled),
  normalizer; unnormalizer, absolute actions (disabled), device (cpu).
- pi0.5: rename, to_batch, relative actions (disabled), normalizer,
  ``pi05_prepare_state_tokenizer_processor_step`` (the normalized state discretized into 256
  bins and written into the prompt), ``tokenizer_processor``, device; the same postprocessor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lerobot_pipe.configs.types import OBS_STATE
from lerobot_pipe.policies.smolvla.processor_smolvla import (
    NewLineTaskProcessorStep,
    TokenizerProcessorStep,
    _task_list,
)
from lerobot_pipe.processors.pipeline import Batch, ProcessorError, ProcessorStep, register_step
from lerobot_pipe.processors.relative_actions import (
    AbsoluteActionsProcessorStep,
    RelativeActionsProcessorStep,
)


@register_step
class Pi0NewLineProcessor(NewLineTaskProcessorStep):
    """Ends each task string with a newline (PaliGemma's prompt format); pi0's registry name."""

    registry_name = "pi0_new_line_processor"


def discretize_state(state: np.ndarray) -> np.ndarray:
    """openpi's 256 bins over [-1, 1] (the normalized state; values outside are not clipped:
    above 1 falls in bin 255, below -1 in bin -1, as LeRobot's)."""
    return np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1


@register_step
class Pi05PrepareStateTokenizerProcessorStep(ProcessorStep):
    """pi0.5's prompt: ``"Task: {task}, State: {bins};\\nAction: "`` per sample, the task with
    underscores and newlines as spaces, the state's (normalized) values as bin numbers."""

    registry_name = "pi05_prepare_state_tokenizer_processor_step"

    def __init__(self, max_state_dim: int = 32, task_key: str = "task") -> None:
        self.max_state_dim = int(max_state_dim)
        self.task_key = task_key

    def __call__(self, batch: Batch) -> Batch:
        state = batch.get(OBS_STATE)
        if state is None:
            raise ProcessorError(f"{self.registry_name}: pi0.5 needs {OBS_STATE!r} in the batch")
        tasks = _task_list(batch.get(self.task_key))
        if tasks is None:
            raise ProcessorError(
                f"{self.registry_name}: batch[{self.task_key!r}] must be the task string(s)"
            )
        bins = discretize_state(state.detach().float().cpu().numpy().reshape(len(tasks), -1))
        prompts = []
        for task, row in zip(tasks, bins, strict=True):
            text = task.strip().replace("_", " ").replace("\n", " ")
            prompts.append(f"Task: {text}, State: {' '.join(map(str, row))};\nAction: ")
        out = dict(batch)
        out[self.task_key] = prompts
        return out

    def get_config(self) -> dict[str, Any]:
        return {}  # LeRobot 0.6.1 saves this step's config empty


def pi_processor_steps(config: Any, defaults: Any) -> tuple[list, list]:
    """The pipelines of ``config`` (a PI0Config or PI05Config), module docstring."""
    from lerobot_pipe.policies.pi0.configuration_pi0 import PALIGEMMA_TOKENIZER

    relative = RelativeActionsProcessorStep(
        enabled=config.use_relative_actions,
        exclude_joints=config.relative_exclude_joints,
        action_names=config.action_feature_names,
    )
    tokenizer = TokenizerProcessorStep(
        tokenizer_name=PALIGEMMA_TOKENIZER,
        max_length=config.tokenizer_max_length,
        padding_side="right",
        padding="max_length",
    )
    if config.type == "pi05":
        pre = [
            defaults.rename,
            defaults.to_batch,
            relative,
            defaults.normalize,
            Pi05PrepareStateTokenizerProcessorStep(max_state_dim=config.max_state_dim),
            tokenizer,
            defaults.to_device,
        ]
    else:
        pre = [
            defaults.rename,
            defaults.to_batch,
            Pi0NewLineProcessor(),
            tokenizer,
            defaults.to_device,
            relative,
            defaults.normalize,
        ]
    post = [
        defaults.unnormalize,
        AbsoluteActionsProcessorStep(enabled=config.use_relative_actions),
        defaults.to_cpu,
    ]
    return pre, post
