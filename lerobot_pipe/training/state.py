"""What a checkpoint holds: one object that gives and takes the run's whole state.

:class:`TrainState` is what :class:`~lerobot_pipe.training.checkpointer.Checkpointer` saves and
:func:`~lerobot_pipe.training.checkpoint.load_checkpoint` restores (torchtitan's "states"). Its
parts follow torch's ``Stateful`` protocol (``state_dict()`` / ``load_state_dict()``): the
scheduler and the grad scaler are torch's own, :class:`RNGState` and :class:`Progress` are
this module's. Model and optimizer are read and set through
``torch.distributed.checkpoint.state_dict`` (sharded or gathered, whatever the wrapping: DDP,
FSDP2, HSDP), which is why they are kept as they are. ``pretrained`` writes the
``pretrained_model/`` folder LeRobot's tools load (config.json, weights, processors,
train_config.json).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful

from lerobot_pipe.training.checkpoint import capture_rng_state, restore_rng_state


class RNGState(Stateful):
    """This process's Python, NumPy, torch (and CUDA) generators."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        return capture_rng_state()

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        restore_rng_state(state_dict)


@dataclass
class Progress(Stateful):
    """Where the run is: loop steps done and global samples consumed (the data position)."""

    step: int = 0
    samples_consumed: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "samples_consumed": self.samples_consumed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])
        self.samples_consumed = int(state_dict["samples_consumed"])


class PretrainedWriter(Protocol):
    def __call__(self, directory: Path, full_state: dict[str, torch.Tensor] | None) -> None:
        """Write config.json, the weights (from ``full_state``, the gathered fp32 state dict,
        when given), the processors and train_config.json into ``directory``. Called on the
        main process only, possibly in a background thread: it must read nothing the training
        loop changes except through ``full_state``."""


@dataclass
class TrainState:
    """Everything a checkpoint saves and restores."""

    model: nn.Module  # as the loop calls it: wrapped for the topology
    optimizer: torch.optim.Optimizer
    pretrained: PretrainedWriter
    scheduler: Stateful | None = None
    scaler: torch.amp.GradScaler | None = None
    rng: RNGState = field(default_factory=RNGState)
    progress: Progress = field(default_factory=Progress)
    # PEFT: adapter_model.safetensors' peft names -> this model's keys (loading adapters only).
    adapter_key_map: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None

    @property
    def saves_scaler(self) -> bool:
        return self.scaler is not None and self.scaler.is_enabled()
