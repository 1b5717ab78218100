"""Optimizer and LR scheduler from their configs, with LeRobot's arithmetic.

The schedulers are ``LambdaLR`` multipliers of each group's lr, stepped once per loop step, with
LeRobot's formulas, so the same flags give the same learning rates and a scheduler_state.json
moves between the two.
"""

from __future__ import annotations

import logging
import math

import torch
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from lerobot_pipe.configs.optim import (
    AdamConfig,
    AdamWConfig,
    ConstantWithWarmupSchedulerConfig,
    CosineAnnealingWithWarmupSchedulerConfig,
    CosineDecayWithWarmupSchedulerConfig,
    DiffuserSchedulerConfig,
    OptimizerConfig,
    SchedulerConfig,
    SGDConfig,
    VQBeTSchedulerConfig,
)
from lerobot_pipe.configs.parser import ConfigError

log = logging.getLogger(__name__)


def make_optimizer(
    param_groups: list[dict], cfg: OptimizerConfig, *, fused: bool = True
) -> torch.optim.Optimizer:
    """``param_groups`` as ``policy.get_optim_params()`` returns them (a group's own ``lr`` wins).

    Adam and AdamW use torch's fused kernel wherever torch has one for the parameters (CPU and
    CUDA, floating dtypes, DTensors too): one pass over each parameter instead of ~10 elementwise
    ops each (LeRobot builds them with torch's default, the per-tensor loop on CPU). The update
    is the same formula; its last bits may differ from the loop's. A group that mixes DTensors
    with plain tensors (modules FSDP2 ignores) keeps the loop: the fused op takes one kind.
    ``fused=False`` keeps it everywhere: the fp16 grad scaler (FSDP2's ShardedGradScaler hands
    the fused kernel a ``found_inf`` of shape (1,) that it cannot subtract from its step counts).
    Measured in docs/benchmarks.md §9 ("The optimizer step")."""
    if isinstance(cfg, AdamWConfig | AdamConfig):
        cls = torch.optim.AdamW if isinstance(cfg, AdamWConfig) else torch.optim.Adam
        groups = _materialized(param_groups)
        kwargs = dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
        if not fused:
            return cls(groups, **kwargs)
        try:
            return cls(groups, fused=True, **kwargs)
        except RuntimeError as e:  # a device or dtype without a fused kernel
            log.info("%s without torch's fused kernel: %s", cls.__name__, e)
            return cls(groups, **kwargs)
    if isinstance(cfg, SGDConfig):
        return torch.optim.SGD(
            param_groups,
            lr=cfg.lr,
            momentum=cfg.momentum,
            dampening=cfg.dampening,
            nesterov=cfg.nesterov,
            weight_decay=cfg.weight_decay,
        )
    raise ConfigError(f"--optimizer.type={cfg.type}: not supported")


def _materialized(param_groups) -> list[dict]:
    """Groups as lists (a second constructor call sees them again), each fused only where its
    parameters are all DTensors or all plain tensors."""
    groups = list(param_groups)
    if groups and not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    out = []
    for group in groups:
        params = list(group["params"])
        uniform = len({isinstance(p, DTensor) for p in params}) <= 1
        out.append({**group, "params": params, **({} if uniform else {"fused": False})})
    return out


def _constant_with_warmup(warmup: int):
    def multiplier(step: int) -> float:
        return step / max(1, warmup) if step < warmup else 1.0

    return multiplier


def _cosine_annealing_with_warmup(warmup: int, total_steps: int):
    def multiplier(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total_steps - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return multiplier


def _cosine_decay_with_warmup(cfg: CosineDecayWithWarmupSchedulerConfig, total_steps: int):
    warmup, decay = cfg.num_warmup_steps, cfg.num_decay_steps
    if total_steps < decay:  # LeRobot scales both phases into a shorter run
        scale = total_steps / decay
        warmup, decay = int(warmup * scale), total_steps
        log.info("LR schedule scaled to %d steps: warmup %d, decay %d", total_steps, warmup, decay)
    floor = cfg.decay_lr / cfg.peak_lr

    def multiplier(step: int) -> float:
        if step < warmup:
            if step <= 0:
                return 1 / (warmup + 1)
            return (1 / (warmup + 1) - 1) * (1 - step / warmup) + 1
        cosine = 0.5 * (1 + math.cos(math.pi * min(step, decay) / decay))
        return (1 - floor) * cosine + floor

    return multiplier


def _vqbet(cfg: VQBeTSchedulerConfig, total_steps: int):
    warmup, vqvae = cfg.num_warmup_steps or 0, cfg.num_vqvae_training_steps

    def multiplier(step: int) -> float:
        if step < vqvae:
            return 1.0
        step -= vqvae
        if step < warmup:
            return step / max(1, warmup)
        # As LeRobot's: the cosine's length is the run's steps less the warmup (not the VQ-VAE's).
        progress = (step - warmup) / max(1, total_steps - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * cfg.num_cycles * 2.0 * progress)))

    return multiplier


def check_diffuser_schedule(cfg: DiffuserSchedulerConfig) -> None:
    """Fail before launch when diffusers (which provides these schedules) is missing."""
    try:
        from diffusers.optimization import SchedulerType
    except ImportError:
        raise ConfigError(
            "--scheduler.type=diffuser needs the diffusers package: pip install diffusers"
        ) from None
    names = [t.value for t in SchedulerType]
    if cfg.name not in names:
        raise ConfigError(f"--scheduler.name={cfg.name!r}: choose one of {', '.join(names)}")


def make_scheduler(
    optimizer: torch.optim.Optimizer, cfg: SchedulerConfig | None, total_steps: int
) -> LambdaLR | None:
    if cfg is None:
        return None
    if isinstance(cfg, DiffuserSchedulerConfig):
        from diffusers.optimization import get_scheduler

        return get_scheduler(
            cfg.name,
            optimizer=optimizer,
            num_warmup_steps=cfg.num_warmup_steps,
            num_training_steps=total_steps,
        )
    if isinstance(cfg, ConstantWithWarmupSchedulerConfig):
        multiplier = _constant_with_warmup(cfg.num_warmup_steps or 0)
    elif isinstance(cfg, CosineAnnealingWithWarmupSchedulerConfig):
        multiplier = _cosine_annealing_with_warmup(cfg.num_warmup_steps or 0, total_steps)
    elif isinstance(cfg, CosineDecayWithWarmupSchedulerConfig):
        multiplier = _cosine_decay_with_warmup(cfg, total_steps)
    elif isinstance(cfg, VQBeTSchedulerConfig):
        multiplier = _vqbet(cfg, total_steps)
    else:
        raise ConfigError(f"--scheduler.type={cfg.type}: not supported")
    return LambdaLR(optimizer, multiplier)
