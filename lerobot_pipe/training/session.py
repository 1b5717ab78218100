"""A run's stateful objects, built from its plan and (on resume) restored: the policy and its
processors, wrapped for the topology by the plan's sharding, the optimizer, scheduler, scaler and
EMA, the checkpoint manager. What the loop (training/loop.py) trains."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lerobot_pipe.checkpoint.manager import CheckpointManager
from lerobot_pipe.checkpoint.pretrained import PolicyFiles
from lerobot_pipe.checkpoint.stateful import TrainState, train_states
from lerobot_pipe.datasets.stream_sampler import StreamState
from lerobot_pipe.datasets.streaming import check_same_revision
from lerobot_pipe.distributed.activation_checkpointing import (
    apply_activation_checkpointing,
    checkpointed_units,
)
from lerobot_pipe.distributed.parallelize import apply_parallelism, make_grad_scaler
from lerobot_pipe.distributed.runtime import DistEnv
from lerobot_pipe.policies.factory import make_policy
from lerobot_pipe.policies.peft import adapter_key_map, apply_peft
from lerobot_pipe.policies.pretrained import PreTrainedPolicy
from lerobot_pipe.processors import PolicyProcessorPipeline
from lerobot_pipe.training.banner import banner
from lerobot_pipe.training.data import make_processors
from lerobot_pipe.training.ema import EMAState
from lerobot_pipe.training.memory_plan import banner_line
from lerobot_pipe.training.meta_build import BuiltPolicy, MetaBuilt, build_on_meta
from lerobot_pipe.training.optim import make_optimizer, make_scheduler
from lerobot_pipe.training.preflight import TrainingPlan
from lerobot_pipe.training.unit_probes import plan_units_on_the_real_model
from lerobot_pipe.utils.random import seed_everything

log = logging.getLogger("lerobot_pipe.train")


@dataclass(kw_only=True)
class Session:
    """The stateful objects of a run, built and (on resume) restored, ready for the loop."""

    plan: TrainingPlan  # the plan as verified: its resume point is the checkpoint loaded
    policy: PreTrainedPolicy  # the unwrapped policy (config, save_pretrained)
    trainee: nn.Module  # the policy, or its PeftModel wrapper with PEFT
    state: TrainState  # what a checkpoint holds; its progress is where the loop starts
    checkpoints: CheckpointManager
    pre: PolicyProcessorPipeline
    post: PolicyProcessorPipeline
    ignored: list[nn.Parameter]  # FSDP2-ignored parameters, whose gradients the loop averages
    built_on_meta: bool = False  # sharded: built on the meta device, shards materialized
    eager_reason: str | None = None  # sharded and built eagerly: why not on the meta device

    @property
    def model(self) -> nn.Module:  # what the loop calls: the policy wrapped for the topology
        return self.state.model.module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.state.optimizer.optimizer


def training_step_record(plan: TrainingPlan) -> dict:
    """training_step.json's fields; ``step`` and ``samples_consumed`` are filled in by each save."""
    cfg, dims = plan.cfg, plan.dims
    return {
        "step": 0,
        "num_processes": dims.world_size,
        "samples_consumed": 0,
        "dp_world_size": dims.dp_world_size,
        "world_size": dims.world_size,
        "batch_size": cfg.batch_size,
        "global_batch_size": cfg.batch_size * dims.dp_world_size,
        "grad_accum_steps": cfg.accelerator.gradient_accumulation.steps,
        "precision": cfg.accelerator.mixed_precision,
        "parallelism": dims.to_dict(),
        "sharded": dims.is_sharded,
        "checkpoint_format": cfg.checkpoint_format.value,
        "seed": cfg.seed,
    }


def prepare_session(plan: TrainingPlan, env: DistEnv) -> Session:
    """Verify the checkpoint to resume from (each rank hashing a share; a fallback gives a new
    plan), then build policy and processors, wrap them by the plan's sharding, build optimizer,
    scheduler and scaler and restore the checkpoint onto this topology (resharding as needed).
    Collective."""

    cfg = plan.cfg
    if cfg.dataset.streaming:  # before any batch: every rank reads the same commit
        check_same_revision(plan.dataset.revision, cfg.dataset.repo_id)
    checkpoints = CheckpointManager(
        plan.output_dir,
        total_steps=cfg.steps,
        save_freq=cfg.save_freq,
        enabled=cfg.save_checkpoint,
        checkpoint_format=cfg.checkpoint_format,
        sharded=plan.dims.is_sharded,
        run_info=training_step_record(plan),
        async_save=cfg.checkpoint_async,
        keep_last=cfg.checkpoint_keep_last,
        is_main=env.is_main,
    )
    plan = plan.resuming(checkpoints.verify(plan.resume, cfg.policy.type))
    if cfg.cudnn_deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    # The model is initialized identically on every rank; randomness after that is per rank.
    seed_everything(cfg.seed)
    built = build_policy(plan, env)
    trainee = built.trainee
    n_params = sum(p.numel() for p in trainee.parameters())
    n_trainable = sum(p.numel() for p in trainee.parameters() if p.requires_grad)
    # PEFT's names as the checkpoint holds them: before wrapping renames any module.
    adapter_keys = adapter_key_map(trainee) if cfg.peft is not None else None
    model, ignored = wrap_for_topology(plan, env, built)
    seed_everything(cfg.seed + env.rank)
    state = checkpoints.load(_train_states(plan, env, model, built, adapter_keys), plan.resume)
    if env.is_main:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
        memory = banner_line(plan, local, env.device)
        log.info("\n%s", banner(plan, env, (n_params, n_trainable), built.sharding, memory))
    return Session(
        plan=plan,
        policy=built.policy,
        trainee=trainee,
        state=state,
        checkpoints=checkpoints,
        pre=built.pre,
        post=built.post,
        ignored=ignored,
        built_on_meta=isinstance(built, MetaBuilt),
        eager_reason=built.eager_reason,
    )


def build_policy(plan: TrainingPlan, env: DistEnv) -> BuiltPolicy:
    """Sharded: on the meta device (each rank materializes its shards after sharding), else, or
    when that cannot be, whole on every rank. Collective when sharded."""

    cfg = plan.cfg
    eager_reason = None
    if plan.sharding is not None:
        outcome = build_on_meta(plan, env)
        if isinstance(outcome, MetaBuilt):
            return outcome
        eager_reason = outcome.reason
        seed_everything(cfg.seed)  # the meta build's attempt drew from the generators
    # A resumed run's checkpoint holds every weight: no pretrained backbone to read first.
    policy = make_policy(
        cfg.policy, plan.dataset.features, pretrained_parts=plan.resume_from is None
    )
    policy.train()
    pre, post = make_processors(plan, env.device.type)
    trainee = policy
    if cfg.peft is not None:
        trainee = apply_peft(policy, cfg.peft, cfg.policy.pretrained_path)
    sharding = plan.sharding
    if sharding is not None and plan.sharding_unprobed is not None:
        sharding = plan_units_on_the_real_model(plan, policy, trainee, pre, env.device)
    return BuiltPolicy(
        policy=policy,
        trainee=trainee,
        pre=pre,
        post=post,
        sharding=sharding,
        eager_reason=eager_reason,
    )


def wrap_for_topology(
    plan: TrainingPlan, env: DistEnv, built: BuiltPolicy
) -> tuple[nn.Module, list[nn.Parameter]]:
    """The trainee wrapped for the topology (DDP, or FSDP2 by the sharding), its shards
    materialized; and the FSDP2-ignored parameters, whose gradients the loop averages."""
    accelerator, trainee, sharding = plan.cfg.accelerator, built.trainee, built.sharding
    if accelerator.activation_checkpointing.mode == "full":  # before sharding wraps them
        units = sharding.wrap_units if sharding is not None else None
        policy_units = type(built.policy)._fsdp_wrap_modules
        checkpointed = checkpointed_units(
            trainee, accelerator.fsdp.wrap_modules, policy_units, units
        )
        apply_activation_checkpointing(trainee, checkpointed)
    model = apply_parallelism(trainee, plan.dims, env, accelerator, sharding)
    # CPU-offloaded parameters live on the CPU.
    built.materialize(torch.device("cpu") if accelerator.fsdp.cpu_offload else env.device)
    # FSDP2 neither shards nor reduces ignored parameters: their gradients are averaged by the
    # loop (taken after materializing, whose to_empty gives unsharded parameters new objects).
    ignored = sharding.ignored_parameters(trainee) if sharding is not None else []
    return model, ignored


def _train_states(
    plan: TrainingPlan,
    env: DistEnv,
    model: nn.Module,
    built: BuiltPolicy,
    adapter_keys: dict[str, str] | None,
) -> dict[str, Any]:
    """What a checkpoint holds (the manager's ``states``): the model, optimizer, scheduler,
    scaler, EMA and stream."""
    cfg, trainee = plan.cfg, built.trainee
    # Groups from the (in place sharded) policy itself: LeRobot's grouping and parameter order.
    scaled = cfg.accelerator.mixed_precision == "fp16"
    optimizer = make_optimizer(trainee.get_optim_params(), cfg.optimizer, fused=not scaled)
    return train_states(
        model,
        optimizer,
        PolicyFiles(built.policy, trainee, built.pre, built.post, cfg),
        scheduler=make_scheduler(optimizer, cfg.scheduler, cfg.steps),
        scaler=make_grad_scaler(env.device, plan.dims, enabled=scaled),
        # The shadow of the trainee's (sharded in place) parameters: training/ema.py.
        ema=EMAState(trainee, cfg.ema) if cfg.ema.enable else None,
        stream=StreamState(plan.dataset.revision) if cfg.dataset.streaming else None,
        adapter_key_map=(lambda sd: {adapter_keys[k]: v for k, v in sd.items()})
        if adapter_keys
        else None,
    )
