"""Everything lerobot-train decides before a process group exists.

:func:`make_plan` parses the flags, refuses configuration in the environment, validates every
value, resolves the topology for the launched world size, locates and checks the checkpoint to
resume from and opens the dataset. A bad input fails here, on each rank alone, with a message and
without writing anything. ``lerobot-pipe validate`` runs exactly this for the pipeline.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from lerobot_pipe import constants as C
from lerobot_pipe.configs.parser import (
    ConfigError,
    from_dict,
    policy_config_class,
    read_json,
    set_field,
    split_flags,
)
from lerobot_pipe.configs.train import (
    CHECKPOINT_FORMATS,
    MIXED_PRECISION_CHOICES,
    OPTIMIZER_TYPES,
    PEFT_METHODS,
    SCHEDULER_TYPES,
    TrainConfig,
)
from lerobot_pipe.datasets import DatasetError, LeRobotDataset, resolve_dataset_root
from lerobot_pipe.distributed.env_guard import AccelerateEnvError, check_accelerate_env
from lerobot_pipe.distributed.parallel_dims import ParallelDims, resolve_parallelism
from lerobot_pipe.distributed.runtime import launched_rank
from lerobot_pipe.policies import factory  # noqa: F401 - registers the policy types
from lerobot_pipe.policies.pretrained import PreTrainedConfig
from lerobot_pipe.training.checkpoint import (
    CheckpointError,
    checkpoints_dir,
    list_complete_checkpoints,
    newest_usable_checkpoint,
    step_dir_from_path,
    validate_checkpoint_layout,
)
from lerobot_pipe.training.run_lock import RunLockError, check_run_lock

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

    @property
    def start_step(self) -> int:
        return self.resume_info["step"] if self.resume_info else 0


def resolve_policy_path(path: str) -> Path:
    """A local policy folder, or a Hub repo id downloaded through huggingface_hub."""
    local = step_dir_from_path(path)
    if (local / C.PRETRAINED_MODEL_DIR).is_dir():
        local = local / C.PRETRAINED_MODEL_DIR
    if local.is_dir():
        if not (local / C.CONFIG_NAME).is_file():
            raise ConfigError(f"--policy.path={path}: no {C.CONFIG_NAME} in {local}")
        return local
    if path.startswith((".", "/")) or path.count("/") != 1:
        raise ConfigError(
            f"--policy.path={path}: no such folder, and not a Hub repo id (namespace/name)"
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                path,
                repo_type="model",
                allow_patterns=["*.json", "*.safetensors", "*.md", "*.yaml"],
            )
        )
    except Exception as e:  # noqa: BLE001 - any network or Hub error
        raise ConfigError(
            f"--policy.path={path}: not a local folder and the Hub download failed: {e}"
        ) from None


def parse_train_config(argv: list[str]) -> tuple[TrainConfig, Path | None]:
    """Flags -> TrainConfig. ``--config_path`` loads a train_config.json first; flags override it.
    Returns the config and the checkpoint step folder ``--config_path`` pointed into (if any)."""
    flags = split_flags(argv)
    config_path = flags.pop("config_path", None)
    source_step: Path | None = None
    if config_path is not None:
        path = Path(config_path)
        if path.is_dir():
            step = step_dir_from_path(path)
            path = step / C.PRETRAINED_MODEL_DIR / C.TRAIN_CONFIG_NAME
            if not path.is_file():
                path = Path(config_path) / C.TRAIN_CONFIG_NAME
        data = read_json(path, "--config_path")
        data.pop("resolved", None)
        cfg = from_dict(TrainConfig, data)
        if path.parent.name == C.PRETRAINED_MODEL_DIR:
            source_step = path.parent.parent
    else:
        cfg = TrainConfig()

    policy_type = flags.pop("policy.type", None)
    policy_path = flags.pop("policy.path", None)
    if policy_path is not None:
        local = resolve_policy_path(policy_path)
        try:
            cfg.policy = PreTrainedConfig.from_pretrained(local)
        except (ValueError, OSError) as e:
            raise ConfigError(f"--policy.path={policy_path}: {e}") from None
        cfg.policy.pretrained_path = str(local)
    if policy_type is not None and (cfg.policy is None or cfg.policy.type != policy_type):
        if policy_path is not None:
            raise ConfigError(
                f"--policy.type={policy_type} contradicts --policy.path={policy_path} "
                f"(a {cfg.policy.type} policy); drop one of them"
            )
        cfg.policy = policy_config_class(policy_type)()
    for key, value in flags.items():
        if key.startswith("policy.") and cfg.policy is None:
            raise ConfigError(
                f"--{key}: pass --policy.type (e.g. --policy.type=act) before policy fields"
            )
        set_field(cfg, key.split("."), value, key)
    if cfg.policy is not None:
        try:
            cfg.policy.__post_init__()
        except ValueError as e:
            raise ConfigError(f"--policy.*: {e}") from None
    return cfg, source_step


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
    if cfg.num_workers < 0:
        raise ConfigError(f"--num_workers={cfg.num_workers}: must be >= 0")
    if cfg.seed < 0:
        raise ConfigError(f"--seed={cfg.seed}: must be >= 0")
    _choice("checkpoint_format", cfg.checkpoint_format, CHECKPOINT_FORMATS)
    _choice("accelerator.mixed_precision", cfg.accelerator.mixed_precision, MIXED_PRECISION_CHOICES)
    _choice("optimizer.type", cfg.optimizer.type, OPTIMIZER_TYPES)
    if cfg.optimizer.lr is not None:
        _positive("optimizer.lr", cfg.optimizer.lr)
    if cfg.optimizer.weight_decay is not None and cfg.optimizer.weight_decay < 0:
        raise ConfigError(f"--optimizer.weight_decay={cfg.optimizer.weight_decay}: must be >= 0")
    if cfg.optimizer.grad_clip_norm < 0:
        raise ConfigError(
            f"--optimizer.grad_clip_norm={cfg.optimizer.grad_clip_norm}: must be >= 0"
        )
    if cfg.scheduler.type is not None:
        _choice("scheduler.type", cfg.scheduler.type, SCHEDULER_TYPES)
    if cfg.scheduler.num_warmup_steps < 0:
        raise ConfigError(
            f"--scheduler.num_warmup_steps={cfg.scheduler.num_warmup_steps}: must be >= 0"
        )
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
    if cfg.peft.method_type is not None:
        _choice("peft.method_type", cfg.peft.method_type, PEFT_METHODS)
        _positive("peft.r", cfg.peft.r)
        if not cfg.policy.pretrained_path:
            raise ConfigError(
                "--peft.* fine-tunes a pretrained policy: pass --policy.path=<base policy>"
            )
        if not 0 <= cfg.peft.lora_dropout < 1:
            raise ConfigError(f"--peft.lora_dropout={cfg.peft.lora_dropout}: must be in [0, 1)")
    if cfg.policy.push_to_hub and not cfg.policy.repo_id:
        raise ConfigError("--policy.push_to_hub=true needs --policy.repo_id=<namespace/name>")
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


def default_output_dir(cfg: TrainConfig) -> Path:
    now = datetime.now()
    name = cfg.job_name or cfg.policy.type
    return Path("outputs/train") / now.strftime("%Y-%m-%d") / f"{now.strftime('%H-%M-%S')}_{name}"


def _locate_resume(source_step: Path | None, output_dir: Path) -> tuple[Path, dict]:
    """--config_path's checkpoint (it must validate), else the newest complete checkpoint of
    --output_dir that validates (damaged newer ones are skipped with a warning)."""
    if source_step is not None:
        return source_step, validate_checkpoint_layout(source_step)
    found = newest_usable_checkpoint(output_dir)
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
    dims = _resolve_topology(cfg, world_size)
    if (
        cfg.peft.method_type is not None
        and cfg.checkpoint_format != "safetensors"
        and not dims.is_sharded
    ):
        raise ConfigError(
            "--checkpoint_format=dcp needs a sharded run (--parallelism.dp_shard > 1) with PEFT"
        )
    output_dir = Path(cfg.output_dir) if cfg.output_dir else default_output_dir(cfg)
    cfg.output_dir = str(output_dir)
    if launched_rank(env) == 0:
        # A trainer still running on this folder is the first thing to know (the pipeline's
        # validate job says it too); train() takes the lock for real.
        check_run_lock(output_dir)

    resume_from, resume_info = None, None
    if cfg.resume:
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

    dataset_root = resolve_dataset_root(cfg.dataset.root, cfg.dataset.repo_id, cfg.dataset.revision)
    delta = cfg.policy.action_delta_indices
    info_fps = _dataset_fps(dataset_root)
    delta_timestamps = {"action": [i / info_fps for i in delta]} if delta else None
    dataset = LeRobotDataset(
        dataset_root, delta_timestamps=delta_timestamps, episodes=cfg.dataset.episodes
    )
    check_policy_plan(cfg, dims, dataset)
    if len(dataset) < cfg.batch_size * dims.dp_world_size:
        log.warning(
            "the dataset has %d frames, fewer than one global batch (%d); samples repeat within a step",
            len(dataset),
            cfg.batch_size * dims.dp_world_size,
        )
    cfg.resolved = {
        "world_size": world_size,
        "parallelism": dims.to_dict(),
        "dataset_root": str(dataset_root),
        "effective_batch_size": cfg.batch_size
        * dims.dp_world_size
        * cfg.accelerator.gradient_accumulation.steps,
    }
    return TrainingPlan(
        cfg=cfg,
        dims=dims,
        dataset=dataset,
        output_dir=output_dir,
        resume_from=resume_from,
        resume_info=resume_info,
        acknowledged_env=acknowledged,
    )


def _dataset_fps(root: Path) -> int:
    info = read_json(root / C.DATASET_INFO, "dataset info")
    fps = info.get("fps")
    if not isinstance(fps, int | float) or fps <= 0:
        raise DatasetError(f"{root / C.DATASET_INFO}: 'fps' must be a positive number, got {fps!r}")
    return fps


def check_policy_plan(cfg: TrainConfig, dims: ParallelDims, dataset: LeRobotDataset) -> None:
    """Fill the policy's features from the dataset and build the policy on the meta device with
    its PEFT wrapper and wrap units, so that anything wrong with them (features, LoRA targets,
    wrap classes, tied parameters, ignored modules, precision policy) fails before launch."""
    import torch

    from lerobot_pipe.distributed.parallelize import (
        check_shared_parameters,
        ignored_parameters,
        mixed_precision_policy,
        select_wrap_units,
    )
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
        model = policy_cls(cfg.policy)
        if cfg.peft.method_type is not None:
            try:
                model = apply_peft(model, cfg.peft, cfg.policy.pretrained_path)
            except ValueError as e:
                raise ConfigError(str(e)) from None
    if dims.is_sharded:
        units = select_wrap_units(model, cfg.accelerator.fsdp, policy_cls._fsdp_wrap_modules)
        check_shared_parameters(model, units)
        ignored_parameters(model, cfg.accelerator.fsdp.ignored_modules)
        mixed_precision_policy(cfg.accelerator)
