"""Optimizer and LR scheduler from the config (the policy's preset fills unset values)."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from lerobot_pipe.configs.train import OptimizerConfig, SchedulerConfig
from lerobot_pipe.policies.pretrained import PreTrainedConfig


def resolve_optimizer(cfg: OptimizerConfig, policy_cfg: PreTrainedConfig) -> OptimizerConfig:
    """Fill unset lr / weight_decay from the policy's training preset (in place)."""
    preset = policy_cfg.get_optimizer_preset()
    if cfg.lr is None:
        cfg.lr = float(preset["lr"])
    if cfg.weight_decay is None:
        cfg.weight_decay = float(preset.get("weight_decay", 0.0))
    return cfg


def make_optimizer(params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if cfg.type == "adamw":
        return torch.optim.AdamW(
            params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay
        )
    if cfg.type == "adam":
        return torch.optim.Adam(
            params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay
        )
    return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def make_scheduler(
    optimizer: torch.optim.Optimizer, cfg: SchedulerConfig, total_steps: int
) -> LambdaLR | None:
    """Steps once per loop step. Warmup is linear from 0; cosine decays to ``decay_lr``."""
    if cfg.type is None:
        return None
    warmup = cfg.num_warmup_steps
    decay_steps = cfg.num_decay_steps or total_steps
    peak = optimizer.param_groups[0]["lr"]
    floor = cfg.decay_lr / peak if peak > 0 else 0.0

    def constant_with_warmup(step: int) -> float:
        return min(1.0, (step + 1) / (warmup + 1)) if warmup else 1.0

    def cosine_decay_with_warmup(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, decay_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    schedule = {
        "constant_with_warmup": constant_with_warmup,
        "cosine_decay_with_warmup": cosine_decay_with_warmup,
    }
    return LambdaLR(optimizer, schedule[cfg.type])
