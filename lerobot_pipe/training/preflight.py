"""Everything lerobot-train checks and decides before a process group exists (pre-flight).

:func:`make_plan` parses the flags, refuses configuration in the environment, validates every
value and resolves the config once (:func:`resolve_config`: job name, optimizer presets,
precision, output folder, features), resolves the topology for the launched world size, locates
the checkpoint to resume from (:func:`lerobot_pipe.checkpoint.resume.locate`, sizes only) and
opens the dataset. The result is a frozen :class:`TrainingPlan` that nothing edits afterwards. A
bad input fails here, on each rank alone, with a message and without writing anything.
``lerobot-pipe validate`` runs exactly this for the pipeline. One check waits for the process
group, so that the ranks can share it: the SHA-256 of the checkpoint's files
(:meth:`lerobot_pipe.checkpoint.manager.CheckpointManager.verify`), which may fall back to an
older checkpoint: :meth:`TrainingPlan.resuming` then gives the new plan.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lerobot_pipe import constants as C
from lerobot_pipe.checkpoint import resume
from lerobot_pipe.checkpoint.layout import CheckpointError, list_complete_checkpoints
from lerobot_pipe.checkpoint.resume import ResumePoint
from lerobot_pipe.configs.optim import CosineDecayWithWarmupSchedulerConfig
from lerobot_pipe.configs.parser import (
    ConfigError,
    apply_flags,
    from_dict,
    read_json,
    replace,
    split_flags,
)
from lerobot_pipe.configs.train import (
    ACTIVATION_CHECKPOINTING_MODES,
    CHECKPOINT_FORMATS,
    MIXED_PRECISION_CHOICES,
    PEFT_METHODS,
    EMAConfig,
    TrainConfig,
)
from lerobot_pipe.datasets import (
    DatasetError,
    LeRobotDataset,
    episode_frames,
    resolve_dataset_root,
)
from lerobot_pipe.datasets.streaming import StreamingLeRobotDataset
from lerobot_pipe.distributed.env_guard import AccelerateEnvError, check_accelerate_env
from lerobot_pipe.distributed.parallel_dims import ParallelDims, resolve_parallelism
from lerobot_pipe.distributed.runtime import launched_rank
from lerobot_pipe.hub.publish import PublishError
from lerobot_pipe.hub.repo_id import looks_like_repo_id, repo_id_problem
from lerobot_pipe.policies import factory  # noqa: F401 - registers the policy types
from lerobot_pipe.policies.locate import checkpoint_step_dir, local_policy_folder, pretrained_dir
from lerobot_pipe.policies.pretrained import ACTION, OBS_PREFIX, PreTrainedConfig
from lerobot_pipe.policies.vision.imagenet_weights import (
    BackboneWeightsError,
    ensure_backbone_weights,
    offline_requested,
)
from lerobot_pipe.training.heldout import HeldOutSplit, plan_split, train_episode_mask
from lerobot_pipe.training.run_lock import RunLockError, check_run_lock
from lerobot_pipe.training.trackers import TrackerError, wandb_problem

if TYPE_CHECKING:
    from lerobot_pipe.distributed.parallelize import ShardingPlan

log = logging.getLogger(__name__)

# Errors a user can fix; lerobot-train prints them without a traceback.
USER_ERRORS = (
    ConfigError,
    DatasetError,
    CheckpointError,
    AccelerateEnvError,
    RunLockError,
    PublishError,
    TrackerError,
)


@dataclass(frozen=True)
class TrainingPlan:
    """What a run will do, decided once: its resolved config, topology, dataset and the
    checkpoint it resumes from. Never edited: a fallback to another checkpoint is a new plan."""

    cfg: TrainConfig  # resolved (resolve_config): nothing changes it afterwards
    dims: ParallelDims
    dataset: LeRobotDataset
    resume: ResumePoint | None = None
    acknowledged_env: tuple[str, ...] = ()
    # How FSDP2 wraps the policy, checked on the meta device (None unless the run is sharded).
    sharding: ShardingPlan | None = None
    # The held-out episodes and frames of --dataset.eval_split (None without a split).
    heldout: HeldOutSplit | None = None

    @property
    def output_dir(self) -> Path:
        return Path(self.cfg.output_dir)

    @property
    def resume_from(self) -> Path | None:
        return self.resume.step_dir if self.resume else None

    @property
    def start_step(self) -> int:
        return self.resume.step if self.resume else 0

    def resuming(self, point: ResumePoint | None) -> TrainingPlan:
        """This plan resuming from ``point`` instead (the verified checkpoint)."""
        return self if point == self.resume else dataclasses.replace(self, resume=point)

    @property
    def resolved(self) -> dict:
        """What the config resolved to for the launched world size (training_step.json and
        the pipeline's resolved_train_config.json record it)."""
        return {
            "world_size": self.dims.world_size,
            "parallelism": self.dims.to_dict(),
            "mixed_precision": self.cfg.accelerator.mixed_precision,
            "dataset_root": str(self.dataset.root),
            "effective_batch_size": self.cfg.batch_size
            * self.dims.dp_world_size
            * self.cfg.accelerator.gradient_accumulation.steps,
        }


def parse_train_config(argv: list[str]) -> tuple[TrainConfig, Path | None]:
    """Flags -> TrainConfig. ``--config_path`` (a train_config.json, a checkpoint folder or its
    pretrained_model/, or a Hub repo id holding ``checkpoints/<step>/``) loads a saved config
    first; flags override it, ``--field=null`` resets a field to its default. Returns the config
    and the checkpoint step folder ``--config_path`` pointed into (if any)."""
    flags = split_flags(argv)
    config_path = flags.pop("config_path", None)
    source_step: Path | None = None
    if config_path is not None:
        path = _config_file(config_path, flags.get("output_dir"))
        data = read_json(path, "--config_path")
        cfg = from_dict(TrainConfig, _upgrade_legacy(data), lenient=True)
        source_step = checkpoint_step_dir(path.parent)
    else:
        cfg = TrainConfig()

    policy_path = flags.pop("policy.path", None)
    if policy_path is not None:
        revision = flags.get("policy.pretrained_revision")
        try:
            local = local_policy_folder(policy_path, revision=revision)
            loaded = PreTrainedConfig.from_pretrained(local)
        except (ValueError, OSError) as e:
            raise ConfigError(f"--policy.path={policy_path}: {e}") from None
        policy_type = flags.get("policy.type")
        if policy_type is not None and policy_type != loaded.type:
            raise ConfigError(
                f"--policy.type={policy_type} contradicts --policy.path={policy_path} "
                f"(a {loaded.type} policy); drop one of them"
            )
        cfg.policy = loaded
        cfg.policy.pretrained_path = str(local)
    apply_flags(cfg, flags)
    if cfg.policy is not None and cfg.peft is None and policy_path is not None:
        # Fine-tuning a LoRA checkpoint without --peft trains its merged weights in full.
        cfg.policy.use_peft = False
    if cfg.policy is not None:
        try:
            cfg.policy.__post_init__()
        except ValueError as e:
            raise ConfigError(f"--policy.*: {e}") from None
    return cfg, source_step


def _upgrade_legacy(data: dict) -> dict:
    """lerobot_pipe's train_config.json before it was LeRobot's: ``resolved`` beside the config,
    disabled groups as objects with a null choice, optimizer values null for the preset."""
    data = dict(data)
    data.pop("resolved", None)
    if isinstance(data.get("scheduler"), dict) and data["scheduler"].get("type") is None:
        data["scheduler"] = None
    if isinstance(data.get("peft"), dict) and data["peft"].get("method_type", "LORA") is None:
        data["peft"] = None
    optimizer = data.get("optimizer")
    if isinstance(optimizer, dict) and None in (optimizer.get("lr"), optimizer.get("weight_decay")):
        data["optimizer"] = None
    return data


def _config_file(config_path: str, output_dir: str | None) -> Path:
    """The train_config.json that --config_path names. A Hub repo id (LeRobot's
    ``--save_checkpoint_to_hub`` layout) has its newest ``checkpoints/<step>/`` downloaded into
    the run's output folder first, as LeRobot does."""
    path = Path(config_path)
    if path.is_dir():
        return pretrained_dir(path) / C.TRAIN_CONFIG_NAME
    if not looks_like_repo_id(config_path):
        return path
    from lerobot_pipe.policies.locate import download_latest_checkpoint

    if output_dir is None:
        raise ConfigError(
            f"--config_path={config_path}: resuming from a Hub repository needs --output_dir "
            "(where its newest checkpoint is downloaded and the run continues)"
        )
    try:
        step_dir = download_latest_checkpoint(config_path, Path(output_dir))
    except (ValueError, OSError) as e:
        raise ConfigError(f"--config_path={config_path}: {e}") from None
    return step_dir / C.PRETRAINED_MODEL_DIR / C.TRAIN_CONFIG_NAME


def _positive(name: str, value: int | float) -> None:
    if value <= 0:
        raise ConfigError(f"--{name}={value}: must be > 0")


def _choice(name: str, value: object, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"--{name}={value!r}: choose one of {', '.join(map(str, choices))}")


def validate_config(cfg: TrainConfig) -> TrainConfig:
    """Value checks that need nothing but the config; returns it resolved (a new value, the
    argument is left as it was): the job name, the optimizer and scheduler presets, and with
    PEFT ``policy.use_peft`` (config.json then tells LeRobot to load the adapter)."""
    if cfg.policy is None:
        raise ConfigError(
            "no policy: pass --policy.type=act (or --policy.path=<pretrained folder or repo id>)"
        )
    if cfg.dataset.root is None and cfg.dataset.repo_id is None:
        raise ConfigError(
            "no dataset: pass --dataset.root=<folder> and/or --dataset.repo_id=<namespace/name>"
        )
    _validate_streaming(cfg)
    _positive("steps", cfg.steps)
    _positive("batch_size", cfg.batch_size)
    _positive("log_freq", cfg.log_freq)
    if cfg.save_freq < 0:
        raise ConfigError(
            f"--save_freq={cfg.save_freq}: must be >= 0 (0 saves only the final step)"
        )
    if cfg.checkpoint_keep_last < 0:
        raise ConfigError(
            f"--checkpoint_keep_last={cfg.checkpoint_keep_last}: must be >= 0 (0 keeps every "
            "checkpoint)"
        )
    if cfg.num_workers < 0:
        raise ConfigError(f"--num_workers={cfg.num_workers}: must be >= 0")
    if cfg.seed < 0:
        raise ConfigError(f"--seed={cfg.seed}: must be >= 0")
    _choice("checkpoint_format", cfg.checkpoint_format, CHECKPOINT_FORMATS)
    _choice("accelerator.mixed_precision", cfg.accelerator.mixed_precision, MIXED_PRECISION_CHOICES)
    _choice(
        "accelerator.activation_checkpointing.mode",
        cfg.accelerator.activation_checkpointing.mode,
        ACTIVATION_CHECKPOINTING_MODES,
    )
    optimizer, scheduler = _validate_optimization(cfg)
    _refuse_unbuilt(cfg)
    _validate_env_eval(cfg)
    ga = cfg.accelerator.gradient_accumulation.steps
    _positive("accelerator.gradient_accumulation.steps", ga)
    if cfg.save_freq % ga:
        raise ConfigError(
            f"--save_freq={cfg.save_freq} must be a multiple of "
            f"--accelerator.gradient_accumulation.steps={ga} so checkpoints fall on optimizer updates"
        )
    if cfg.steps % ga:
        raise ConfigError(
            f"--steps={cfg.steps} must be a multiple of --accelerator.gradient_accumulation.steps={ga} "
            "(--steps counts micro-batches; the last one must end an optimizer update)"
        )
    if cfg.peft is not None:
        _choice("peft.method_type", cfg.peft.method_type, PEFT_METHODS)
        _positive("peft.r", cfg.peft.r)
        if not cfg.policy.pretrained_path:
            raise ConfigError(
                "--peft.* fine-tunes a pretrained policy: pass --policy.path=<base policy>"
            )
        if cfg.policy.use_peft and not cfg.resume:
            raise ConfigError(
                f"--policy.path={cfg.policy.pretrained_path} holds LoRA adapters already: continue "
                "that run with --resume=true, or drop --peft.* to fine-tune the merged policy"
            )
        if not 0 <= cfg.peft.lora_dropout < 1:
            raise ConfigError(f"--peft.lora_dropout={cfg.peft.lora_dropout}: must be in [0, 1)")
    if cfg.rename_map and not cfg.policy.pretrained_path:
        raise ConfigError(
            "--rename_map renames a dataset's keys onto those a pretrained policy expects: it "
            "needs --policy.path (a fresh policy takes its feature names from the dataset)"
        )
    if cfg.policy.push_to_hub:
        _check_publishable(cfg)
    _validate_ema(cfg.ema)
    _validate_heldout(cfg)
    if cfg.job_name is not None and ("/" in cfg.job_name or cfg.job_name.startswith(".")):
        raise ConfigError(
            f"--job_name={cfg.job_name!r}: must be a plain name (no '/', not starting with '.')"
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
    policy = cfg.policy
    if cfg.peft is not None and not policy.use_peft:
        policy = replace(policy, use_peft=True)
    return replace(
        cfg,
        # LeRobot's rule (train_config.json then records the name).
        job_name=cfg.job_name or cfg.policy.type,
        optimizer=optimizer,
        scheduler=scheduler,
        policy=policy,
    )


def _validate_ema(ema: EMAConfig) -> None:
    """LeRobot main's checks of ``--ema.*`` (its EMAConfig.__post_init__), as one-line errors."""
    if not 0.0 <= ema.min_decay <= ema.max_decay <= 1.0:
        raise ConfigError(
            f"--ema.min_decay={ema.min_decay} --ema.max_decay={ema.max_decay}: need "
            "0 <= min_decay <= max_decay <= 1"
        )
    if ema.inv_gamma <= 0:
        raise ConfigError(f"--ema.inv_gamma={ema.inv_gamma}: must be > 0")
    if ema.power <= 0:
        raise ConfigError(f"--ema.power={ema.power}: must be > 0")
    if ema.update_after_step < 0:
        raise ConfigError(f"--ema.update_after_step={ema.update_after_step}: must be >= 0")
    if ema.decay is None:
        return
    if not 0.0 <= ema.decay <= 1.0:
        raise ConfigError(f"--ema.decay={ema.decay}: must be in [0, 1]")
    defaults = EMAConfig()
    if (ema.min_decay, ema.max_decay) != (defaults.min_decay, defaults.max_decay):
        raise ConfigError(
            f"--ema.decay={ema.decay} (a constant decay) and --ema.min_decay / --ema.max_decay "
            "(the schedule's bounds) exclude each other: set one or the other"
        )


def _validate_streaming(cfg: TrainConfig) -> None:
    data = cfg.dataset
    if data.streaming and data.repo_id is None:
        raise ConfigError(
            "--dataset.streaming=true reads a Hub dataset: pass --dataset.repo_id=<namespace/name>"
            " (a local --dataset.root is read without streaming)"
        )
    if not data.streaming_cache_mb > 0:
        raise ConfigError(
            f"--dataset.streaming_cache_mb={data.streaming_cache_mb}: must be positive (MiB of "
            "files each rank keeps)"
        )
    _positive("dataset.streaming_shuffle_buffer", data.streaming_shuffle_buffer)


def _validate_heldout(cfg: TrainConfig) -> None:
    """LeRobot 0.6.1's checks of the held-out loss's flags (its DatasetConfig and
    TrainPipelineConfig ``__post_init__``), plus negative values refused as typos."""
    split = cfg.dataset.eval_split
    if not 0.0 <= split < 1.0:
        raise ConfigError(
            f"--dataset.eval_split={split}: must be in [0, 1) (the share of each task's "
            "episodes held out; 0 holds none out)"
        )
    if cfg.eval_steps < 0:
        raise ConfigError(f"--eval_steps={cfg.eval_steps}: must be >= 0 (0 never evaluates)")
    if cfg.max_eval_samples < 0:
        raise ConfigError(
            f"--max_eval_samples={cfg.max_eval_samples}: must be >= 0 (0 evaluates every "
            "held-out frame)"
        )
    if cfg.eval_steps > 0 and split == 0.0:
        raise ConfigError(
            f"--eval_steps={cfg.eval_steps} evaluates on held-out episodes: it needs "
            "--dataset.eval_split > 0 (e.g. 0.1 holds out the last tenth of each task's episodes)"
        )
    if cfg.eval_steps > 0:
        from lerobot_pipe.policies.factory import get_policy_class

        forward = inspect.signature(get_policy_class(cfg.policy.type).forward)
        if "reduction" not in forward.parameters:
            raise ConfigError(
                f"--eval_steps={cfg.eval_steps}: policy {cfg.policy.type!r} defines no "
                'per-sample loss (forward(batch, reduction="none")), which the held-out loss '
                "needs; pass --eval_steps=0"
            )


def _validate_env_eval(cfg: TrainConfig) -> None:
    """``--env_eval_freq`` with ``--env.*`` (evaluation/in_training.py). A batch larger than the
    episodes is cut to them (LeRobot 0.6.1's EvalConfig rule); an environment that would never be
    rolled out is refused as a mistake."""
    if cfg.env_eval_freq < 0:
        raise ConfigError(f"--env_eval_freq={cfg.env_eval_freq}: must be >= 0 (0 never evaluates)")
    if cfg.env is None:
        return
    if cfg.env_eval_freq == 0:
        raise ConfigError(
            f"--env.type={cfg.env.type} is rolled out every --env_eval_freq steps, and "
            "--env_eval_freq=0 never does: pass --env_eval_freq=N, or leave --env.* out"
        )
    if cfg.eval.n_episodes < 1:
        raise ConfigError(f"--eval.n_episodes={cfg.eval.n_episodes}: at least 1")
    if cfg.eval.batch_size < 0:
        raise ConfigError(f"--eval.batch_size={cfg.eval.batch_size}: 0 (auto) or more")
    if cfg.env_eval_freq > cfg.steps:
        log.warning(
            "--env_eval_freq=%d is more than --steps=%d: --env.type=%s is never rolled out",
            cfg.env_eval_freq,
            cfg.steps,
            cfg.env.type,
        )


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
    ema_repo = f"{repo_id}{C.EMA_REPO_SUFFIX}"
    if cfg.ema.enable and repo_id_problem(ema_repo):
        raise ConfigError(
            f"--policy.repo_id={repo_id}: the EMA policy is published to {ema_repo}, "
            f"{repo_id_problem(ema_repo)}; choose a shorter name"
        )
    if cfg.checkpoint_format == "dcp":
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


def _validate_optimization(cfg: TrainConfig) -> tuple:
    """LeRobot's rule: with ``use_policy_training_preset`` (the default) a new run trains with the
    policy's optimizer and scheduler presets; without it both must be given. Returns the
    optimizer and scheduler configs the run trains with."""
    optimizer, scheduler = cfg.optimizer, cfg.scheduler
    if cfg.use_policy_training_preset and (not cfg.resume or cfg.optimizer is None):
        if not cfg.resume and (cfg.optimizer is not None or cfg.scheduler is not None):
            log.warning(
                "--optimizer.* / --scheduler.* are replaced by the policy's presets because "
                "--use_policy_training_preset=true (LeRobot's rule); set the policy's own fields "
                "(e.g. --policy.optimizer_lr) or pass --use_policy_training_preset=false"
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
    opt = optimizer
    _positive("optimizer.lr", opt.lr)
    if opt.weight_decay < 0:
        raise ConfigError(f"--optimizer.weight_decay={opt.weight_decay}: must be >= 0")
    if opt.grad_clip_norm < 0:
        raise ConfigError(f"--optimizer.grad_clip_norm={opt.grad_clip_norm}: must be >= 0")
    sched = scheduler
    if sched is None:
        return optimizer, scheduler
    if sched.num_warmup_steps is not None and sched.num_warmup_steps < 0:
        raise ConfigError(f"--scheduler.num_warmup_steps={sched.num_warmup_steps}: must be >= 0")
    if isinstance(sched, CosineDecayWithWarmupSchedulerConfig):
        for name in ("num_warmup_steps", "num_decay_steps", "peak_lr", "decay_lr"):
            if getattr(sched, name) is None:
                raise ConfigError(
                    f"--scheduler.{name} is required by --scheduler.type={sched.type}"
                )
        _positive("scheduler.num_decay_steps", sched.num_decay_steps)
        _positive("scheduler.peak_lr", sched.peak_lr)
    if sched.type == "diffuser":
        from lerobot_pipe.training.optim import check_diffuser_schedule

        check_diffuser_schedule(sched)
    return optimizer, scheduler


def _refuse_unbuilt(cfg: TrainConfig) -> None:
    """LeRobot fields whose behaviour lerobot_pipe does not build: their defaults are accepted
    (and kept in train_config.json); a value asking for the missing behaviour is refused."""
    unbuilt = [
        (
            "eval.recording",
            cfg.env is not None and cfg.eval.recording,
            "recording the rollouts as a dataset is not built",
        ),
        ("reward_model", cfg.reward_model is not None, "reward-model training is not built"),
        ("sample_weighting", cfg.sample_weighting is not None, "sample weighting is not built"),
        (
            "job.target",
            cfg.job.target not in (None, "local"),
            "HF Jobs submission is not built; "
            "run the pipeline under SLURM (workflow/profiles/slurm) instead",
        ),
        (
            "dataset.repo_type",
            cfg.dataset.repo_type != "dataset",
            "only dataset repositories (repo_type=dataset) are read",
        ),
        (
            "save_checkpoint_to_hub",
            cfg.save_checkpoint_to_hub,
            "push checkpoints with the "
            "pipeline's publish stage (publish.steps: all) or lerobot-convert-dcp --push_to_hub",
        ),
    ]
    for flag, asked, why in unbuilt:
        if asked:
            raise ConfigError(f"--{flag}: {why}")


def default_output_dir(cfg: TrainConfig) -> Path:
    now = datetime.now()
    name = cfg.job_name or cfg.policy.type
    return Path("outputs/train") / now.strftime("%Y-%m-%d") / f"{now.strftime('%H-%M-%S')}_{name}"


def _resolve_topology(cfg: TrainConfig, world_size: int) -> ParallelDims:
    """The degrees for this world size; on a resume (whose degrees may come from the saved
    train_config.json) the error says which flags fit the processes launched now."""
    try:
        return resolve_parallelism(cfg.parallelism, world_size)
    except ConfigError as e:
        if not cfg.resume:
            raise
        reset = (
            " --parallelism.dp_replicate=null"
            if cfg.parallelism.dp_replicate not in (None, 1)
            else ""
        )
        if world_size == 1:
            fix = f"--parallelism.dp_shard=1{reset}"
        else:
            fix = f"--parallelism.dp_shard=-1{reset} (FSDP2 over all {world_size} processes)"
        raise ConfigError(f"{e}; to resume on {world_size} process(es) pass {fix}") from None


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


def make_plan(
    argv: list[str], world_size: int, env: Mapping[str, str] = os.environ
) -> TrainingPlan:
    """The whole pre-flight of lerobot-train for ``world_size`` processes (module docstring)."""
    acknowledged = check_accelerate_env(env)
    cfg, source_step = parse_train_config(argv)
    cfg = resolve_config(cfg)
    dims = _resolve_topology(cfg, world_size)
    if cfg.peft is not None and cfg.checkpoint_format != "safetensors" and not dims.is_sharded:
        raise ConfigError(
            "--checkpoint_format=dcp needs a sharded run (--parallelism.dp_shard > 1) with PEFT"
        )
    output_dir = Path(cfg.output_dir)
    if launched_rank(env) == 0:
        # A trainer still running on this folder is the first thing to know (the pipeline's
        # validate job says it too); train() takes the lock for real.
        check_run_lock(output_dir)
    point = resume_point(cfg, source_step)
    if cfg.dataset.streaming:
        dataset = open_streaming_dataset(cfg, point, launched_rank(env))
        return plan_on_dataset(cfg, dims, dataset, point, env, tuple(acknowledged))
    dataset_root = resolve_dataset_root(
        cfg.dataset.root, cfg.dataset.repo_id, cfg.dataset.revision, episodes=cfg.dataset.episodes
    )
    dataset = LeRobotDataset(
        dataset_root,
        delta_timestamps=_delta_timestamps(cfg.policy, dataset_root),
        episodes=cfg.dataset.episodes,
        video_backend=cfg.dataset.video_backend,
        tolerance_s=cfg.tolerance_s,
        image_transforms=cfg.dataset.image_transforms,
        use_imagenet_stats=cfg.dataset.use_imagenet_stats,
    )
    return plan_on_dataset(cfg, dims, dataset, point, env, tuple(acknowledged))


def open_streaming_dataset(
    cfg: TrainConfig, point: ResumePoint | None, rank: int
) -> StreamingLeRobotDataset:
    """--dataset.streaming=true: the Hub dataset at the commit the run started on (the
    checkpoint's, on resume), cached per rank under --dataset.root or HF_HOME."""
    from huggingface_hub import constants as hub_constants

    revision = cfg.dataset.revision
    if point is not None:
        saved = point.step_dir / C.TRAINING_STATE_DIR / C.STREAM_STATE
        if saved.is_file():
            revision = read_json(saved, "stream state")["revision"]
    folder = (
        Path(cfg.dataset.root).expanduser()
        if cfg.dataset.root
        else Path(hub_constants.HF_HOME) / "lerobot_pipe_streaming" / cfg.dataset.repo_id
    )
    dataset = StreamingLeRobotDataset(
        cfg.dataset.repo_id,
        folder / f"rank-{rank}",
        revision=revision,
        cache_mb=cfg.dataset.streaming_cache_mb,
        episodes=cfg.dataset.episodes,
        video_backend=cfg.dataset.video_backend,
        tolerance_s=cfg.tolerance_s,
        image_transforms=cfg.dataset.image_transforms,
        use_imagenet_stats=cfg.dataset.use_imagenet_stats,
    )
    dataset.delta_timestamps = _delta_timestamps(cfg.policy, dataset.root) or {}
    return dataset


def resume_point(cfg: TrainConfig, source_step: Path | None) -> ResumePoint | None:
    """The checkpoint a ``--resume=true`` run continues from (the resolver's first step: sizes
    only), None for a fresh run; a fresh run refuses a folder that holds checkpoints."""
    output_dir = Path(cfg.output_dir)
    if not cfg.resume:
        if list_complete_checkpoints(output_dir) or (output_dir / C.CHECKPOINTS_DIR).exists():
            raise ConfigError(
                f"--output_dir={output_dir} already holds checkpoints and --resume is false; pass "
                "--resume=true to continue that run, or choose another --output_dir"
            )
        return None
    return resume.require(output_dir, source_step, cfg.policy.type)


def plan_on_dataset(
    cfg: TrainConfig,
    dims: ParallelDims,
    dataset: LeRobotDataset,
    point: ResumePoint | None,
    env: Mapping[str, str] = os.environ,
    acknowledged: tuple[str, ...] = (),
) -> TrainingPlan:
    """The plan's last checks, those that need the dataset: the policy's features (filled in
    from the dataset) and sharding on the meta device, the backbone weights, the batch size."""
    policy, sharding = check_policy_plan(cfg, dims, dataset)
    cfg = replace(cfg, policy=policy)
    check_backbone_weights(cfg, env)
    if cfg.env is not None:
        from lerobot_pipe.evaluation.in_training import check_env

        try:
            check_env(cfg.env, cfg.policy, cfg.rename_map)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    try:
        heldout = plan_split(dataset, cfg.dataset.eval_split, cfg.max_eval_samples)
    except ValueError as e:
        raise ConfigError(f"{e} ({dataset.root})") from None
    drawable = sample_indices(cfg.policy, dataset, heldout)
    n_drawable = len(dataset) if drawable is None else len(drawable)
    if n_drawable < cfg.batch_size * dims.dp_world_size:
        log.warning(
            "the dataset has %d frames to sample, fewer than one global batch (%d); samples "
            "repeat within a step",
            n_drawable,
            cfg.batch_size * dims.dp_world_size,
        )
    return TrainingPlan(
        cfg=cfg,
        dims=dims,
        dataset=dataset,
        resume=point,
        acknowledged_env=acknowledged,
        sharding=sharding,
        heldout=heldout,
    )


def _delta_timestamps(policy: PreTrainedConfig, root: Path) -> dict[str, list[float]] | None:
    """LeRobot's resolve_delta_timestamps: the action window from the policy's
    ``action_delta_indices``, every ``observation.*`` feature's (cameras included) from its
    ``observation_delta_indices``, in seconds at the dataset's fps."""
    info = read_json(root / C.DATASET_INFO, "dataset info")
    fps = info.get("fps")
    if not isinstance(fps, int | float) or fps <= 0:
        raise DatasetError(f"{root / C.DATASET_INFO}: 'fps' must be a positive number, got {fps!r}")
    windows = {}
    for key in info.get("features", {}):
        if key == ACTION:
            indices = policy.action_delta_indices
        elif key.startswith(OBS_PREFIX):
            indices = policy.observation_delta_indices
        else:
            continue
        if indices is not None:
            windows[key] = [i / fps for i in indices]
    return windows or None


def sample_indices(
    policy: PreTrainedConfig, dataset: LeRobotDataset, heldout: HeldOutSplit | None = None
) -> np.ndarray | None:
    """The dataset positions the sampler draws from: every frame of the training episodes
    (all but those ``heldout`` holds out), or, for a policy with a ``drop_n_last_frames`` field
    (LeRobot's convention, e.g. Diffusion Policy), each one's frames but its last
    ``drop_n_last_frames``. None means every frame. ConfigError when no frame is left."""
    drop = getattr(policy, "drop_n_last_frames", 0) or 0
    keep = train_episode_mask(dataset, heldout)
    if not drop and keep is None:
        return None
    starts, ends = dataset.episode_bounds
    if keep is not None:
        starts, ends = starts[keep], ends[keep]
    try:
        return episode_frames(starts, ends, drop_n_last_frames=drop)
    except ValueError as e:
        raise ConfigError(f"--policy.drop_n_last_frames={drop} on {dataset.root}: {e}") from None


def check_policy_plan(
    cfg: TrainConfig, dims: ParallelDims, dataset: LeRobotDataset
) -> tuple[PreTrainedConfig, ShardingPlan | None]:
    """The policy's config with its features filled in from the dataset (a copy), and the
    policy built from it on the meta device with its PEFT wrapper, so that anything wrong with
    them (features, LoRA targets) fails before launch; for a sharded run, its sharding planned
    there too (wrap units, tied parameters, ignored modules, precision policy): the launch
    applies that plan instead of deciding again."""
    import torch

    from lerobot_pipe.distributed.parallelize import plan_sharding
    from lerobot_pipe.policies.factory import fill_features, get_policy_class
    from lerobot_pipe.policies.peft import apply_peft

    policy = copy.deepcopy(cfg.policy)
    try:
        fill_features(policy, dataset.features)
    except ValueError as e:
        raise ConfigError(
            f"policy {cfg.policy.type!r} cannot train on {dataset.root}: {e}"
        ) from None
    policy_cls = get_policy_class(cfg.policy.type)
    with torch.device("meta"):
        try:
            model = policy_cls(policy, pretrained_parts=False)
        except ImportError as e:  # an optional dependency of the policy (diffusers)
            raise ConfigError(f"--policy.type={cfg.policy.type}: {e}") from None
        if cfg.peft is not None:
            try:
                model = apply_peft(model, cfg.peft, cfg.policy.pretrained_path)
            except ValueError as e:
                raise ConfigError(str(e)) from None
    if not dims.is_sharded:
        return policy, None
    return policy, plan_sharding(model, cfg.accelerator, policy_cls._fsdp_wrap_modules)


def check_backbone_weights(cfg: TrainConfig, env: Mapping[str, str]) -> None:
    """A new run of a camera policy starts its backbone from ``pretrained_backbone_weights``:
    make sure torchvision's file is in the torch.hub cache, downloading it on local rank 0 (the
    other ranks build their model after the process-group rendezvous, when it is there), and
    fail here when it cannot be had. A resumed or fine-tuned run reads every weight from its
    checkpoint and needs no file."""
    policy = cfg.policy
    weights = getattr(policy, "pretrained_backbone_weights", None)
    if not weights or not policy.image_features or cfg.resume or policy.pretrained_path:
        return
    try:
        ensure_backbone_weights(
            policy.vision_backbone,
            weights,
            offline=offline_requested(env),
            download=int(env.get("LOCAL_RANK", "0")) == 0,
        )
    except BackboneWeightsError as e:
        raise ConfigError(f"--policy.pretrained_backbone_weights={weights}: {e}") from None
