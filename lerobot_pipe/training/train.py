"""The training loop: one function, its branches visible (DDP / FSDP2 / HSDP, accumulation,
mixed precision, checkpointing, resume).

Counting: ``step`` counts loop steps, i.e. micro-batches per worker. One loop step consumes one
global batch of ``batch_size x dp_world_size`` samples; the optimizer updates every
``gradient_accumulation.steps`` loop steps; the LR scheduler steps every loop step (as LeRobot).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lerobot_pipe import constants as C
from lerobot_pipe.checkpoint.manager import CheckpointManager
from lerobot_pipe.checkpoint.pretrained import PolicyFiles
from lerobot_pipe.checkpoint.stateful import TrainState
from lerobot_pipe.configs.types import OBS_LANGUAGE_PREFIX
from lerobot_pipe.datasets import BatchPrefetcher, GlobalBatchSampler
from lerobot_pipe.datasets.prefetch import to_device
from lerobot_pipe.datasets.stream_sampler import StreamSampler, StreamState
from lerobot_pipe.datasets.streaming import check_same_revision
from lerobot_pipe.distributed.activation_checkpointing import (
    apply_activation_checkpointing,
    checkpointed_units,
)
from lerobot_pipe.distributed.meta_init import DeferredInit, MetaBuild, safetensors_source
from lerobot_pipe.distributed.parallelize import (
    ShardingPlan,
    apply_parallelism,
    autocast_dtype,
    average_gradients,
    clip_grad_norm,
    make_grad_scaler,
    plan_sharding,
)
from lerobot_pipe.distributed.runtime import (
    DistEnv,
    barrier,
    broadcast_from_main,
    destroy,
    init_distributed,
    run_on_main,
)
from lerobot_pipe.distributed.unit_probe import MetaValues, find_bypassed_modules
from lerobot_pipe.evaluation.in_training import InTrainingEval, eval_batch_size
from lerobot_pipe.evaluation.in_training import describe as describe_rollouts
from lerobot_pipe.evaluation.in_training import summary as env_eval_summary
from lerobot_pipe.policies.factory import (
    fill_features,
    get_policy_class,
    make_policy,
    make_pre_post_processors,
)
from lerobot_pipe.policies.locate import local_policy_folder
from lerobot_pipe.policies.peft import adapter_key_map, apply_peft
from lerobot_pipe.policies.pretrained import PreTrainedPolicy
from lerobot_pipe.processors import (
    NormalizerProcessorStep,
    PolicyProcessorPipeline,
    RenameObservationsProcessorStep,
)
from lerobot_pipe.training.ema import EMAState, evaluation_weights
from lerobot_pipe.training.heldout import describe as describe_heldout
from lerobot_pipe.training.heldout import heldout_loss
from lerobot_pipe.training.host_memory import keep_freed_host_memory
from lerobot_pipe.training.optim import make_optimizer, make_scheduler
from lerobot_pipe.training.preflight import TrainingPlan, sample_indices
from lerobot_pipe.training.progress import EventChannel, ProgressReporter
from lerobot_pipe.training.run_lock import RunLock, RunLockError, acquire_run_lock
from lerobot_pipe.training.step_time import StepTimer
from lerobot_pipe.training.trackers import MetricsLog, TrackerError
from lerobot_pipe.utils import faults
from lerobot_pipe.utils.random import seed_everything

log = logging.getLogger("lerobot_pipe.train")


def banner(
    plan: TrainingPlan,
    env: DistEnv,
    num_params: tuple[int, int],
    sharding: ShardingPlan | None = None,
) -> str:
    cfg, dims = plan.cfg, plan.dims
    ga = cfg.accelerator.gradient_accumulation.steps
    eff = cfg.batch_size * dims.dp_world_size * ga
    lines = [
        f"Effective batch size: {cfg.batch_size} x {dims.dp_world_size} dp workers x {ga} grad accum = {eff} "
        f"(topology: dp_replicate={dims.dp_replicate}, dp_shard={dims.dp_shard}, {dims.mode})",
        f"Processes: {env.world_size} ({env.backend or 'no process group'}, device {env.device.type}); "
        f"precision: {cfg.accelerator.mixed_precision}; checkpoint format: {cfg.checkpoint_format}"
        f"{' (async)' if cfg.checkpoint_async else ''}"
        f"{f', keeping the last {cfg.checkpoint_keep_last}' if cfg.checkpoint_keep_last else ''}",
        f"Policy: {cfg.policy.type}, {num_params[0]:,} parameters ({num_params[1]:,} trainable); "
        f"dataset: {plan.dataset.root} ({len(plan.dataset)} frames, {plan.dataset.num_episodes} episodes)",
        f"Steps: {cfg.steps} loop steps (micro-batches per worker); save every {cfg.save_freq or 'end'}; "
        f"output: {plan.output_dir}",
    ]
    if sharding is not None:
        line = f"FSDP2 units: {len(sharding.wrap_units)} and the root"
        if sharding.passed_over:
            line += (
                "; passed over (their forward never runs, their children may be units): "
                + ", ".join(sharding.passed_over)
            )
        lines.append(line)
    if cfg.ema.enable:
        ema = cfg.ema
        schedule = (
            f"constant decay {ema.decay}"
            if ema.decay is not None
            else f"decay schedule inv_gamma={ema.inv_gamma} power={ema.power} "
            f"in [{ema.min_decay}, {ema.max_decay}]"
        )
        lines.append(
            f"EMA of the weights: {schedule}, update_after_step={ema.update_after_step}, "
            f"use_for_eval={ema.use_for_eval}"
        )
    if plan.heldout is not None:
        every = f"every {cfg.eval_steps} steps" if cfg.eval_steps else "never (--eval_steps=0)"
        lines.append(f"{describe_heldout(plan.heldout)}; held-out loss {every}")
    if cfg.env is not None:
        lines.append(
            f"Rollouts: {cfg.eval.n_episodes} episodes of {cfg.env.gym_id} every "
            f"{cfg.env_eval_freq} steps, split across {env.world_size} rank(s), seeds from "
            f"{cfg.seed}{' (EMA weights)' if cfg.ema.enable and cfg.ema.use_for_eval else ''}"
        )
    if plan.resume_from is not None:
        lines.append(f"Resuming from {plan.resume_from} (step {plan.start_step})")
    return "\n".join(lines)


def _training_step_record(plan: TrainingPlan) -> dict:
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
        "checkpoint_format": cfg.checkpoint_format,
        "seed": cfg.seed,
    }


def _loss_normalizers(
    policy: PreTrainedPolicy, window: list[dict[str, torch.Tensor]], device: torch.device
) -> dict:
    """The ``normalizers`` keyword of the policy's forward for one optimizer update: each
    ratio-of-sums loss term's denominator counted over every micro-batch of every rank, and the
    number of (micro-batch, rank) shares it splits into. Dividing by total / shares instead of
    by the local count makes the data-parallel, accumulated gradient the whole batch's. Integers
    only, so that FSDP's mixed-precision input cast leaves them alone."""
    counts = [policy.loss_normalizers(batch) for batch in window]
    if not counts[0]:
        return {}
    names = sorted(counts[0])
    totals = torch.stack([sum(c[n] for c in counts) for n in names]).to(device, torch.int64)
    shares = len(window)
    if dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        shares *= dist.get_world_size()
    return {"normalizers": {n: (totals[i], shares) for i, n in enumerate(names)}}


def _reduce_mean(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        values /= dist.get_world_size()
    return values


def train(plan: TrainingPlan) -> Path | None:
    """Run the planned training; returns the last checkpoint folder written (None if none).

    Raises :class:`RunLockError` on every rank when another trainer holds the output folder.
    """
    keep_freed_host_memory()  # each step's host tensors reuse the last step's pages
    env = init_distributed()
    try:
        with hold_run_lock(plan.output_dir, env), event_channel(plan.output_dir, env) as channel:
            return run_loop(env, prepare_session(plan, env), channel)
    finally:
        destroy()


@contextlib.contextmanager
def event_channel(output_dir: Path, env: DistEnv):
    """Every rank's warnings and errors, and the main rank's progress, as events in
    progress.jsonl (what the pipeline's train job shows), for the whole run."""
    if env.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
    barrier()  # the folder exists before any rank opens the file
    channel = EventChannel(output_dir, env.rank)
    root = logging.getLogger()
    root.addHandler(channel)
    try:
        yield channel
    finally:
        root.removeHandler(channel)
        channel.close()


@contextlib.contextmanager
def hold_run_lock(output_dir: Path, env: DistEnv):
    """The main process takes the output folder's run lock before any rank writes into it and
    holds it until training ends; the other ranks wait for the outcome (a collective), so none
    writes unless it is held, and all stop with the holder's name when it is not."""
    lock: RunLock | None = None
    error: str | None = None
    if env.is_main:
        try:
            lock = acquire_run_lock(output_dir)
        except RunLockError as e:
            error = str(e)
    error = broadcast_from_main(error)
    if error is not None:
        raise RunLockError(error)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


@dataclass(kw_only=True)
class Session:
    """The stateful objects of a run, built and (on resume) restored, ready for the loop."""

    plan: TrainingPlan  # the plan as verified: its resume point is the checkpoint loaded
    policy: PreTrainedPolicy  # the unwrapped policy (config, save_pretrained)
    trainee: nn.Module  # the policy, or its PeftModel wrapper with PEFT
    state: TrainState  # what a checkpoint holds; its progress is where the loop starts
    checkpoints: CheckpointManager
    pre: Any
    post: Any
    ignored: list[nn.Parameter]  # FSDP2-ignored parameters, whose gradients the loop averages
    built_on_meta: bool = False  # sharded: built on the meta device, shards materialized
    eager_reason: str | None = None  # sharded and built eagerly: why not on the meta device

    @property
    def model(self) -> nn.Module:  # what the loop calls: the policy wrapped for the topology
        return self.state.model.module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.state.optimizer.optimizer


def make_processors(
    plan: TrainingPlan, device_type: str
) -> tuple[PolicyProcessorPipeline, PolicyProcessorPipeline]:
    """LeRobot's default pipelines for the policy, on ``device_type``, renaming with
    ``--rename_map``. Statistics: a resumed run's own (saved in its checkpoint), else the
    dataset's (also when fine-tuning with --policy.path, as LeRobot does)."""
    cfg = plan.cfg
    stats: dict = plan.dataset.stats
    if plan.resume_from is not None:
        saved, _ = make_pre_post_processors(
            cfg.policy, pretrained_path=plan.resume_from / C.PRETRAINED_MODEL_DIR
        )
        stats = saved.step(NormalizerProcessorStep.registry_name).stats
    pre, post = make_pre_post_processors(
        dataclasses.replace(cfg.policy, device=device_type), dataset_stats=stats
    )
    pre.steps[0] = RenameObservationsProcessorStep(rename_map=cfg.rename_map)
    return pre, post


def plan_units_on_the_real_model(
    plan: TrainingPlan,
    policy: PreTrainedPolicy,
    trainee: nn.Module,
    pre: PolicyProcessorPipeline,
    device: torch.device,
) -> ShardingPlan:
    """The run's FSDP2 wrap units, chosen again once the main rank has run the still unsharded
    policy on one real batch, training forward and ``select_action``: a module whose forward
    that skips cannot be a unit (the size policy passes over it; a unit chosen by class is
    refused, naming it). Before the first step, so that this fails with a message instead of
    FSDP2's "mixed torch.Tensor and DTensor" in the middle of the model. Collective."""
    bypassed = run_on_main(
        _probe_forwards, plan, policy, trainee, pre, device, what="running the policy once"
    )
    return plan_sharding(trainee, plan.cfg.accelerator, type(policy)._fsdp_wrap_modules, bypassed)


@dataclass
class MetaBuilt:
    """A policy built on the meta device (sharded runs), with what materializes it."""

    policy: PreTrainedPolicy
    trainee: nn.Module
    pre: Any
    post: Any
    deferred: DeferredInit
    sharding: ShardingPlan
    load: Any = None  # reads --policy.path's weights shard by shard (safetensors_source)
    model_file: Path | None = None
    expected_keys: frozenset[str] = frozenset()

    def materialize(self, device: torch.device) -> None:
        """Every rank's shards (and the whole buffers) with the eager build's values."""
        try:
            self.deferred.materialize(self.trainee, device, self.load)
        finally:
            if self.load is not None:
                self.load.close()
        if self.load is not None and self.load.loaded != self.expected_keys:
            unread = sorted(self.expected_keys - self.load.loaded)
            raise RuntimeError(f"cannot load {self.model_file}: {unread[:5]} were not read")


def meta_build_enabled() -> bool:
    """Sharded runs build on the meta device unless LEROBOT_PIPE_META_BUILD=0 (a diagnostic
    switch: the eager build, for comparisons)."""
    import os

    return os.environ.get(C.ENV_META_BUILD, "1") != "0"


def _pretrained_file(policy_cfg) -> Path | None:
    """--policy.path's model.safetensors (None without one); Unsupported when the folder is an
    adapter (merged into its base when loaded) or has no such file (the eager build says why)."""
    from lerobot_pipe.distributed.meta_init import Unsupported

    if not policy_cfg.pretrained_path:
        return None
    folder = local_policy_folder(str(policy_cfg.pretrained_path))
    if (folder / C.ADAPTER_CONFIG_NAME).is_file():
        raise Unsupported("--policy.path is a LoRA adapter, merged into its base when loaded")
    model_file = folder / C.MODEL_SAFETENSORS
    if not model_file.is_file():
        raise Unsupported(f"no {C.MODEL_SAFETENSORS} in {folder}")
    return model_file


def build_on_meta(plan: TrainingPlan, env: DistEnv) -> MetaBuilt | str:
    """The policy (and its PEFT wrapper) built on the meta device, its wrap units probed there
    and planned: nothing of it in memory yet (distributed/meta_init.py). None, with the reason
    logged and returned, when it cannot be (a policy that reads a value while building or
    probing, a LoRA --policy.path, ...): the caller then builds eagerly. Collective; every rank
    agrees."""
    from lerobot_pipe.distributed.meta_init import Unsupported

    cfg = plan.cfg
    built, reason = None, None
    try:
        fill_features(cfg.policy, plan.dataset.features)
        pretrained_parts = plan.resume_from is None and not cfg.policy.pretrained_path
        model_file = _pretrained_file(cfg.policy)
        build = MetaBuild()
        with build.recording():
            policy = get_policy_class(cfg.policy.type)(
                cfg.policy, pretrained_parts=pretrained_parts
            )
        policy.train()
        state = policy.state_dict(keep_vars=True)  # the file's names, before PEFT's
        pre, post = make_processors(plan, env.device.type)
        trainee: nn.Module = policy
        if cfg.peft is not None:
            with build.recording():
                trainee = apply_peft(policy, cfg.peft, cfg.policy.pretrained_path)
        load, expected = None, frozenset()
        if model_file is not None:
            load, expected = _checkpoint_names(model_file, policy, state, trainee)
        elif sources := policy.pretrained_weight_sources():
            load, expected, model_file = _pretrained_part_names(sources, state, trainee)
        deferred = build.finish(trainee)
        built = (policy, trainee, pre, post, deferred, load, model_file, expected)
    except Unsupported as e:
        reason = str(e)
    except Exception as e:  # the eager build runs it again and reports what is really wrong
        reason = f"{type(e).__name__}: {e}"
    outcome = run_on_main(_probe_on_meta, plan, built, what="probing the policy on the meta device")
    if dist.is_initialized():  # every rank must have built it to go on
        agreed = [None] * dist.get_world_size()
        dist.all_gather_object(agreed, reason if built is None else None)
        reason = next((r for r in agreed if r is not None), None)
    if reason is None and outcome[0] != "ok":
        reason = outcome[1]
    if reason is not None:
        if env.is_main:
            log.warning(
                "Building the policy whole on every rank (not on the meta device): %s", reason
            )
        return reason
    policy, trainee, pre, post, deferred, load, model_file, expected = built
    sharding = plan_sharding(trainee, cfg.accelerator, type(policy)._fsdp_wrap_modules, outcome[1])
    return MetaBuilt(
        policy=policy,
        trainee=trainee,
        pre=pre,
        post=post,
        deferred=deferred,
        sharding=sharding,
        load=load,
        model_file=model_file,
        expected_keys=expected,
    )


def _checkpoint_names(model_file: Path, policy: PreTrainedPolicy, state: dict, trainee: nn.Module):
    """The loader of ``model_file`` into the trainee's names (PEFT's too), and the keys it must
    read; the checks of PreTrainedPolicy.from_pretrained (strict: the file's keys are the
    policy's state-dict keys, ``state``, taken before PEFT)."""
    from safetensors import safe_open

    from lerobot_pipe.distributed.meta_init import destinations

    with safe_open(str(model_file), framework="pt", device="cpu") as handle:
        file_keys = set(handle.keys())
    missing, unexpected = sorted(set(state) - file_keys), sorted(file_keys - set(state))
    if missing or unexpected:
        raise RuntimeError(
            f"{model_file} does not match {type(policy).__name__}: missing keys {missing}, "
            f"unexpected keys {unexpected}"
        )
    key_of = {id(t): k for k, t in state.items()}
    names = {name: key_of[id(t)] for name, t in destinations(trainee).items() if id(t) in key_of}
    return safetensors_source(model_file, names), frozenset(file_keys)


def _pretrained_part_names(sources: list, state: dict, trainee: nn.Module):
    """The loader of the parts a policy built on the meta device reads from their own
    pretrained files (``pretrained_weight_sources``, e.g. SmolVLA's VLM with load_vlm_weights),
    the keys it must read, and what it reads from. Every one of the part's state-dict entries
    must be in its files (a file may hold more, e.g. VLM layers past num_vlm_layers);
    Unsupported otherwise (the eager build then loads it as from_pretrained does)."""
    from lerobot_pipe.distributed.meta_init import Unsupported, destinations

    if len(sources) != 1:
        raise Unsupported(f"{len(sources)} pretrained parts to read: one is supported")
    prefix, model_id, files = sources[0]
    keys = set(files) if isinstance(files, dict) else _safetensors_keys(files)
    wanted = {k: k.removeprefix(prefix) for k in state if k.startswith(prefix)}
    lacking = sorted(k for k, key in wanted.items() if key not in keys)
    if lacking:
        raise Unsupported(f"{model_id}'s weights lack {lacking[:3]} ({len(lacking)} in all)")
    key_of = {id(t): wanted[k] for k, t in state.items() if k in wanted}
    names = {name: key_of[id(t)] for name, t in destinations(trainee).items() if id(t) in key_of}
    return safetensors_source(files, names), frozenset(wanted.values()), Path(model_id)


def _safetensors_keys(model_file: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(model_file), framework="pt", device="cpu") as handle:
        return set(handle.keys())


def _probe_on_meta(plan: TrainingPlan, built) -> tuple[str, Any]:
    """("ok", the bypassed modules) from the probe on the meta model, or ("eager", why not)."""
    if built is None:
        return ("eager", "the meta build failed")
    policy, trainee, pre = built[0], built[1], built[2]
    try:
        return ("ok", _probe_forwards(plan, policy, trainee, pre, torch.device("cpu"), True))
    except Exception as e:  # e.g. a policy that reads a value (.item()) in its forward
        return (
            "eager",
            f"probing its wrap units on the meta device failed ({type(e).__name__}: {e})",
        )


def make_sampler(
    plan: TrainingPlan, batch_size: int, rank: int, world: int, start_sample: int = 0
) -> GlobalBatchSampler | StreamSampler:
    """The batch order: a global permutation per epoch, or, streaming, whole episodes per rank
    (datasets/stream_sampler.py). Both are pure functions of the position."""
    cfg = plan.cfg
    indices = sample_indices(cfg.policy, plan.dataset, plan.heldout)
    if cfg.dataset.streaming:
        return StreamSampler(
            plan.dataset.episode_bounds,
            batch_size,
            rank,
            world,
            cfg.seed,
            start_sample,
            indices=indices,
            shuffle_buffer=cfg.dataset.streaming_shuffle_buffer,
        )
    return GlobalBatchSampler(
        len(plan.dataset), batch_size, rank, world, cfg.seed, start_sample, indices=indices
    )


def _probe_forwards(
    plan: TrainingPlan,
    policy: PreTrainedPolicy,
    trainee: nn.Module,
    pre: PolicyProcessorPipeline,
    device: torch.device,
    on_meta: bool = False,
) -> dict[str, str]:
    """find_bypassed_modules on a batch of two samples as the loop gets them; RNGs, buffers and
    the policy's queues are left as they were. ``on_meta``: the model is on the meta device
    (the batch is moved there, values read from it answer 1: unit_probe.MetaValues)."""
    cfg = plan.cfg
    sampler = make_sampler(plan, min(2, cfg.batch_size), 0, 1)
    with BatchPrefetcher(plan.dataset, sampler, 0, device=device) as loader:
        batch = pre(loader.next())
    features = policy.config.input_features
    # select_action takes one observation per sample: the newest of an observation window; the
    # preprocessor's language tokens (observation.language.*) go with it.
    observation = {
        key: value[:, -1] if value.dim() == len(features[key]["shape"]) + 2 else value
        for key, value in batch.items()
        if key in features
    }
    observation |= {k: v for k, v in batch.items() if k.startswith(OBS_LANGUAGE_PREFIX)}
    if on_meta:  # the model built on the meta device: the batch as shapes only
        batch, observation = (
            {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in d.items()}
            for d in (batch, observation)
        )
    else:
        trainee.to(device)
    with MetaValues() if on_meta else contextlib.nullcontext():
        return find_bypassed_modules(
            trainee,
            lambda: trainee(batch),
            lambda: policy.select_action(observation),
            reset=policy.reset,
        )


def prepare_session(plan: TrainingPlan, env: DistEnv) -> Session:
    """Verify the checkpoint to resume from (each rank hashing a share; a fallback gives a new
    plan), then build policy, processors, wrapping, optimizer, scheduler and scaler and restore
    the checkpoint onto this topology (resharding as needed). Collective."""
    cfg, dims = plan.cfg, plan.dims
    if cfg.dataset.streaming:  # before any batch: every rank reads the same commit
        check_same_revision(plan.dataset.revision, cfg.dataset.repo_id)
    checkpoints = CheckpointManager(
        plan.output_dir,
        total_steps=cfg.steps,
        save_freq=cfg.save_freq,
        enabled=cfg.save_checkpoint,
        checkpoint_format=cfg.checkpoint_format,
        sharded=dims.is_sharded,
        run_info=_training_step_record(plan),
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
    # Sharded: built on the meta device, each rank materializing its shards after sharding.
    meta = eager_reason = None
    if plan.sharding is not None:
        meta = build_on_meta(plan, env) if meta_build_enabled() else f"{C.ENV_META_BUILD}=0"
        if isinstance(meta, str):
            meta, eager_reason = None, meta
    sharding = plan.sharding
    if meta is not None:
        policy, trainee, pre, post, sharding = (
            meta.policy,
            meta.trainee,
            meta.pre,
            meta.post,
            meta.sharding,
        )
    else:
        seed_everything(cfg.seed)
        # A resumed run's checkpoint holds every weight: no pretrained backbone to read first.
        policy = make_policy(
            cfg.policy, plan.dataset.features, pretrained_parts=plan.resume_from is None
        )
        policy.train()
        pre, post = make_processors(plan, env.device.type)
        trainee = policy
        if cfg.peft is not None:
            trainee = apply_peft(policy, cfg.peft, cfg.policy.pretrained_path)
        if sharding is not None:
            sharding = plan_units_on_the_real_model(plan, policy, trainee, pre, env.device)
    adapter_keys = adapter_key_map(trainee) if cfg.peft is not None else None
    n_params = sum(p.numel() for p in trainee.parameters())
    n_trainable = sum(p.numel() for p in trainee.parameters() if p.requires_grad)

    if cfg.accelerator.activation_checkpointing.mode == "full":  # before sharding wraps them
        units = sharding.wrap_units if sharding is not None else None
        wrap_modules = cfg.accelerator.fsdp.wrap_modules
        policy_units = type(policy)._fsdp_wrap_modules
        checkpointed = checkpointed_units(trainee, wrap_modules, policy_units, units)
        apply_activation_checkpointing(trainee, checkpointed)
    model = apply_parallelism(trainee, dims, env, cfg.accelerator, sharding)
    if meta is not None:  # CPU-offloaded parameters live on the CPU
        meta.materialize(torch.device("cpu") if cfg.accelerator.fsdp.cpu_offload else env.device)
    # FSDP2 neither shards nor reduces ignored parameters: their gradients are averaged here
    # (taken after materializing, whose to_empty gives unsharded parameters new objects).
    ignored = sharding.ignored_parameters(trainee) if sharding is not None else []
    # Groups from the (in place sharded) policy itself: LeRobot's grouping and parameter order.
    scaled = cfg.accelerator.mixed_precision == "fp16"
    optimizer = make_optimizer(trainee.get_optim_params(), cfg.optimizer, fused=not scaled)
    scheduler = make_scheduler(optimizer, cfg.scheduler, cfg.steps)
    scaler = make_grad_scaler(env.device, dims, enabled=scaled)
    seed_everything(cfg.seed + env.rank)

    state = TrainState.build(
        model,
        optimizer,
        PolicyFiles(policy, trainee, pre, post, cfg),
        scheduler=scheduler,
        scaler=scaler,
        # The shadow of the trainee's (sharded in place) parameters: training/ema.py.
        ema=EMAState(trainee, cfg.ema) if cfg.ema.enable else None,
        stream=StreamState(plan.dataset.revision) if cfg.dataset.streaming else None,
        adapter_key_map=(lambda sd: {adapter_keys[k]: v for k, v in sd.items()})
        if adapter_keys
        else None,
    )
    checkpoints.load(state, plan.resume)
    if env.is_main:
        log.info("\n%s", banner(plan, env, (n_params, n_trainable), sharding))
    return Session(
        plan=plan,
        policy=policy,
        trainee=trainee,
        state=state,
        checkpoints=checkpoints,
        pre=pre,
        post=post,
        ignored=ignored,
        built_on_meta=meta is not None,
        eager_reason=eager_reason,
    )


def run_loop(env: DistEnv, session: Session, channel: EventChannel | None = None) -> Path | None:
    """Train the session's plan to its last step; the newest checkpoint this run wrote (or, when
    nothing was left to train, the one it resumed from). Progress events go to ``channel``."""
    plan, state, checkpoints = session.plan, session.state, session.checkpoints
    cfg, dims = plan.cfg, plan.dims
    ga = cfg.accelerator.gradient_accumulation.steps
    model, optimizer = session.model, session.optimizer
    scheduler, scaler, ema = state.scheduler, state.scaler, state.ema
    pre, ignored, start_step = session.pre, session.ignored, state.progress.step
    if start_step >= cfg.steps:
        checkpoints.shutdown()
        if env.is_main:
            log.info(
                "Checkpoint step %d already reaches --steps=%d: nothing to train",
                start_step,
                cfg.steps,
            )
        return plan.resume_from
    amp_dtype = autocast_dtype(cfg.accelerator, dims)

    sampler = make_sampler(
        plan, cfg.batch_size, env.rank, dims.dp_world_size, state.progress.samples_consumed
    )
    if state.stream is not None:
        sampler = state.stream.attach(sampler)
    prefetcher = BatchPrefetcher(plan.dataset, sampler, cfg.num_workers, device=env.device)
    metrics: MetricsLog | None = None
    timer = StepTimer(env.device)
    samples_per_step = cfg.batch_size * dims.dp_world_size
    trainable = [p for p in model.parameters() if p.requires_grad]
    progress = ProgressReporter(env.is_main, start_step, cfg.steps, samples_per_step, channel)
    autocast = (
        torch.autocast(env.device.type, dtype=amp_dtype)
        if amp_dtype is not None
        else contextlib.nullcontext()
    )
    is_ddp = isinstance(model, DistributedDataParallel)
    running = torch.zeros(2, dtype=torch.float64, device=env.device)  # loss sum, count
    grad_norm = torch.zeros((), device=env.device)
    window: list[dict[str, torch.Tensor]] = []
    rollouts = None
    try:
        metrics = open_metrics(plan, env)
        rollouts = open_rollouts(plan, env)
        for step in range(start_step + 1, cfg.steps + 1):
            faults.set_step(step)
            log_step = step % cfg.log_freq == 0 or step == cfg.steps
            timer.start()
            if not window:  # the micro-batches of one optimizer update
                window = [prefetcher.next() for _ in range(ga)]
                timer.lap("dataloading_s")
                loss_kwargs = _loss_normalizers(session.policy, window, env.device)
                timer.lap("update_s")
            batch = window.pop(0)
            batch = pre(to_device(batch, env.device, non_blocking=True))
            timer.lap("preprocessing_s")
            sync = step % ga == 0
            if dims.is_sharded:
                model.set_requires_gradient_sync(sync)
            no_sync = model.no_sync() if (is_ddp and not sync) else contextlib.nullcontext()
            with no_sync:
                with autocast:
                    loss, _ = model(batch, **loss_kwargs)
                scaler.scale(loss / ga).backward()
            faults.fault_point("train:after_backward")
            if sync:
                average_gradients(ignored)
                scaler.unscale_(optimizer)
                if cfg.optimizer.grad_clip_norm > 0:
                    grad_norm = clip_grad_norm(trainable, cfg.optimizer.grad_clip_norm)
                scaler.step(optimizer)
                faults.fault_point("train:after_optimizer_step")
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                if ema is not None:  # once per optimizer update (a skipped fp16 one too)
                    ema.update()
            if scheduler is not None:
                scheduler.step()
            running[0] += loss.detach().float()
            running[1] += 1
            timer.stop(sync=log_step)

            if log_step:
                stats = _reduce_mean(running.clone())
                times = timer.reduce()  # each the max over ranks
                record = {
                    "step": step,
                    "loss": stats[0].item() / max(stats[1].item(), 1),
                    "grad_norm": float(grad_norm),
                    "lr": optimizer.param_groups[0]["lr"],
                    "samples_per_s": samples_per_step / times["step_s"]
                    if times["step_s"] > 0
                    else 0.0,
                    **times,
                    "samples": sampler.samples_consumed,
                    "epoch": sampler.epochs_consumed,
                }
                if ema is not None:  # LeRobot main's names (W&B: train/ema/...)
                    record["ema/decay"] = ema.decay
                    record["ema/step"] = ema.optimization_step
                metrics.log(record)
                progress.set_loss(
                    record["loss"],
                    times["dataloading_s"] / times["step_s"] if times["step_s"] > 0 else None,
                )
                if env.is_main:
                    log.info(
                        "step %d/%d loss %.5f grad_norm %.3f lr %.2e %.1f samples/s "
                        "data_s %.3f prep_s %.3f updt_s %.3f step_s %.3f",
                        step,
                        cfg.steps,
                        record["loss"],
                        record["grad_norm"],
                        record["lr"],
                        record["samples_per_s"],
                        times["dataloading_s"],
                        times["preprocessing_s"],
                        times["update_s"],
                        times["step_s"],
                    )
                running.zero_()

            if cfg.eval_steps and step % cfg.eval_steps == 0:  # LeRobot's rule (not at the end)
                eval_loss = heldout_loss(
                    model,
                    pre,
                    plan.dataset,
                    plan.heldout,
                    batch_size=cfg.batch_size,
                    seed=cfg.seed,
                    rank=env.rank,
                    world_size=dims.dp_world_size,
                    device=env.device,
                    autocast=autocast,
                )
                metrics.log(
                    {
                        "step": step,
                        "eval_loss": eval_loss,
                        "eval_samples": plan.heldout.num_samples,
                    },
                    mode="eval",
                )
                progress.set_eval_loss(eval_loss)
                if env.is_main:
                    log.info("step %d: eval_loss=%.5f", step, eval_loss)

            state.progress.step = step
            state.progress.samples_consumed = sampler.samples_consumed
            saved = None
            if checkpoints.save(step, last_step=step == cfg.steps):
                # The newest durable checkpoint: this one (sync) or the one before (async).
                saved = checkpoints.last_saved
                metrics.checkpoint(saved)
            if rollouts is not None and step % cfg.env_eval_freq == 0:  # LeRobot's rule
                with evaluation_weights(ema, cfg.ema.use_for_eval):
                    info = rollouts.run(session.policy, pre, session.post, step, autocast)
                if info is not None:
                    record = env_eval_summary(info, step)
                    metrics.log(record, mode="eval")
                    log.info("%s", describe_rollouts(record, cfg.env.type))
            progress.update(step, running, saved)
        last_saved = checkpoints.close()  # training ends once the last save is durable
        metrics.checkpoint(last_saved)
    finally:
        checkpoints.shutdown()  # after an error: still lets the save in flight finish
        prefetcher.close()
        if rollouts is not None:
            rollouts.close()
        progress.close()
        if metrics is not None:
            metrics.close()
    if last_saved is not None and cfg.policy.push_to_hub:
        _push_final(plan, last_saved)
    return last_saved


def open_metrics(plan: TrainingPlan, env: DistEnv) -> MetricsLog:
    """Collective: the trackers, opened on the main rank (W&B starts its run there); when that
    fails (a login the server refuses, ...) every rank stops with its message."""
    opened: list[MetricsLog] = []
    # W&B's episodes and epochs count the training episodes (LeRobot's train dataset).
    num_frames, num_episodes = len(plan.dataset), plan.dataset.num_episodes
    if plan.heldout is not None:
        num_frames -= plan.heldout.num_held_out_frames
        num_episodes = len(plan.heldout.train_episodes)

    def _open() -> None:
        opened.append(
            MetricsLog(
                plan.cfg,
                start_step=plan.start_step,
                is_main=True,
                num_frames=num_frames,
                num_episodes=num_episodes,
                resumed_from=plan.resume_from,
            )
        )

    run_on_main(_open, error_type=TrackerError, what="starting the metrics trackers")
    return opened[0] if opened else MetricsLog(plan.cfg, start_step=plan.start_step, is_main=False)


def open_rollouts(plan: TrainingPlan, env: DistEnv) -> InTrainingEval | None:
    """The in-training rollouts of ``--env.*`` (None without an env), their environment made
    on every rank. Collective (the batch size is the main rank's)."""
    cfg = plan.cfg
    if cfg.env is None:
        return None
    return InTrainingEval(
        env_cfg=cfg.env,
        n_episodes=cfg.eval.n_episodes,
        batch_size=eval_batch_size(cfg.eval.n_episodes, cfg.eval.batch_size),
        seed=cfg.seed,
        output_dir=plan.output_dir,
        total_steps=cfg.steps,
        rank=env.rank,
        world_size=env.world_size,
        device=env.device,
        lockstep=plan.dims.is_sharded,
        use_async_envs=cfg.eval.use_async_envs,
    ).open()


def _push_final(plan: TrainingPlan, step_dir: Path) -> None:
    from lerobot_pipe.hub.publish import PublishError, publish_checkpoint
    from lerobot_pipe.utils.hub_http import redacted

    repo_id = plan.cfg.policy.repo_id
    run_on_main(
        publish_checkpoint,
        step_dir,
        repo_id,
        intermediate=False,
        step=int(step_dir.name),
        private=plan.cfg.policy.private,
        error_type=PublishError,
        describe=redacted,
        what="publishing",
    )
    log.info("Pushed %s to %s", step_dir / C.PRETRAINED_MODEL_DIR, repo_id)
