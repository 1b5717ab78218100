"""The config as lerobot-train trains with it: :func:`lerobot_pipe.configs.presets.with_presets` (every value
check, LeRobot's presets), then the checks that need more than the config (the policy's code,
installed packages, the Hub token, the tracker's login), then what depends on the machine
(``use_amp`` as a precision, the default output folder). Nothing here starts a process group."""

from __future__ import annotations

import inspect
from datetime import datetime
from pathlib import Path

from lerobot_pipe.configs.checkpoint_format import CheckpointFormat
from lerobot_pipe.configs.parser import ConfigError, replace
from lerobot_pipe.configs.presets import with_presets
from lerobot_pipe.configs.train import TrainConfig
from lerobot_pipe.hub.publish import ema_repo_id
from lerobot_pipe.policies.factory import get_policy_class
from lerobot_pipe.training.optim import check_diffuser_schedule
from lerobot_pipe.training.trackers import wandb_problem
from lerobot_pipe.utils.repo_id import repo_id_problem


def validate_config(cfg: TrainConfig) -> TrainConfig:
    """Every check that needs nothing but the config and this installation; returns the config
    with LeRobot's presets filled in (a new value, the argument is left as it was)."""
    cfg = with_presets(cfg)
    if cfg.scheduler is not None and cfg.scheduler.type == "diffuser":
        check_diffuser_schedule(cfg.scheduler)
    if cfg.policy.push_to_hub:
        _check_publishable(cfg)
    if cfg.eval_steps > 0:
        policy_cls = get_policy_class(cfg.policy)
        forward = inspect.signature(getattr(policy_cls, "upstream_forward", policy_cls.forward))
        if "reduction" not in forward.parameters:
            raise ConfigError(
                f"--eval_steps={cfg.eval_steps}: policy {cfg.policy.type!r} defines no "
                'per-sample loss (forward(batch, reduction="none")), which the held-out loss '
                "needs; pass --eval_steps=0"
            )
    if cfg.trackio.enable:
        try:
            import trackio  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--trackio.enable=true needs the trackio package: pip install 'lerobot_pipe[trackio]'"
            ) from None
    problem = wandb_problem(cfg.wandb)
    if problem:
        raise ConfigError(problem)
    return cfg


def _check_publishable(cfg: TrainConfig) -> None:
    """--policy.push_to_hub publishes the final checkpoint after training: everything it needs
    is checked now, not after the last step. The token is only looked up (no request)."""
    repo_id = cfg.policy.repo_id
    if not repo_id:
        raise ConfigError("--policy.push_to_hub=true needs --policy.repo_id=<namespace/name>")
    problem = repo_id_problem(repo_id)
    if problem:
        raise ConfigError(f"--policy.repo_id: {problem}")
    problem = cfg.policy.publish_problem()
    if problem:
        raise ConfigError(f"--policy.push_to_hub=true: {problem}")
    ema_repo = ema_repo_id(repo_id)
    if cfg.ema.enable and repo_id_problem(ema_repo):
        raise ConfigError(
            f"--policy.repo_id={repo_id}: the EMA policy is published to {ema_repo}, "
            f"{repo_id_problem(ema_repo)}; choose a shorter name"
        )
    if cfg.checkpoint_format is CheckpointFormat.DCP:
        raise ConfigError(
            "--policy.push_to_hub=true publishes model.safetensors, which "
            "--checkpoint_format=dcp does not write: pass --checkpoint_format=safetensors_dcp "
            "(or safetensors), or publish later after lerobot-convert-dcp"
        )
    if not cfg.save_checkpoint:
        raise ConfigError(
            "--policy.push_to_hub=true publishes the final checkpoint: it needs "
            "--save_checkpoint=true"
        )
    from huggingface_hub import get_token

    if get_token() is None:
        raise ConfigError(
            f"--policy.push_to_hub=true: no Hugging Face token to push {repo_id} with; set "
            "HF_TOKEN or run `hf auth login` (write access to the repository)"
        )


def default_output_dir(cfg: TrainConfig) -> Path:
    now = datetime.now()
    name = cfg.job_name or cfg.policy.type
    return Path("outputs/train") / now.strftime("%Y-%m-%d") / f"{now.strftime('%H-%M-%S')}_{name}"


def resolve_config(cfg: TrainConfig) -> TrainConfig:
    """:func:`validate_config`, then what depends on the machine: LeRobot's ``use_amp`` as a
    mixed precision, and the default output folder. The config the run trains with."""
    cfg = validate_config(cfg)
    mixed_precision = cfg.accelerator.mixed_precision
    if cfg.policy.use_amp and mixed_precision == "no":
        # LeRobot's use_amp: torch.autocast's default dtype of the device (fp16 CUDA, bf16 CPU).
        import torch

        device_type = "cuda" if torch.cuda.is_available() else "cpu"
        autocast = torch.get_autocast_dtype(device_type)
        mixed_precision = "fp16" if autocast == torch.float16 else "bf16"
    return replace(
        cfg,
        accelerator=replace(cfg.accelerator, mixed_precision=mixed_precision),
        output_dir=str(cfg.output_dir or default_output_dir(cfg)),
    )
