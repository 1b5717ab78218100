"""Everything lerobot-train checks and decides before a process group exists (pre-flight).

:func:`make_plan` parses the flags (configs/loading.py), refuses configuration in the
environment, validates every value and resolves the config once (training/config_checks.py:
job name, optimizer presets, precision, output folder), resolves the topology for the launched
world size, locates the checkpoint to resume from (:func:`lerobot_pipe.checkpoint.resume.locate`,
sizes only), opens the dataset and, for a sharded run, decides the sharding on the meta-device
policy. The result is a frozen :class:`TrainingPlan` that nothing edits afterwards. A bad input
fails here, on each rank alone, with a message and without writing anything. ``lerobot-pipe
validate`` runs exactly this for the pipeline. One check waits for the process group, so that
the ranks can share it: the SHA-256 of the checkpoint's files
(:meth:`lerobot_pipe.checkpoint.manager.CheckpointManager.verify`), which may fall back to an
older checkpoint: :meth:`TrainingPlan.resuming` then gives the new plan.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lerobot_pipe import constants as C
from lerobot_pipe import envs  # noqa: F401 - registers the --env.type choices
from lerobot_pipe.checkpoint import resume
from lerobot_pipe.checkpoint.layout import CheckpointError, list_complete_checkpoints
from lerobot_pipe.checkpoint.resume import ResumePoint
from lerobot_pipe.configs.checkpoint_format import CheckpointFormat
from lerobot_pipe.configs.loading import parse_train_config
from lerobot_pipe.configs.parser import ConfigError, replace
from lerobot_pipe.configs.train import TrainConfig
from lerobot_pipe.datasets import DatasetError
from lerobot_pipe.distributed.env_guard import AccelerateEnvError, check_accelerate_env
from lerobot_pipe.distributed.parallel_dims import ParallelDims, resolve_parallelism
from lerobot_pipe.distributed.parallelize import ShardingPlan, plan_sharding
from lerobot_pipe.distributed.runtime import launched_rank
from lerobot_pipe.hub.publish import PublishError
from lerobot_pipe.policies import factory  # noqa: F401 - registers the policy types
from lerobot_pipe.policies.vision.imagenet_weights import (
    BackboneWeightsError,
    ensure_backbone_weights,
    offline_requested,
)
from lerobot_pipe.training.config_checks import resolve_config
from lerobot_pipe.training.data import (
    TrainingDataset,
    make_processors,
    open_dataset,
    sample_indices,
)
from lerobot_pipe.training.heldout import HeldOutSplit, plan_split
from lerobot_pipe.training.run_lock import RunLockError, check_run_lock
from lerobot_pipe.training.trackers import TrackerError
from lerobot_pipe.training.unit_probes import bypassed_on_meta

if TYPE_CHECKING:
    from torch import nn

    from lerobot_pipe.policies.pretrained import PreTrainedPolicy

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
    """What a run will do, decided once: its resolved config, topology, dataset, the checkpoint
    it resumes from and how FSDP2 shards the policy. Never edited: a fallback to another
    checkpoint is a new plan."""

    cfg: TrainConfig  # resolved (resolve_config): nothing changes it afterwards
    dims: ParallelDims
    dataset: TrainingDataset
    resume: ResumePoint | None = None
    acknowledged_env: tuple[str, ...] = ()
    # How FSDP2 wraps the policy, decided on the meta device (None unless the run is sharded):
    # the launch applies it by module name.
    sharding: ShardingPlan | None = None
    # Why the meta-device policy's forwards could not be probed for modules they bypass (None
    # when they were): then the launch probes the real model and completes the sharding.
    sharding_unprobed: str | None = None
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


def make_plan(
    argv: list[str], world_size: int, env: Mapping[str, str] = os.environ
) -> TrainingPlan:
    """The whole pre-flight of lerobot-train for ``world_size`` processes (module docstring)."""
    acknowledged = check_accelerate_env(env)
    cfg, source_step = parse_train_config(argv)
    cfg = resolve_config(cfg)
    dims = _resolve_topology(cfg, world_size)
    if dims.is_sharded and (problem := cfg.policy.sharding_problem()):
        raise ConfigError(problem)
    if (
        cfg.peft is not None
        and cfg.checkpoint_format is not CheckpointFormat.SAFETENSORS
        and not dims.is_sharded
    ):
        raise ConfigError(
            f"--checkpoint_format={cfg.checkpoint_format} needs a sharded run "
            "(--parallelism.dp_shard > 1) with PEFT"
        )
    if launched_rank(env) == 0:
        # A trainer still running on this folder is the first thing to know (the pipeline's
        # validate job says it too); train() takes the lock for real.
        check_run_lock(Path(cfg.output_dir))
    point = resume_point(cfg, source_step)
    dataset = open_dataset(cfg, point, launched_rank(env))
    return plan_on_dataset(cfg, dims, dataset, point, env, tuple(acknowledged))


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
    dataset: TrainingDataset,
    point: ResumePoint | None,
    env: Mapping[str, str] = os.environ,
    acknowledged: tuple[str, ...] = (),
) -> TrainingPlan:
    """The plan's last checks, those that need the dataset: the policy's features (filled in
    from the dataset) and its build on the meta device, the backbone weights, the environment,
    the held-out split, the batch size, the statistics its normalizer needs; for a sharded run,
    its sharding decided (which builds the processors too)."""
    policy, trainee = build_on_meta_for_checks(cfg, dataset)
    cfg = replace(cfg, policy=policy.config)
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
    plan = TrainingPlan(
        cfg=cfg,
        dims=dims,
        dataset=dataset,
        resume=point,
        acknowledged_env=acknowledged,
        heldout=heldout,
    )
    if dims.is_sharded:
        return decide_sharding(plan, policy, trainee)
    make_processors(plan, "cpu")  # the statistics its normalizer needs, before launch
    return plan


def build_on_meta_for_checks(
    cfg: TrainConfig, dataset: TrainingDataset
) -> tuple[PreTrainedPolicy, nn.Module]:
    """The policy, with its features filled in from the dataset (on a copy of its config), built
    on the meta device with its PEFT wrapper (the trainee), so that anything wrong with them
    (features, LoRA targets) fails before launch."""
    import torch

    from lerobot_pipe.policies.factory import fill_features, get_policy_class
    from lerobot_pipe.policies.peft import apply_peft

    policy_cfg = copy.deepcopy(cfg.policy)
    try:
        fill_features(policy_cfg, dataset.features)
    except ValueError as e:
        raise ConfigError(
            f"policy {cfg.policy.type!r} cannot train on {dataset.root}: {e}"
        ) from None
    with torch.device("meta"):
        try:
            policy = get_policy_class(policy_cfg)(policy_cfg, pretrained_parts=False)
        except ImportError as e:  # an optional dependency of the policy (diffusers)
            raise ConfigError(f"--policy.type={cfg.policy.type}: {e}") from None
        trainee = policy
        if cfg.peft is not None:
            try:
                trainee = apply_peft(policy, cfg.peft, cfg.policy.pretrained_path)
            except ValueError as e:
                raise ConfigError(str(e)) from None
    return policy, trainee


def decide_sharding(
    plan: TrainingPlan, policy: PreTrainedPolicy, trainee: nn.Module
) -> TrainingPlan:
    """The plan with its sharding (wrap units, tied parameters, ignored modules, precision
    policy), decided on the meta-device policy once its forwards have run there on one batch:
    a module whose forward they bypass cannot be a unit. The launch applies it instead of
    deciding again; only when the meta device cannot run those forwards does the launch probe
    the real model (``sharding_unprobed`` says why)."""
    pre, _ = make_processors(plan, "cpu")
    bypassed = bypassed_on_meta(plan, policy, trainee, pre)
    unprobed = bypassed if isinstance(bypassed, str) else None
    sharding = plan_sharding(
        trainee,
        plan.cfg.accelerator,
        type(policy)._fsdp_wrap_modules,
        None if unprobed else bypassed,
    )
    return dataclasses.replace(plan, sharding=sharding, sharding_unprobed=unprobed)


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


# The real model probed before launch (lerobot-pipe validate) up to this many parameters: built on
# the CPU in seconds. A larger one is probed by the launch, on every rank before the first step.
PROBE_BEFORE_LAUNCH_MAX_PARAMS = 300_000_000


def probe_units_before_launch(plan: TrainingPlan) -> str | None:
    """Where the meta device could not run the policy (``plan.sharding_unprobed``: LeRobot's own
    classes, mostly), run the real model once on the CPU now, so that a wrap unit whose forward
    never runs is refused by name before anything is launched (ConfigError, DDP suggested), not
    at the first step. Returns why it was left to the launch (too large), else None."""
    import torch

    from lerobot_pipe.policies.factory import make_policy
    from lerobot_pipe.policies.peft import apply_peft
    from lerobot_pipe.training.unit_probes import probe_forwards

    if plan.sharding is None or plan.sharding_unprobed is None:
        return None
    cfg = plan.cfg
    policy, trainee = build_on_meta_for_checks(cfg, plan.dataset)
    n_params = sum(p.numel() for p in trainee.parameters())
    if n_params > PROBE_BEFORE_LAUNCH_MAX_PARAMS:
        return (
            f"{n_params / 1e6:,.0f} M parameters: the launch probes its wrap units on the real "
            "model before the first step"
        )
    # Random weights suffice to see which forwards run; the generators are left as they were.
    with torch.random.fork_rng(devices=[]):
        policy = make_policy(cfg.policy, plan.dataset.features, pretrained_parts=False)
        policy.train()
        trainee = apply_peft(policy, cfg.peft, cfg.policy.pretrained_path) if cfg.peft else policy
        pre, _ = make_processors(plan, "cpu")
        bypassed = probe_forwards(plan, policy, trainee, pre, torch.device("cpu"))
    plan_sharding(trainee, cfg.accelerator, type(policy)._fsdp_wrap_modules, bypassed)
    return None
