"""What a training configuration needs per GPU, before anything is launched, and which change
would make it fit: ``lerobot-pipe plan-memory`` and the pipeline's validate step.

:func:`plan_memory` takes lerobot-train's flags and the launch's size, and goes the way
lerobot-train's pre-flight goes (training/preflight.py): the config parsed and resolved, the
topology for the world size, the dataset opened (its features), the policy and its PEFT wrapper
built on the meta device (no weight read, no memory), the FSDP2 sharding decided on it. From
there: every parameter's shape, dtype, FSDP2 unit and whether the loss reaches it, the
activations its forward saves (training/activation_probe.py), and the arithmetic of
training/memory_model.py. When the total exceeds ``--gpu_memory_gb`` the plan lists the changes
that make it fit (:func:`suggest`), each planned again with its flags.
"""

from __future__ import annotations

import logging
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from lerobot_pipe.configs.optim import AdamConfig, AdamWConfig, SGDConfig
from lerobot_pipe.configs.parser import ConfigError, replace
from lerobot_pipe.distributed.activation_checkpointing import checkpointed_units
from lerobot_pipe.distributed.parallel_dims import resolve_parallelism
from lerobot_pipe.training.activation_probe import ActivationProfile, probe_activations
from lerobot_pipe.training.memory_model import (
    ASSUMPTIONS,
    GIB,
    ROWS,
    Activations,
    MemoryEstimate,
    Param,
    Setup,
    estimate,
    inside,
)

if TYPE_CHECKING:
    from lerobot_pipe.training.data import TrainingDataset
    from lerobot_pipe.training.preflight import TrainingPlan

log = logging.getLogger(__name__)

GB = 10**9  # --gpu_memory_gb counts as GPUs are sold: an "80 GB" H100 holds ~79 GiB
_DTYPE_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class Suggestion:
    flags: tuple[str, ...]
    total_bytes: int
    fits: bool

    def to_dict(self) -> dict:
        return {"flags": list(self.flags), "total_bytes": self.total_bytes, "fits": self.fits}


@dataclass(frozen=True)
class MemoryPlan:
    policy_type: str
    parameters: int
    trainable_parameters: int
    world_size: int
    nproc_per_node: int
    batch_size: int
    gpu_memory_bytes: int | None
    estimate: MemoryEstimate
    dtypes: dict
    activation_checkpointing: bool
    suggestions: tuple[Suggestion, ...] = field(default=())

    @property
    def total_bytes(self) -> int:
        return self.estimate.peak.total

    @property
    def fits(self) -> bool | None:
        if self.gpu_memory_bytes is None:
            return None
        return self.total_bytes <= self.gpu_memory_bytes

    def to_json(self) -> dict:
        peak = self.estimate.peak
        return {
            "parameters": self.parameters,
            "trainable_parameters": self.trainable_parameters,
            "world_size": self.world_size,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "peak_phase": self.estimate.peak_phase,
            "per_rank": {
                "parameters_bytes": peak.parameters,
                "gradients_bytes": peak.gradients,
                "optimizer_bytes": peak.optimizer,
                "ema_bytes": peak.ema,
                "gathered_bytes": peak.gathered,
                "activations_bytes": peak.activations,
                "allowance_bytes": peak.allowance,
                "total_bytes": peak.total,
                "host_bytes": self.estimate.host_bytes,
            },
            "dtypes": self.dtypes,
            "assumptions": list(ASSUMPTIONS),
            "fits": self.fits,
            "suggestions": [s.to_dict() for s in self.suggestions],
        }

    def describe(self) -> str:
        """The plan as a table: per phase, per term, GiB per rank."""
        setup, est = self.estimate.setup, self.estimate
        # MiB for a model whose counted bytes stay under 1 GiB (the tests' tiny policies).
        small = max(b.counted for b in est.phases.values()) < GIB
        unit, unit_name = (2**20, "MiB") if small else (GIB, "GiB")
        mode = (
            f"FSDP2 over {setup.dp_shard}"
            if setup.sharded
            else ("DDP" if setup.world_size > 1 else "one process")
        )
        lines = [
            f"Memory plan: {self.policy_type}, {self.parameters:,} parameters "
            f"({self.trainable_parameters:,} trainable); {self.world_size} process(es), {mode}; "
            f"batch {self.batch_size} per rank; {unit_name} per rank:",
            f"  {'phase':<10}{'params':>9}{'grads':>9}{'optim':>9}{'ema':>9}{'gathered':>9}"
            f"{'activ.':>9}{'allow.':>9}{'total':>9}",
        ]
        for name, b in est.phases.items():
            mark = "  <- peak" if name == est.peak_phase else ""
            cells = (b.parameters, b.gradients, b.optimizer, b.ema, b.gathered, b.activations)
            lines.append(
                f"  {name:<10}"
                + "".join(f"{c / unit:>9.2f}" for c in cells)
                + f"{b.allowance / unit:>9.2f}{b.total / unit:>9.2f}{mark}"
            )
        if est.host_bytes:
            lines.append(f"  host memory per node (CPU offload): {est.host_bytes / GIB:.2f} GiB")
        if self.gpu_memory_bytes is not None:
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(
                f"  peak {self.total_bytes / GIB:.2f} GiB against "
                f"{self.gpu_memory_bytes / GB:g} GB ({self.gpu_memory_bytes / GIB:.2f} GiB): "
                f"{verdict}"
            )
        else:
            lines.append(f"  peak {self.total_bytes / GIB:.2f} GiB (no GPU size given)")
        if self.suggestions:
            lines.append("  changes, ranked (new total per rank):")
            for s in self.suggestions:
                fit = "fits" if s.fits else "does not fit"
                lines.append(f"    {' '.join(s.flags)}: {s.total_bytes / GIB:.2f} GiB, {fit}")
        lines.append("  assumed: " + "; ".join(ASSUMPTIONS))
        return "\n".join(lines)


def with_flags(argv: list[str], changes: dict[str, object]) -> list[str]:
    """``argv`` with each ``--key=value`` of ``changes`` replacing that key's flag."""
    from lerobot_pipe.configs.parser import split_flags

    return [f"--{k}={v}" for k, v in {**split_flags(argv), **changes}.items()]


def plan_memory(
    argv: list[str],
    world_size: int,
    nproc_per_node: int | None = None,
    gpu_memory_bytes: int | None = None,
    *,
    suggest: bool = True,
    dataset: TrainingDataset | None = None,
) -> MemoryPlan:
    """The memory plan of lerobot-train's flags ``argv`` launched on ``world_size`` processes
    (``nproc_per_node`` per node: CPU offload's host memory is per node)."""
    from lerobot_pipe.configs.loading import parse_train_config
    from lerobot_pipe.training.config_checks import resolve_config
    from lerobot_pipe.training.data import open_dataset
    from lerobot_pipe.training.preflight import TrainingPlan

    cfg, _ = parse_train_config(argv)
    cfg = resolve_config(cfg)
    dims = resolve_parallelism(cfg.parallelism, world_size)
    if dataset is None:
        dataset = open_dataset(cfg, None, 0)
    plan = TrainingPlan(cfg=cfg, dims=dims, dataset=dataset)
    nproc = nproc_per_node or world_size
    memory = plan_for(plan, nproc, gpu_memory_bytes)
    if suggest and memory.fits is False:
        memory = replace(
            memory, suggestions=tuple(suggest_changes(argv, memory, dataset, gpu_memory_bytes))
        )
    return memory


def plan_for(
    plan: TrainingPlan, nproc_per_node: int, gpu_memory_bytes: int | None = None
) -> MemoryPlan:
    """The memory plan of a pre-flight's :class:`TrainingPlan` (its sharding decided here again
    on a fresh meta-device build, whose forwards the activation probe runs)."""
    from lerobot_pipe.training.data import make_processors
    from lerobot_pipe.training.preflight import build_on_meta_for_checks, decide_sharding

    cfg, dims = plan.cfg, plan.dims
    policy, trainee = build_on_meta_for_checks(cfg, plan.dataset)
    cfg = replace(cfg, policy=policy.config)
    plan = replace(plan, cfg=cfg)
    accelerator = cfg.accelerator
    policy_units = type(policy)._fsdp_wrap_modules
    sharding = None
    if dims.is_sharded:
        plan = decide_sharding(plan, policy, trainee)
        sharding = plan.sharding
        units = list(sharding.wrap_units)
    else:
        try:
            units = checkpointed_units(trainee, accelerator.fsdp.wrap_modules, policy_units, None)
        except ConfigError:
            units = []
    precision = sharding.mp_policy if sharding is not None else None
    mp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accelerator.mixed_precision)
    compute = precision.param_dtype if precision is not None else mp
    reduce = (precision.reduce_dtype or compute) if precision is not None else None
    ignored = set(sharding.ignored_modules) if sharding is not None else set()
    rows = set(sharding.vocab_parallel) if sharding is not None else set()
    n_params = sum(p.numel() for p in trainee.parameters())
    n_trainable = sum(p.numel() for p in trainee.parameters() if p.requires_grad)
    shapes = [
        (name, tuple(p.shape), p.dtype, p.requires_grad) for name, p in trainee.named_parameters()
    ]
    pre, _ = make_processors(plan, "cpu")
    profile = probe_activations(plan, trainee, pre, units, compute)
    params, kept = [], Counter()
    for name, shape, dtype, trainable in shapes:
        if sharding is not None and compute is not None and trainable and dtype.is_floating_point:
            dtype = torch.float32  # FSDP2's master weights (parallelize.keep_trainable_in_float32)
        kept[_DTYPE_NAME.get(dtype, str(dtype).removeprefix("torch."))] += math.prod(shape)
        owner = max((u for u in units if inside(name, u)), key=len, default="")
        unit = None
        if sharding is not None and any(inside(name, m) for m in rows):
            unit = ROWS
        elif sharding is not None and not any(inside(name, m) for m in ignored):
            unit = owner
        params.append(
            Param(
                name=name,
                shape=shape,
                itemsize=dtype.itemsize,
                trainable=trainable,
                reached=name in profile.reached,
                unit=unit,
                saved=name in profile.saved_parameters,
                owner=owner,
            )
        )
    checkpointing = accelerator.activation_checkpointing.mode == "full"
    acts = activations_at(profile, cfg.batch_size, set(units) if checkpointing else set())
    setup = _setup(cfg, dims, nproc_per_node, compute, reduce, ignored)
    dtypes = {
        "parameters": dict(kept),  # elements per dtype, as the run keeps them
        "compute": _DTYPE_NAME[compute] if compute is not None else "as kept",
        "reduce": _DTYPE_NAME[reduce] if reduce is not None else "as kept",
        "optimizer_state": "as the parameters",
        "ema": "float32" if cfg.ema.enable else None,
    }
    return MemoryPlan(
        policy_type=cfg.policy.type,
        parameters=n_params,
        trainable_parameters=n_trainable,
        world_size=dims.world_size,
        nproc_per_node=nproc_per_node,
        batch_size=cfg.batch_size,
        gpu_memory_bytes=gpu_memory_bytes,
        estimate=estimate(params, setup, acts),
        dtypes=dtypes,
        activation_checkpointing=checkpointing,
    )


def activations_at(profile: ActivationProfile, batch: int, checkpointed: set[str]) -> Activations:
    """The probe's linear figures at ``batch``, with these units checkpointed. A unit inside a
    checkpointed one (pi's MLPs in their decoder layers) runs plainly within it
    (activation_checkpointing.py): the outer one keeps its inputs only and recomputes both."""
    outer = {u for u in checkpointed if not any(inside(u, o) for o in checkpointed - {u})}
    kept, recompute = {}, {}
    for name, linear in profile.units.items():
        owner = next((o for o in outer if inside(name, o)), None)
        if owner is None:
            kept[name] = linear.at(batch)
            continue
        if owner == name:
            kept[name] = profile.inputs[name].at(batch)
        else:
            kept[name] = 0
        recompute[owner] = recompute.get(owner, 0) + linear.at(batch)
    return Activations(
        root=profile.root.at(batch), units=kept, recompute=recompute, order=profile.order
    )


def _setup(cfg, dims, nproc_per_node, compute, reduce, ignored) -> Setup:
    accelerator, opt = cfg.accelerator, cfg.optimizer
    if isinstance(opt, AdamWConfig | AdamConfig):
        kind = "adamw" if isinstance(opt, AdamWConfig) else "adam"
    elif isinstance(opt, SGDConfig):
        kind = "sgd"
    else:
        kind = "adamw"
    # training/optim.make_optimizer: fused unless fp16's scaler or a group mixing DTensors with
    # plain tensors (FSDP2-ignored modules); torch's default on a GPU otherwise is foreach.
    fused = kind != "sgd" and accelerator.mixed_precision != "fp16" and not ignored
    return Setup(
        world_size=dims.world_size,
        nproc_per_node=min(nproc_per_node, dims.world_size),
        dp_shard=dims.dp_shard if dims.is_sharded else 1,
        compute_itemsize=compute.itemsize if compute is not None else None,
        reduce_itemsize=reduce.itemsize if reduce is not None else None,
        autocast=compute is not None and not dims.is_sharded,
        optimizer=kind,
        momentum=isinstance(opt, SGDConfig) and bool(opt.momentum),
        optimizer_impl="fused" if fused else "foreach",
        ema=cfg.ema.enable,
        accumulation=accelerator.gradient_accumulation.steps,
        reshard_after_forward=accelerator.fsdp.reshard_after_forward,
        cpu_offload=dims.is_sharded and accelerator.fsdp.cpu_offload,
        bucket_view=accelerator.ddp.gradient_as_bucket_view,
    )


def suggest_changes(
    argv: list[str], memory: MemoryPlan, dataset, gpu_memory_bytes: int
) -> list[Suggestion]:
    """The changes that make the plan fit, ranked from the smallest: more shards, activation
    checkpointing, bf16, LoRA or ``train_expert_only``, a smaller batch with gradient
    accumulation keeping the effective batch, CPU offload; each planned again with its flags.
    When no single change fits, the cumulative ones follow."""
    from lerobot_pipe.configs.loading import parse_train_config

    cfg, _ = parse_train_config(argv)
    setup = memory.estimate.setup
    world = memory.world_size
    nproc = memory.nproc_per_node
    candidates: list[tuple[dict, int]] = []
    if world > 1 and not setup.sharded:  # shard over the GPUs already there
        candidates.append(
            ({"parallelism.dp_shard": world, "parallelism.dp_replicate": "null"}, world)
        )
    shards = max(2, setup.dp_shard * 2) if setup.sharded or world == 1 else 2 * world
    while shards <= 64:
        candidates.append(
            ({"parallelism.dp_shard": shards, "parallelism.dp_replicate": "null"}, shards)
        )
        shards *= 2
    if not memory.activation_checkpointing:
        candidates.append(({"accelerator.activation_checkpointing.mode": "full"}, world))
    if cfg.accelerator.mixed_precision == "no":
        candidates.append(({"accelerator.mixed_precision": "bf16"}, world))
    if hasattr(cfg.policy, "train_expert_only") and not cfg.policy.train_expert_only:
        candidates.append(({"policy.train_expert_only": "true"}, world))
    if cfg.peft is None:
        candidates.append(({"peft.method_type": "LORA"}, world))
    ga = cfg.accelerator.gradient_accumulation.steps
    batch, factor = cfg.batch_size, 2
    while batch // factor >= 1 and batch % factor == 0:
        candidates.append(
            (
                {
                    "batch_size": batch // factor,
                    "accelerator.gradient_accumulation.steps": ga * factor,
                },
                world,
            )
        )
        factor *= 2
    if setup.sharded and not setup.cpu_offload:
        candidates.append(({"accelerator.fsdp.cpu_offload": "true"}, world))

    results: list[Suggestion] = []
    tried_shards = False
    for changes, new_world in candidates:
        is_shards = "parallelism.dp_shard" in changes
        if is_shards and tried_shards:
            continue  # only the smallest shard count that fits
        suggestion = _try(argv, changes, new_world, world, nproc, gpu_memory_bytes, dataset)
        if suggestion is None:
            continue
        if is_shards and suggestion.fits:
            tried_shards = True
        results.append(suggestion)
    shard_rows = [s for s in results if any("dp_shard" in f for f in s.flags)]
    # Of the shard counts and the batch sizes, the first that fits (none when none does).
    keep_shard = next((s for s in shard_rows if s.fits), None)
    batch_rows = [s for s in results if any(f.startswith("--batch_size") for f in s.flags)]
    keep_batch = next((s for s in batch_rows if s.fits), None)
    results = [
        s
        for s in results
        if (s not in shard_rows or s is keep_shard) and (s not in batch_rows or s is keep_batch)
    ]
    if not any(s.fits for s in results):
        combined: dict = {}
        combined_world = world
        for changes, new_world in candidates:
            if "parallelism.dp_shard" in changes or "batch_size" in changes:
                continue
            if "peft.method_type" in changes and "policy.train_expert_only" in combined:
                continue
            combined |= changes
            combined_world = max(combined_world, new_world)
            if len(combined) == len(changes):  # one change alone is listed already
                continue
            suggestion = _try(
                argv, combined, combined_world, world, nproc, gpu_memory_bytes, dataset
            )
            if suggestion is not None:
                results.append(suggestion)
                if suggestion.fits:
                    break
    order = {id(s): i for i, s in enumerate(results)}
    return sorted(results, key=lambda s: (not s.fits, order[id(s)]))


def _try(argv, changes, world, old_world, nproc, gpu_memory_bytes, dataset) -> Suggestion | None:
    flags = [f"--{k}={v}" for k, v in changes.items()]
    if world != old_world:
        flags.append(f"--world_size={world}")
    try:
        planned = plan_memory(
            with_flags(argv, changes),
            world,
            min(nproc, world),
            gpu_memory_bytes,
            suggest=False,
            dataset=dataset,
        )
    except (ConfigError, ValueError) as e:
        log.debug("not suggested: %s (%s)", flags, e)
        return None
    return Suggestion(tuple(flags), planned.total_bytes, bool(planned.fits))


def check_memory(
    plan: TrainingPlan,
    argv: list[str],
    nproc_per_node: int,
    gpu_memory_bytes: int | None,
    host_memory_bytes: int | None,
    ranks_on_host: bool = False,
) -> MemoryPlan | None:
    """The pipeline's validate step: the memory plan of a pre-flight's plan, logged; a
    ConfigError naming the ranked suggestions when it does not fit the GPU, or (CPU offload, or
    no GPU size: the ranks run on the host) the node's host memory. None, with the reason
    logged, when it cannot be planned (a streamed dataset: the probe would read from the Hub).
    ``ranks_on_host``: the ranks train on the CPU, their whole plan is host memory."""
    if plan.cfg.dataset.streaming:
        log.info("memory plan skipped: --dataset.streaming=true (the probe would read the Hub)")
        return None
    try:
        memory = plan_for(plan, nproc_per_node, gpu_memory_bytes)
    except ConfigError:
        raise
    except Exception as e:  # the plan informs; training itself is checked already
        log.warning("memory plan not available: %s: %s", type(e).__name__, e)
        return None
    if memory.fits is False:
        memory = replace(
            memory,
            suggestions=tuple(suggest_changes(argv, memory, plan.dataset, gpu_memory_bytes)),
        )
    log.info("%s", memory.describe())
    if memory.fits is False:
        fitting = [s for s in memory.suggestions if s.fits]
        changes = "; ".join(
            f"{' '.join(s.flags)} ({s.total_bytes / GIB:.1f} GiB)" for s in fitting[:5]
        )
        raise ConfigError(
            f"the run needs {memory.total_bytes / GIB:.1f} GiB per GPU at its peak "
            f"({memory.estimate.peak_phase}) and the GPU holds {gpu_memory_bytes / GIB:.1f} GiB "
            f"(slurm.gpu_memory_gb={gpu_memory_bytes / GB:g}): "
            + (f"changes that fit: {changes}" if changes else "no single change found fits")
        )
    peak = memory.estimate.peak
    on_host = memory.estimate.host_bytes
    if ranks_on_host:
        on_host += peak.counted * memory.nproc_per_node
    if host_memory_bytes is not None and on_host > host_memory_bytes:
        raise ConfigError(
            f"the run needs {on_host / GIB:.1f} GiB of host memory per node "
            f"({memory.nproc_per_node} process(es)) and slurm.mem_mb gives "
            f"{host_memory_bytes / GIB:.1f} GiB: raise slurm.mem_mb to at least "
            f"{-(-on_host // 2**20)}"
        )
    return memory


def banner_line(plan: TrainingPlan, nproc_per_node: int, device: torch.device) -> str | None:
    """The trainer banner's line: the plan's peak per rank, against the GPU's memory on a GPU;
    None when it cannot be planned (the reason at debug level): the plan informs, it never
    stops a run that passed its pre-flight."""
    if plan.cfg.dataset.streaming:
        return None
    if getattr(plan.cfg.policy, "upstream_class", None) is not None:
        # LeRobot's own class (policies/lerobot_bridge): its forward may hold collectives (vqbet
        # all-reduces), which a probe on the main rank alone would leave waiting.
        return None
    gpu = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    from huggingface_hub import constants as hub

    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = [device] if device.type == "cuda" else []
    # What the plan reads (a VLM's config, a tokenizer) the run has just read: from the Hub's
    # cache only, so that a log line never waits on the network.
    offline, hub.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE, True
    try:
        with torch.random.fork_rng(devices=devices):  # the run draws as without the plan
            memory = plan_for(plan, nproc_per_node, gpu)
    except Exception as e:  # noqa: BLE001 - see the docstring
        log.debug("no memory plan: %s: %s", type(e).__name__, e)
        return None
    finally:
        hub.HF_HUB_OFFLINE = offline
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    line = (
        f"Memory plan: {memory.total_bytes / GIB:.2f} GiB per rank at the peak "
        f"({memory.estimate.peak_phase}, incl. an allowance of "
        f"{memory.estimate.peak.allowance / GIB:.2f} GiB)"
    )
    if gpu is not None:
        line += f" of the GPU's {gpu / GIB:.1f} GiB"
    return line
