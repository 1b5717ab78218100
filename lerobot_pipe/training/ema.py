"""The exponential moving average (EMA) of the policy's weights: ``--ema.*``, LeRobot main's flags
(after 0.6.1) with diffusers' ``EMAModel`` rule, on every topology.

The rule, per optimizer update ``n`` (1, 2, ...; micro-batches of an accumulation do not count):
``t = max(0, n - update_after_step - 1)``; the decay is 0 while ``t <= 0`` (the shadow becomes a
copy of the weights), else ``1 - (1 + t / inv_gamma) ** -power`` clamped to ``[min_decay,
max_decay]``, or the constant ``--ema.decay`` when set (LeRobot pins both bounds to it); then
``shadow <- shadow + (1 - decay) * (weights - shadow)``.

What the shadow holds: an fp32 copy of each *trainable* parameter (bf16 or fp16 parameters too),
keyed by the model's state-dict names. The EMA policy is the live model with those replaced:
its buffers are the live ones (not averaged), its frozen parameters the live ones (diffusers
copies them at every update: the same values). With LoRA the shadow is the adapters' size.
Under FSDP2 / HSDP each shadow tensor is a DTensor with its parameter's placements: this rank
keeps the shard it holds of the parameter (1/N of the memory), updates it locally (no
communication) and DCP saves it as shards. LeRobot main keeps a whole copy on its main process
and refuses sharding and PEFT.

A skipped fp16 step (the grad scaler found inf/NaN gradients and left the weights alone) still
counts as an update, as in LeRobot (its ``ema.step`` follows every optimizer step call): the
shadow moves towards the unchanged weights, and the count stays the number of optimizer updates
the loop ran, which keeps the schedule in step with LeRobot's and asks no host synchronisation.

Checkpoints (:mod:`lerobot_pipe.checkpoint.writer`): the EMA policy is written as
``pretrained_model_ema/`` beside ``pretrained_model/`` (LeRobot main's layout: a loadable
policy folder), its weights in the checkpoint's format (``model.safetensors``, the adapter, or
DCP shards); those fp32 weights are the shadow a resume continues from, with the update count in
``training_state/ema_state.json``. A LeRobot main run's ``training_state/ema_state.pt`` is read
with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor, distribute_tensor

from lerobot_pipe.configs.train import EMAConfig

log = logging.getLogger(__name__)


def ema_decay(cfg: EMAConfig, optimization_step: int) -> float:
    """The decay of update ``optimization_step`` (counted from 1): diffusers' ``get_decay``."""
    t = max(0, optimization_step - cfg.update_after_step - 1)
    if t <= 0:
        return 0.0
    low, high = (cfg.min_decay, cfg.max_decay) if cfg.decay is None else (cfg.decay, cfg.decay)
    return max(min(1 - (1 + t / cfg.inv_gamma) ** -cfg.power, high), low)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _mesh_device(t: DTensor) -> torch.device:
    """Where the collectives of ``t``'s mesh run (its local tensor is on the CPU with FSDP2's
    CPU offload, the mesh on the accelerator)."""
    local = _local(t).device
    return (
        local
        if local.type == t.device_mesh.device_type
        else torch.device(t.device_mesh.device_type)
    )


class EMAState(Stateful):
    """The shadow of ``module``'s trainable parameters (``module`` is the policy, or its PEFT
    wrapper: sharded in place by FSDP2, not the DDP wrapper) and the number of updates."""

    def __init__(self, module: nn.Module, cfg: EMAConfig) -> None:
        self.cfg = cfg
        self.params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        # The names of every parameter in LeRobot's order (module.parameters()): ema_state.pt's.
        self.all_names = [n for n, _ in module.named_parameters()]
        with torch.no_grad():
            self.shadow = {
                n: p.detach().to(dtype=torch.float32, copy=True) for n, p in self.params.items()
            }
        self.optimization_step = 0
        self.decay = 0.0  # the last update's

    @torch.no_grad()
    def update(self) -> None:
        """After an optimizer update: fold the live weights into the shadow (no collective)."""
        self.optimization_step += 1
        self.decay = ema_decay(self.cfg, self.optimization_step)
        for name, shadow in self.shadow.items():
            live = _local(self.params[name])
            if self.decay == 0.0:
                _local(shadow).copy_(live)
            else:
                _local(shadow).lerp_(live.to(torch.float32), 1.0 - self.decay)

    def reset(self) -> None:
        """The shadow from the live weights, the count at 0 (a resume without a saved shadow)."""
        with torch.no_grad():
            for name, shadow in self.shadow.items():
                _local(shadow).copy_(_local(self.params[name]))
        self.optimization_step = 0
        self.decay = 0.0

    def local_bytes(self) -> int:
        """Bytes of shadow this rank holds (its shards when sharded)."""
        return sum(_local(t).numel() * _local(t).element_size() for t in self.shadow.values())

    # ------------------------------------------------------------------ Stateful

    def counters(self) -> dict:
        """ema_state.json: the update count (the shadow itself is the EMA policy's weights)."""
        return {"optimization_step": self.optimization_step, "decay": self.decay}

    def load_counters(self, saved: dict) -> None:
        self.optimization_step = int(saved["optimization_step"])
        self.decay = float(saved.get("decay", ema_decay(self.cfg, self.optimization_step)))

    def state_dict(self) -> dict:
        """The count and this rank's shadow (DTensor shards when sharded): live references."""
        return {**self.counters(), "shadow": self.shadow}

    def load_state_dict(self, state_dict: dict) -> None:
        with torch.no_grad():
            for name, value in state_dict["shadow"].items():
                if value is not self.shadow[name]:
                    _local(self.shadow[name]).copy_(_local(value))
        self.load_counters(state_dict)

    def weights(
        self, model_state: dict[str, torch.Tensor], shadow: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """The EMA policy's state dict: ``model_state`` (the live one, this rank's part or whole)
        with ``shadow`` (this rank's, or :meth:`full_shadow`'s) in place of the trained
        parameters."""
        shadow = self.shadow if shadow is None else shadow
        unknown = sorted(set(shadow) - set(model_state))
        if unknown:  # the parameters' names are the state dict's keys on every topology
            raise KeyError(f"EMA shadow keys missing from the model's state dict: {unknown[:3]}")
        return {**model_state, **shadow}

    def full_shadow(self) -> dict[str, torch.Tensor] | None:
        """Collective on the training group: every shadow tensor whole, on CPU, on the main rank
        (None elsewhere)."""
        main = not dist.is_initialized() or dist.get_rank() == 0
        full = {}
        for name, t in self.shadow.items():
            whole = t.to(_mesh_device(t)).full_tensor() if isinstance(t, DTensor) else t
            if main:
                full[name] = whole.detach().cpu()
        return full if main else None

    def load_full_shadow(self, full: dict[str, torch.Tensor] | None) -> None:
        """Collective: set every rank's shadow from the main rank's whole tensors (``full``,
        whose keys were checked there; None elsewhere)."""
        distributed = dist.is_initialized()
        with torch.no_grad():
            for name, t in self.shadow.items():
                device = _mesh_device(t) if isinstance(t, DTensor) else _local(t).device
                if full is not None:
                    whole = full[name].to(device=device, dtype=torch.float32)
                else:
                    whole = torch.empty(t.shape, dtype=torch.float32, device=device)
                if isinstance(t, DTensor):
                    whole = distribute_tensor(whole, t.device_mesh, t.placements, src_data_rank=0)
                elif distributed:
                    dist.broadcast(whole, src=0)
                _local(t).copy_(_local(whole))

    def problems_with(self, full: dict[str, torch.Tensor]) -> str | None:
        """Why ``full`` (whole tensors by name) cannot be this shadow, or None."""
        missing = sorted(set(self.shadow) - set(full))
        if missing:
            return f"no weights for {len(missing)} trained parameter(s), e.g. {missing[:3]}"
        for name, t in self.shadow.items():
            if tuple(full[name].shape) != tuple(t.shape):
                return f"{name} has shape {tuple(full[name].shape)}, the model {tuple(t.shape)}"
        return None

    def from_lerobot(self, saved: dict) -> dict[str, torch.Tensor]:
        """LeRobot main's ema_state.pt (diffusers' EMAModel.state_dict(): ``shadow_params`` in
        the order of the policy's parameters(), frozen ones included) as whole tensors by name;
        its update count is taken too. ValueError when it does not fit this model."""
        shadow = saved.get("shadow_params")
        if not isinstance(shadow, list) or len(shadow) != len(self.all_names):
            raise ValueError(
                f"shadow_params holds {len(shadow) if isinstance(shadow, list) else 'no'} "
                f"tensors, the policy has {len(self.all_names)} parameters"
            )
        self.load_counters({"optimization_step": saved.get("optimization_step", 0)})
        return dict(zip(self.all_names, shadow, strict=True))


@contextlib.contextmanager
def evaluation_weights(ema: EMAState | None, use_for_eval: bool = True) -> Iterator[None]:
    """The weights to evaluate a policy with (the hook for evaluation, issue #22): inside, the
    trainable parameters hold the EMA weights when ``ema`` is kept and ``use_for_eval`` (else the
    live ones, untouched); the live values are restored exactly on exit. Every rank swaps its own
    shards (no collective), so an evaluation under FSDP2 runs on every rank as training does.
    The held-out loss uses the live weights, as LeRobot's."""
    if ema is None or not use_for_eval:
        yield
        return
    with torch.no_grad():
        saved = {n: _local(p).clone() for n, p in ema.params.items()}
        for name, p in ema.params.items():
            _local(p).copy_(_local(ema.shadow[name]))
    try:
        yield
    finally:
        with torch.no_grad():
            for name, p in ema.params.items():
                _local(p).copy_(saved[name])
