"""What LeRobot fills in before training: the policy's optimizer and scheduler presets (its
``use_policy_training_preset`` rule), the job name, PEFT's ``use_peft``."""

from __future__ import annotations

import logging

from lerobot_pipe.configs.optim import OptimizerConfig, SchedulerConfig
from lerobot_pipe.configs.parser import ConfigError, replace
from lerobot_pipe.configs.train import TrainConfig

log = logging.getLogger(__name__)


def optimization(cfg: TrainConfig) -> tuple[OptimizerConfig, SchedulerConfig | None]:
    """The optimizer and scheduler the run trains with, checked. LeRobot's rule: with
    ``use_policy_training_preset`` (the default) a new run takes the policy's presets;
    without it both must be given."""
    optimizer, scheduler = cfg.optimizer, cfg.scheduler
    if cfg.use_policy_training_preset and (not cfg.resume or cfg.optimizer is None):
        if not cfg.resume and (cfg.optimizer is not None or cfg.scheduler is not None):
            log.warning(
                "--optimizer.* / --scheduler.* are replaced by the policy's presets because "
                "--use_policy_training_preset=true (LeRobot's rule); set the policy's own "
                "fields (e.g. --policy.optimizer_lr) or pass --use_policy_training_preset=false"
            )
        optimizer = cfg.policy.get_optimizer_preset()
        scheduler = cfg.policy.get_scheduler_preset()
    elif cfg.optimizer is None:
        raise ConfigError(
            "--use_policy_training_preset=false needs --optimizer.type (adam, adamw, sgd) and "
            "--scheduler.type (e.g. constant_with_warmup)"
        )
    elif cfg.scheduler is None and not cfg.resume:
        raise ConfigError(
            "--use_policy_training_preset=false needs --scheduler.type too (LeRobot's rule); "
            "--scheduler.type=constant_with_warmup --scheduler.num_warmup_steps=0 keeps the lr"
        )
    optimizer.validate()
    if scheduler is not None:
        scheduler.validate()
    return optimizer, scheduler


def with_presets(cfg: TrainConfig) -> TrainConfig:
    """``cfg``, validated, with what LeRobot fills in before training (a new value):
    the job name, the optimizer and scheduler presets, and with PEFT ``policy.use_peft``
    (config.json then tells LeRobot to load the adapter)."""
    cfg.validate()
    optimizer, scheduler = optimization(cfg)
    policy = cfg.policy
    if cfg.peft is not None and not policy.use_peft:
        policy = replace(policy, use_peft=True)
    return replace(
        cfg,
        job_name=cfg.job_name or cfg.policy.type,  # train_config.json records it
        optimizer=optimizer,
        scheduler=scheduler,
        policy=policy,
    )
