"""What a checkpoint holds: the run's state as ``Stateful`` parts (torchtitan's "states").

Every part follows torch's ``Stateful`` protocol (``state_dict()`` / ``load_state_dict()``),
and the checkpoint manager saves and loads through exactly these calls: the scheduler and the
grad scaler are torch's own; :class:`ModelState` and :class:`OptimizerState` read and set the
wrapped model and its optimizer through ``torch.distributed.checkpoint.state_dict`` (each rank's
shards, or gathered whole: whatever the wrapping, DDP, FSDP2, HSDP); :class:`RNGState` is this
process's generators; :class:`TrainProgress` is where the run is (loop steps and the data
position); ``ema`` is the EMA shadow (``--ema.*``: training's ``EMAState``, which this package
knows only as :class:`EMAShadow`). ``pretrained`` writes the ``pretrained_model/`` folder
LeRobot's tools load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from lerobot_pipe.checkpoint.layout import CheckpointError
from lerobot_pipe.checkpoint.lerobot_state import (
    capture_rng_state,
    keep_implementation,
    restore_rng_state,
)

# A trainable parameter that no step has given a gradient yet has no optimizer state to save
# (LeRobot's vqbet trains only its VQ-VAE for its first steps): loaded as it was, without state.
_OPTIMIZER_LOAD = StateDictOptions(strict=False)


def _full_options(**kwargs: Any) -> StateDictOptions:
    return StateDictOptions(full_state_dict=True, **kwargs)


@dataclass
class ModelState(Stateful):
    """The policy as the loop calls it (wrapped for the topology). ``state_dict`` is this rank's
    part (its shards when sharded: what DCP saves); :meth:`full_state_dict` the whole fp32 state
    on the main rank (a collective)."""

    module: nn.Module
    # PEFT: adapter_model.safetensors' peft names -> this model's keys (loading adapters only).
    adapter_key_map: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.module)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_model_state_dict(self.module, state_dict)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: every tensor whole, on CPU, on the main rank (empty elsewhere)."""
        if not dist.is_initialized():
            return {k: v.detach().cpu() for k, v in get_model_state_dict(self.module).items()}
        return get_model_state_dict(self.module, options=_full_options(cpu_offload=True))

    def load_full_state_dict(self, full: dict[str, torch.Tensor], *, strict: bool = True) -> None:
        """Collective: set every rank's part from the main rank's whole ``full`` (other ranks
        pass an empty dict)."""
        options = _full_options(broadcast_from_rank0=dist.is_initialized(), strict=strict)
        try:
            set_model_state_dict(self.module, full, options=options)
        except (RuntimeError, KeyError) as e:
            raise CheckpointError(f"checkpoint weights do not fit this model: {e}") from None


@dataclass
class OptimizerState(Stateful):
    """The optimizer of :class:`ModelState`'s module, keyed by parameter name."""

    model: ModelState
    optimizer: torch.optim.Optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model.module, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        keep_implementation(
            self.optimizer,
            lambda: set_optimizer_state_dict(
                self.model.module, self.optimizer, state_dict, options=_OPTIMIZER_LOAD
            ),
        )

    def full_state_dict(self) -> dict[str, Any]:
        """Collective: the whole state on the main rank (empty elsewhere)."""
        if not dist.is_initialized():
            return self.state_dict()
        options = _full_options(cpu_offload=True)
        return get_optimizer_state_dict(self.model.module, self.optimizer, options=options)

    def load_full_state_dict(self, full: dict[str, Any]) -> None:
        """Collective: set every rank's part from the main rank's whole ``full``."""
        options = _full_options(broadcast_from_rank0=dist.is_initialized(), strict=False)
        keep_implementation(
            self.optimizer,
            lambda: set_optimizer_state_dict(
                self.model.module, self.optimizer, full, options=options
            ),
        )


class RNGState(Stateful):
    """This process's Python, NumPy, torch (and CUDA) generators."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        return capture_rng_state()

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        restore_rng_state(state_dict)


@dataclass
class TrainProgress(Stateful):
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


class EMAShadow(Protocol):
    """What a checkpoint saves and restores of an EMA of the weights (training's ``EMAState``):
    an fp32 shadow of the trainable parameters by state-dict name (this rank's shards when
    sharded) and its update count. A checkpoint holds the shadow as the EMA policy's weights
    (``pretrained_model_ema/``) and the count as ``ema_state.json``."""

    shadow: dict[str, torch.Tensor]

    def counters(self) -> dict:
        """ema_state.json's values."""

    def load_counters(self, saved: dict) -> None: ...

    def reset(self) -> None:
        """The shadow from the live weights, the count at 0."""

    def weights(
        self, model_state: dict[str, torch.Tensor], shadow: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """The EMA policy's state dict: ``model_state`` with the shadow in place."""

    def full_shadow(self) -> dict[str, torch.Tensor] | None:
        """Collective: the whole shadow on the main rank (None elsewhere)."""

    def load_full_shadow(self, full: dict[str, torch.Tensor] | None) -> None:
        """Collective: every rank's shadow from the main rank's whole tensors."""

    def problems_with(self, full: dict[str, torch.Tensor]) -> str | None:
        """Why ``full`` cannot be this shadow, or None."""

    def from_lerobot(self, saved: dict) -> dict[str, torch.Tensor]:
        """LeRobot main's ema_state.pt as whole tensors by name (ValueError if it does not fit)."""


#: What a checkpoint holds, as the checkpoint manager takes it (torchtitan's ``states``: a name ->
#: a ``Stateful`` part), and where each part goes in LeRobot's layout of ``checkpoints/<step>/``.
#: The names are :class:`TrainState`'s fields; ``model``, ``optimizer`` and ``pretrained`` are
#: required, the others optional.
STATES: dict[str, str] = {
    "model": "pretrained_model/model.safetensors (sharded: pretrained_model/pytorch_model_fsdp_0/)",
    "optimizer": "training_state/optimizer_state.safetensors + optimizer_param_groups.json "
    "(sharded: training_state/optimizer_0/)",
    "pretrained": "pretrained_model/config.json, train_config.json, the processors",
    "scheduler": "training_state/scheduler_state.json",
    "scaler": "training_state/scaler_state.json (fp16)",
    "rng": "training_state/rng_state.safetensors (every rank's, the main rank's under LeRobot's names)",
    "progress": "training_state/training_step.json (step, samples consumed)",
    "ema": "pretrained_model_ema/ + training_state/ema_state.json",
    "stream": "training_state/stream_state.json (streaming)",
}
_REQUIRED = ("model", "optimizer", "pretrained")


@dataclass
class TrainState:
    """Everything a checkpoint saves and restores: :data:`STATES` as a typed record (each part
    has its own files, so the writer and the loader address them by name)."""

    model: ModelState
    optimizer: OptimizerState
    pretrained: PretrainedWriter
    scheduler: Stateful | None = None
    scaler: torch.amp.GradScaler | None = None
    rng: RNGState = field(default_factory=RNGState)
    progress: TrainProgress = field(default_factory=TrainProgress)
    ema: EMAShadow | None = None  # with --ema.enable=true
    stream: Stateful | None = None  # with --dataset.streaming=true (datasets/stream_sampler.py)

    @classmethod
    def from_states(cls, states: Mapping[str, Any]) -> TrainState:
        """The record of a ``states`` mapping (:data:`STATES`' names; None for an absent part).
        ValueError for a name it does not know or a required part missing."""
        unknown = sorted(set(states) - set(STATES))
        missing = [name for name in _REQUIRED if states.get(name) is None]
        if unknown or missing:
            raise ValueError(
                f"checkpoint states: unknown {unknown}, missing {missing}; "
                f"a checkpoint holds {sorted(STATES)}"
            )
        if not isinstance(states["model"], ModelState) or not isinstance(
            states["optimizer"], OptimizerState
        ):
            raise ValueError(
                "checkpoint states: 'model' is a ModelState, 'optimizer' an OptimizerState"
            )
        return cls(**{name: part for name, part in states.items() if part is not None})

    @property
    def saves_scaler(self) -> bool:
        return self.scaler is not None and self.scaler.is_enabled()


def train_states(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    pretrained: PretrainedWriter,
    *,
    adapter_key_map: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    **parts: Any,
) -> dict[str, Any]:
    """The ``states`` mapping of a wrapped model and its optimizer (the other parts by name)."""
    model = ModelState(module, adapter_key_map)
    return {
        "model": model,
        "optimizer": OptimizerState(model, optimizer),
        "pretrained": pretrained,
        **parts,
    }
