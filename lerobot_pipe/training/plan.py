"""Everything lerobot-train decides before a process group exists.

:func:`make_plan` parses the flags, refuses configuration in the environment, validates every
value, resolves the topology for the launched world size, locates and checks the checkpoint to
resume from and opens the dataset. A bad input fails here, on each rank alone, with a message and
without writing anything. ``lerobot-pipe validate`` runs exactly this for the pipeline. One
check waits for the process group, so that the ranks can share it: :func:`verify_resume`, the
SHA-256 of the checkpoint's files (here only their sizes are checked).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lerobot_pipe import constants as C
from lerobot_pipe.configs.optim import CosineDecayWithWarmupSchedulerConfig
from lerobot_pipe.configs.parser import (
    ConfigError,
    apply_flags,
    from_dict,
    read_json,
    split_flags,
)
from lerobot_pipe.configs.train import (
    CHECKPOINT_FORMATS,
    MIXED_PRECISION_CHOICES,
    PEFT_METHODS,
    TrainConfig,
)
from lerobot_pipe.datasets import (
    DatasetError,
    LeRobotDataset,
    episode_frames,
    resolve_dataset_root,
)
from lerobot_pipe.distributed.env_guard import AccelerateEnvError, check_accelerate_env
from lerobot_pipe.distributed.parallel_dims import ParallelDims, resolve_parallelism
from lerobot_pipe.distributed.runtime import launched_rank
from lerobot_pipe.policies import factory  # noqa: F401 - registers the policy types
from lerobot_pipe.policies.hub import checkpoint_step_dir, local_policy_folder, pretrained_dir
from lerobot_pipe.policies.pretrained import ACTION, OBS_PREFIX, PreTrainedConfig
from lerobot_pipe.policies.vision.imagenet_weights import (
    BackboneWeightsError,
    ensure_backbone_weights,
    offline_requested,
)
from lerobot_pipe.training.checkpoint import (
    CheckpointError,
    checkpoints_dir,
    list_complete_checkpoints,
    newest_usable_checkpoint,
    read_training_step,
    validate_checkpoint_layout,
    verify_checkpoint_split,
)
from lerobot_pipe.training.run_lock import RunLockError, check_run_lock

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from lerobot_pipe.distributed.parallelize import ShardingPlan

log = logging.getLogger(__name__)

# Errors a user can fix; lerobot-train prints them without a traceback.
USER_ERRORS = (ConfigError, DatasetError, CheckpointError, AccelerateEnvError, RunLockError)


@dataclass
class TrainingPlan:
    cfg: TrainConfig
    dims: ParallelDims
    dataset: LeRobotDataset
    output_dir: Path
    resume_from: Path | None = None
    resume_info: dict | None = None
    acknowledged_env: list[str] = field(default_factory=list)
    # --config_path named the checkpoint: it must verify (an automatic resume falls back).
    resume_explicit: bool = False
    # How FSDP2 wraps the policy, checked on the meta device (None unless the run is sharded).
    sharding: ShardingPlan | None = None

    @property
    def start_step(self) -> int:
        return self.resume_info["step"] if self.resume_info else 0

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
    if path.exists() or config_path.startswith((".", "/")) or config_path.count("/") != 1:
        return path
    from lerobot_pipe.policies.hub import download_latest_checkpoint

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


def validate_config(cfg: TrainConfig) -> None:
    """Value checks that need nothing but the config."""
    if cfg.policy is None:
        raise ConfigError(
            "no policy: pass --policy.type=act (or --policy.path=<pretrained folder or repo id>)"
        )
    if cfg.dataset.root is None and cfg.dataset.repo_id is None:
        raise ConfigError(
            "no dataset: pass --dataset.root=<folder> and/or --dataset.repo_id=<namespace/name>"
        )
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
    _validate_optimization(cfg)
    _refuse_unbuilt(cfg)
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
    if cfg.policy.push_to_hub and not cfg.policy.repo_id:
        raise ConfigError("--policy.push_to_hub=true needs --policy.repo_id=<namespace/name>")
    if cfg.job_name is not None and ("/" in cfg.job_name or cfg.job_name.startswith(".")):
        raise ConfigError(
            f"--job_name={cfg.job_name!r}: must be a plain name (no '/', not starting with '.')"
        )
    if not cfg.job_name:  # LeRobot's rule (train_config.json then records the name)
        cfg.job_name = cfg.policy.type
    if cfg.trackio.enable:
        try:
            import trackio  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--trackio.enable=true needs the trackio package: pip install 'lerobot_pipe[trackio]'"
            ) from None


def _validate_optimization(cfg: TrainConfig) -> None:
    """LeRobot's rule: with ``use_policy_training_preset`` (the default) a new run trains with the
    policy's optimizer and scheduler presets; without it both must be given."""
    if cfg.use_policy_training_preset and (not cfg.resume or cfg.optimizer is None):
        if not cfg.resume and (cfg.optimizer is not None or cfg.scheduler is not None):
            log.warning(
                "--optimizer.* / --scheduler.* are replaced by the policy's presets because "
                "--use_policy_training_preset=true (LeRobot's rule); set the policy's own fields "
                "(e.g. --policy.optimizer_lr) or pass --use_policy_training_preset=false"
            )
        cfg.optimizer = cfg.policy.get_optimizer_preset()
        cfg.scheduler = cfg.policy.get_scheduler_preset()
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
    opt = cfg.optimizer
    _positive("optimizer.lr", opt.lr)
    if opt.weight_decay < 0:
        raise ConfigError(f"--optimizer.weight_decay={opt.weight_decay}: must be >= 0")
    if opt.grad_clip_norm < 0:
        raise ConfigError(f"--optimizer.grad_clip_norm={opt.grad_clip_norm}: must be >= 0")
    sched = cfg.scheduler
    if sched is None:
        return
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


def _refuse_unbuilt(cfg: TrainConfig) -> None:
    """LeRobot fields whose behaviour lerobot_pipe does not build: their defaults are accepted
    (and kept in train_config.json); a value asking for the missing behaviour is refused."""
    unbuilt = [
        (
            "env",
            cfg.env is not None,
            "simulation environments are not run here; evaluate a "
            "checkpoint with LeRobot's lerobot-eval",
        ),
        ("reward_model", cfg.reward_model is not None, "reward-model training is not built"),
        ("sample_weighting", cfg.sample_weighting is not None, "sample weighting is not built"),
        (
            "wandb.enable",
            cfg.wandb.enable,
            "W&B logging is not built; use --trackio.enable=true "
            "(Hugging Face's offline-capable tracker)",
        ),
        (
            "job.target",
            cfg.job.target not in (None, "local"),
            "HF Jobs submission is not built; "
            "run the pipeline under SLURM (workflow/profiles/slurm) instead",
        ),
        (
            "dataset.streaming",
            cfg.dataset.streaming,
            "streaming datasets are not built; pass "
            "--dataset.repo_id to download the episodes once",
        ),
        (
            "dataset.repo_type",
            cfg.dataset.repo_type != "dataset",
            "only dataset repositories (repo_type=dataset) are read",
        ),
        ("dataset.eval_split", cfg.dataset.eval_split != 0.0, "held-out evaluation is not built"),
        ("eval_steps", cfg.eval_steps != 0, "held-out evaluation is not built"),
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


def _locate_resume(source_step: Path | None, output_dir: Path) -> tuple[Path, dict]:
    """--config_path's checkpoint (it must validate), else the newest complete checkpoint of
    --output_dir that validates (damaged newer ones are skipped with a warning). File sizes
    are checked here, their SHA-256 by :func:`verify_resume` once the ranks can share the work."""
    if source_step is not None:
        return source_step, validate_checkpoint_layout(source_step, hashes=False)
    found = newest_usable_checkpoint(output_dir, hashes=False)
    if found is None:
        raise CheckpointError(
            f"--resume=true but {checkpoints_dir(output_dir)} holds no complete, undamaged "
            "checkpoint; pass --config_path=<step>/pretrained_model/train_config.json or drop --resume"
        )
    last = checkpoints_dir(output_dir) / C.LAST_CHECKPOINT_LINK
    if last.is_symlink() and last.resolve() != found[0].resolve():
        log.warning(
            "%s points to %s, which is not the newest usable checkpoint; resuming from %s",
            last,
            os.readlink(last),
            found[0],
        )
    return found


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
            fix = f"--parallelism.dp_shard=1 --checkpoint_format=safetensors{reset}"
        else:
            fix = f"--parallelism.dp_shard=-1{reset} (FSDP2 over all {world_size} processes)"
        raise ConfigError(f"{e}; to resume on {world_size} process(es) pass {fix}") from None


def verify_resume(plan: TrainingPlan, group: ProcessGroup | None = None) -> None:
    """Collective, once the process group exists and before anything is written: verify the
    SHA-256 of every file of the checkpoint to resume from, each rank a share
    (:func:`verify_checkpoint_split`). A damaged checkpoint named by --config_path fails; an
    automatic resume falls back to the newest older complete checkpoint that verifies (updating
    the plan), saying why."""
    older = reversed(
        [
            p
            for p in list_complete_checkpoints(plan.output_dir)
            if read_training_step(p)["step"] < plan.start_step
        ]
    )
    step_dir, info = plan.resume_from, plan.resume_info
    while step_dir is not None:
        try:
            verify_checkpoint_split(step_dir, info, group)
        except CheckpointError as e:
            if plan.resume_explicit:
                raise
            log.warning(
                "skipping checkpoint %s: %s; falling back to an earlier one", step_dir.name, e
            )
            step_dir, info = _next_usable(older, plan.cfg)
            continue
        plan.resume_from, plan.resume_info = step_dir, info
        return
    raise CheckpointError(
        f"--resume=true but {checkpoints_dir(plan.output_dir)} holds no complete, undamaged "
        "checkpoint; pass --config_path=<step>/pretrained_model/train_config.json or drop --resume"
    )


def _next_usable(candidates: Iterator[Path], cfg: TrainConfig) -> tuple[Path | None, dict | None]:
    for candidate in candidates:
        try:
            info = validate_checkpoint_layout(candidate, hashes=False)
            _check_resume_compatible(cfg, candidate)
        except CheckpointError as e:
            log.warning("skipping checkpoint %s: %s", candidate.name, e)
            continue
        return candidate.resolve(), info
    return None, None


def _check_resume_compatible(cfg: TrainConfig, step_dir: Path) -> None:
    saved = read_json(step_dir / C.PRETRAINED_MODEL_DIR / C.CONFIG_NAME, "checkpoint policy config")
    if saved.get("type") != cfg.policy.type:
        raise CheckpointError(
            f"checkpoint {step_dir} holds a {saved.get('type')!r} policy but --policy.type is "
            f"{cfg.policy.type!r}; resume with the checkpoint's own train_config.json"
        )


def make_plan(
    argv: list[str], world_size: int, env: Mapping[str, str] = os.environ
) -> TrainingPlan:
    acknowledged = check_accelerate_env(env)
    cfg, source_step = parse_train_config(argv)
    validate_config(cfg)
    if cfg.policy.use_amp and cfg.accelerator.mixed_precision == "no":
        # LeRobot's use_amp: torch.autocast's default dtype of the device (fp16 CUDA, bf16 CPU).
        import torch

        device_type = "cuda" if torch.cuda.is_available() else "cpu"
        autocast = torch.get_autocast_dtype(device_type)
        cfg.accelerator.mixed_precision = "fp16" if autocast == torch.float16 else "bf16"
    dims = _resolve_topology(cfg, world_size)
    if cfg.peft is not None and cfg.checkpoint_format != "safetensors" and not dims.is_sharded:
        raise ConfigError(
            "--checkpoint_format=dcp needs a sharded run (--parallelism.dp_shard > 1) with PEFT"
        )
    output_dir = Path(cfg.output_dir) if cfg.output_dir else default_output_dir(cfg)
    cfg.output_dir = str(output_dir)
    if launched_rank(env) == 0:
        # A trainer still running on this folder is the first thing to know (the pipeline's
        # validate job says it too); train() takes the lock for real.
        check_run_lock(output_dir)

    resume_from, resume_info, resume_explicit = None, None, False
    if cfg.resume:
        resume_explicit = source_step is not None
        resume_from, resume_info = _locate_resume(source_step, output_dir)
        resume_from = resume_from.resolve()
        _check_resume_compatible(cfg, resume_from)
        if (
            resume_info.get("sharded")
            and not dims.is_sharded
            and cfg.checkpoint_format != "safetensors"
        ):
            raise ConfigError(
                f"resuming sharded checkpoint {resume_from} without sharding needs a single-file "
                "format: pass --checkpoint_format=safetensors"
            )
    elif list_complete_checkpoints(output_dir) or (output_dir / C.CHECKPOINTS_DIR).exists():
        raise ConfigError(
            f"--output_dir={output_dir} already holds checkpoints and --resume is false; pass "
            "--resume=true to continue that run, or choose another --output_dir"
        )

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
    sharding = check_policy_plan(cfg, dims, dataset)
    check_backbone_weights(cfg, env)
    drawable = sample_indices(cfg.policy, dataset)
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
        output_dir=output_dir,
        resume_from=resume_from,
        resume_info=resume_info,
        acknowledged_env=acknowledged,
        resume_explicit=resume_explicit,
        sharding=sharding,
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


def sample_indices(policy: PreTrainedConfig, dataset: LeRobotDataset) -> np.ndarray | None:
    """The dataset positions the sampler draws from: every frame, or, for a policy with a
    ``drop_n_last_frames`` field (LeRobot's convention, e.g. Diffusion Policy), each episode's
    frames but its last ``drop_n_last_frames``. None means every frame. ConfigError when no
    frame is left."""
    drop = getattr(policy, "drop_n_last_frames", 0) or 0
    if not drop:
        return None
    try:
        return episode_frames(*dataset.episode_bounds, drop_n_last_frames=drop)
    except ValueError as e:
        raise ConfigError(f"--policy.drop_n_last_frames={drop} on {dataset.root}: {e}") from None


def check_policy_plan(
    cfg: TrainConfig, dims: ParallelDims, dataset: LeRobotDataset
) -> ShardingPlan | None:
    """Fill the policy's features from the dataset and build the policy on the meta device with
    its PEFT wrapper, so that anything wrong with them (features, LoRA targets) fails before
    launch; for a sharded run, plan its sharding there too (wrap units, tied parameters, ignored
    modules, precision policy): the launch applies that plan instead of deciding again."""
    import torch

    from lerobot_pipe.distributed.parallelize import plan_sharding
    from lerobot_pipe.policies.factory import fill_features, get_policy_class
    from lerobot_pipe.policies.peft import apply_peft

    try:
        fill_features(cfg.policy, dataset.features)
    except ValueError as e:
        raise ConfigError(
            f"policy {cfg.policy.type!r} cannot train on {dataset.root}: {e}"
        ) from None
    policy_cls = get_policy_class(cfg.policy.type)
    with torch.device("meta"):
        try:
            model = policy_cls(cfg.policy, pretrained_parts=False)
        except ImportError as e:  # an optional dependency of the policy (diffusers)
            raise ConfigError(f"--policy.type={cfg.policy.type}: {e}") from None
        if cfg.peft is not None:
            try:
                model = apply_peft(model, cfg.peft, cfg.policy.pretrained_path)
            except ValueError as e:
                raise ConfigError(str(e)) from None
    if not dims.is_sharded:
        return None
    return plan_sharding(model, cfg.accelerator, policy_cls._fsdp_wrap_modules)


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
