"""Optimizer and learning-rate scheduler configs: LeRobot's types, names and defaults.

``--optimizer.type`` / ``--scheduler.type`` choose the class (``adam``, ``adamw``, ``sgd``;
``constant_with_warmup``, ``cosine_annealing_with_warmup``, ``cosine_decay_with_warmup``,
``diffuser``); lerobot_pipe.training.optim builds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot_pipe.configs.choice import ChoiceRegistry


@dataclass
class OptimizerConfig(ChoiceRegistry, choice_base=True, choice_kind="optimizer"):
    """``--optimizer.type`` picks the class; LeRobot's names and defaults."""

    default_choice = "adam"

    lr: float = 1e-3
    weight_decay: float = 0.0
    grad_clip_norm: float = 10.0


@OptimizerConfig.register_subclass("adam")
@dataclass
class AdamConfig(OptimizerConfig):
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 10.0


@OptimizerConfig.register_subclass("adamw")
@dataclass
class AdamWConfig(OptimizerConfig):
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 1e-2
    grad_clip_norm: float = 10.0


@OptimizerConfig.register_subclass("sgd")
@dataclass
class SGDConfig(OptimizerConfig):
    lr: float = 1e-3
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    grad_clip_norm: float = 10.0


@dataclass
class SchedulerConfig(ChoiceRegistry, choice_base=True, choice_kind="scheduler"):
    """``--scheduler.type`` picks the class; the scheduler steps once per loop step."""

    num_warmup_steps: int | None = None


@SchedulerConfig.register_subclass("constant_with_warmup")
@dataclass
class ConstantWithWarmupSchedulerConfig(SchedulerConfig):
    """Linear warmup from 0 over ``num_warmup_steps``, then the optimizer's lr."""

    num_warmup_steps: int | None = 1000


@SchedulerConfig.register_subclass("cosine_annealing_with_warmup")
@dataclass
class CosineAnnealingWithWarmupSchedulerConfig(SchedulerConfig):
    """Linear warmup, then cosine annealing to 0 over the remaining steps."""


@SchedulerConfig.register_subclass("cosine_decay_with_warmup")
@dataclass
class CosineDecayWithWarmupSchedulerConfig(SchedulerConfig):
    """Warmup, then cosine decay from ``peak_lr`` to ``decay_lr`` over ``num_decay_steps`` (both
    phases scaled down when the run has fewer steps). Every field is required."""

    num_decay_steps: int | None = None
    peak_lr: float | None = None
    decay_lr: float | None = None


@SchedulerConfig.register_subclass("diffuser")
@dataclass
class DiffuserSchedulerConfig(SchedulerConfig):
    """A schedule of diffusers' ``get_scheduler(name)`` (cosine, linear, constant, ...)."""

    name: str = "cosine"
