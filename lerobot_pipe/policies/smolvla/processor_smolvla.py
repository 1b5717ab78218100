"""SmolVLA's language steps: LeRobot 0.6.1's ``smolvla_new_line_processor`` and
``tokenizer_processor`` (same registry names, config keys and outputs), so the pipelines saved
here load in LeRobot's ``make_pre_post_processors`` and LeRobot's load here.

The task strings travel in the flat batch under ``"task"`` (a string, or one per sample); the
tokenizer step writes ``observation.language.tokens`` (int64) and
``observation.language.attention_mask`` (bool), on the device of the batch's other tensors (and,
as LeRobot, ``observation.language.subtask.*`` for a batch that carries ``"subtask"`` strings).
transformers is imported only when a tokenizer step is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lerobot_pipe.configs.types import (
    ACTION,
    OBS_LANGUAGE_ATTENTION_MASK,
    OBS_LANGUAGE_PREFIX,
    OBS_LANGUAGE_TOKENS,
    OBS_PREFIX,
)
from lerobot_pipe.processors.pipeline import Batch, ProcessorError, ProcessorStep, register_step

OBS_LANGUAGE_SUBTASK_TOKENS = OBS_LANGUAGE_PREFIX + "subtask.tokens"
OBS_LANGUAGE_SUBTASK_ATTENTION_MASK = OBS_LANGUAGE_PREFIX + "subtask.attention_mask"
TRANSFORMERS_HINT = "SmolVLA needs transformers: pip install 'lerobot_pipe[smolvla]'"


def _task_list(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and all(isinstance(t, str) for t in value):
        return list(value)
    return None


@register_step
class NewLineTaskProcessorStep(ProcessorStep):
    """Ends each task string with a newline (the prompt format SmolVLA was trained on)."""

    registry_name = "smolvla_new_line_processor"

    def __call__(self, batch: Batch) -> Batch:
        task = batch.get("task")
        if task is None:
            return batch
        out = dict(batch)
        if isinstance(task, str):
            out["task"] = task if task.endswith("\n") else task + "\n"
        elif _task_list(task) is not None:
            out["task"] = [t if t.endswith("\n") else t + "\n" for t in task]
        return out


def load_tokenizer(name: str) -> Any:
    """transformers' AutoTokenizer for ``name`` (a local folder or a Hub id, through
    huggingface_hub's cache)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise ImportError(TRANSFORMERS_HINT) from err
    try:
        return AutoTokenizer.from_pretrained(name)
    except OSError as err:
        if Path(name).expanduser().exists():
            raise
        # Gated repositories (PaliGemma's tokenizer) need the license accepted and a token.
        raise OSError(
            f"cannot load the tokenizer {name!r}: {err}\nIf it is a gated Hub repository, "
            f"accept its license at https://huggingface.co/{name} and log in with "
            "`hf auth login` (or set HF_TOKEN); offline, it must already be in the Hub cache "
            "(HF_HUB_CACHE)"
        ) from err


@register_step
class TokenizerProcessorStep(ProcessorStep):
    """Tokenizes ``batch[task_key]`` with the tokenizer named ``tokenizer_name``."""

    registry_name = "tokenizer_processor"

    def __init__(
        self,
        tokenizer_name: str | None = None,
        max_length: int = 512,
        task_key: str = "task",
        padding_side: str = "right",
        padding: str = "max_length",
        truncation: bool = True,
        tokenizer: Any = None,
    ) -> None:
        if tokenizer is None and tokenizer_name is None:
            raise ProcessorError("tokenizer_processor needs a tokenizer_name")
        self.tokenizer_name = tokenizer_name
        self.max_length = int(max_length)
        self.task_key = task_key
        self.padding_side = padding_side
        self.padding = padding
        self.truncation = bool(truncation)
        self._given = tokenizer is not None
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(tokenizer_name)

    def __call__(self, batch: Batch) -> Batch:
        if self.task_key not in batch:
            raise ProcessorError(
                f"tokenizer_processor: the batch has no {self.task_key!r} (the task strings); "
                f"it has {sorted(batch)}"
            )
        tasks = _task_list(batch[self.task_key])
        if tasks is None:
            raise ProcessorError(
                f"tokenizer_processor: batch[{self.task_key!r}] must be a string or a list of "
                f"strings, got {type(batch[self.task_key]).__name__}"
            )
        device = _batch_device(batch)
        out = dict(batch)
        out[OBS_LANGUAGE_TOKENS], out[OBS_LANGUAGE_ATTENTION_MASK] = self._encode(tasks, device)
        subtasks = _task_list(batch.get("subtask"))
        if subtasks is not None:
            tokens, mask = self._encode(subtasks, device)
            out[OBS_LANGUAGE_SUBTASK_TOKENS], out[OBS_LANGUAGE_SUBTASK_ATTENTION_MASK] = (
                tokens,
                mask,
            )
        return out

    def _encode(self, texts: list[str], device: torch.device) -> tuple[Tensor, Tensor]:
        encoded = self.tokenizer(
            texts,
            max_length=self.max_length,
            truncation=self.truncation,
            padding=self.padding,
            padding_side=self.padding_side,
            return_tensors="pt",
        )
        return (
            encoded["input_ids"].to(device),
            encoded["attention_mask"].to(device, torch.bool),
        )

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "max_length": self.max_length,
            "task_key": self.task_key,
            "padding_side": self.padding_side,
            "padding": self.padding,
            "truncation": self.truncation,
        }
        if self.tokenizer_name is not None and not self._given:
            config["tokenizer_name"] = self.tokenizer_name
        return config


def _batch_device(batch: Batch) -> torch.device:
    """Where the batch's observations are (else its action; else the CPU)."""
    for key, value in batch.items():
        if key.startswith(OBS_PREFIX) and isinstance(value, Tensor):
            return value.device
    action = batch.get(ACTION)
    return action.device if isinstance(action, Tensor) else torch.device("cpu")
