"""Optimizer and learning-rate scheduler configs: LeRobot's types, names and defaults.

``--optimizer.type`` / ``--scheduler.type`` choose the class (``adam``, ``adamw``, ``sgd``;
``constant_with_warmup``, ``cosine_annealing_with_warmup``, ``cosine_decay_with_warmup``,
``diffuser``, ``vqbet``); lerobot_pipe.training.optim builds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot_pipe.configs import checks
from lerobot_pipe.configs.choice import ChoiceRegistry
from lerobot_pipe.configs.parser import ConfigError


@dataclass
class OptimizerConfig(ChoiceRegistry, choice_base=True, choice_kind="optimizer"):
    """``--optimizer.type`` picks the class; LeRobot's names and defaults."""

    default_choice = "adam"

    lr: float = 1e-3  # learning rate (a policy's parameter group may set its own)
    weight_decay: float = 0.0  # decoupled for adamw, L2 for adam and sgd
    grad_clip_norm: float = 10.0  # clip the global gradient norm to this (0: no clipping)

    def validate(self) -> None:
        checks.non_negative(
            "optimizer.lr", self.lr, "0 trains nothing: a frozen run, as torch and LeRobot allow"
        )
        checks.non_negative("optimizer.weight_decay", self.weight_decay)
        checks.non_negative("optimizer.grad_clip_norm", self.grad_clip_norm)


@OptimizerConfig.register_subclass("adam")
@dataclass
class AdamConfig(OptimizerConfig):
    """torch.optim.Adam."""

    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam's beta1, beta2
    eps: float = 1e-8  # added to the denominator


@OptimizerConfig.register_subclass("adamw")
@dataclass
class AdamWConfig(OptimizerConfig):
    """torch.optim.AdamW."""

    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam's beta1, beta2
    eps: float = 1e-8  # added to the denominator
    weight_decay: float = 1e-2


@OptimizerConfig.register_subclass("sgd")
@dataclass
class SGDConfig(OptimizerConfig):
    """torch.optim.SGD."""

    momentum: float = 0.0  # momentum factor
    dampening: float = 0.0  # dampening of the momentum
    nesterov: bool = False  # Nesterov momentum


@dataclass
class SchedulerConfig(ChoiceRegistry, choice_base=True, choice_kind="scheduler"):
    """``--scheduler.type`` picks the class; the scheduler steps once per loop step."""

    num_warmup_steps: int | None = None  # loop steps of linear warmup from lr 0

    def validate(self) -> None:
        if self.num_warmup_steps is not None:
            checks.non_negative("scheduler.num_warmup_steps", self.num_warmup_steps)


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

    num_decay_steps: int | None = None  # loop steps of the cosine decay after the warmup
    peak_lr: float | None = None  # lr at the end of the warmup
    decay_lr: float | None = None  # lr at the end of the decay

    def validate(self) -> None:
        super().validate()
        for name in ("num_warmup_steps", "num_decay_steps", "peak_lr", "decay_lr"):
            if getattr(self, name) is None:
                raise ConfigError(f"--scheduler.{name} is required by --scheduler.type={self.type}")
        checks.positive("scheduler.num_decay_steps", self.num_decay_steps)
        checks.positive("scheduler.peak_lr", self.peak_lr)


@SchedulerConfig.register_subclass("diffuser")
@dataclass
class DiffuserSchedulerConfig(SchedulerConfig):
    """A schedule of diffusers' ``get_scheduler(name)`` (cosine, linear, constant, ...)."""

    name: str = "cosine"  # diffusers' schedule name (cosine, linear, constant, ...)


@SchedulerConfig.register_subclass("vqbet")
@dataclass
class VQBeTSchedulerConfig(SchedulerConfig):
    """VQ-BeT's (LeRobot's ``vqbet``): lr constant while the VQ-VAE trains alone, then linear
    warmup and a cosine of ``num_cycles`` periods over the run's remaining steps."""

    num_warmup_steps: int | None = 0
    num_vqvae_training_steps: int = 0  # loop steps that train the VQ-VAE alone
    num_cycles: float = 0.5  # cosine periods after the warmup

    def validate(self) -> None:
        super().validate()
        checks.non_negative("scheduler.num_vqvae_training_steps", self.num_vqvae_training_steps)
