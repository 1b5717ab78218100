"""Apply the data-parallel topology to a policy: DDP, FSDP2 (``fully_shard``) or HSDP.

All sharding decisions live here: which submodules become FSDP2 units, the mesh, mixed
precision and offload policies. Everything else sees only the returned module.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from lerobot_pipe.configs.parser import ConfigError
from lerobot_pipe.configs.train import AcceleratorConfig, FSDPConfig
from lerobot_pipe.distributed.batch_norm import convert_sync_batch_norm
from lerobot_pipe.distributed.parallel_dims import ParallelDims
from lerobot_pipe.distributed.runtime import DistEnv
from lerobot_pipe.distributed.unit_probe import UNIT_ENTRY, has_unit_entry
from lerobot_pipe.distributed.vocab_parallel import declares_vocab_parallel, shard_rows

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_PRECISION_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(accelerator: AcceleratorConfig, dims: ParallelDims) -> torch.dtype | None:
    """DDP and single-process runs use autocast; sharded runs use FSDP2's policy instead."""
    if dims.is_sharded:
        return None
    return _PRECISION_DTYPE.get(accelerator.mixed_precision)


def _module_classes(model: nn.Module) -> list[str]:
    return sorted({type(m).__name__ for m in model.modules()})


def select_wrap_units(
    model: nn.Module,
    fsdp: FSDPConfig,
    policy_wrap_modules: list[str],
    bypassed: Mapping[str, str] | None = None,
    passed_over: list[str] | None = None,
) -> list[tuple[str, nn.Module]]:
    """The submodules that become FSDP2 units, in the documented resolution order:
    ``wrap_modules``, else ``min_num_params``, else the policy's ``_fsdp_wrap_modules``.

    ``bypassed`` (module name -> a parameter of it used while its forward was not running:
    :func:`~lerobot_pipe.distributed.unit_probe.find_bypassed_modules`) are modules that cannot be
    units: the size policy passes over them (their children may become units instead; the ones it
    would have chosen are appended to ``passed_over``); a unit chosen by class that is one of them
    is refused, naming it."""
    bypassed = bypassed or {}
    passed_over = passed_over if passed_over is not None else []
    if fsdp.wrap_modules is not None and fsdp.min_num_params is not None:
        raise ConfigError(
            "--accelerator.fsdp.wrap_modules and --accelerator.fsdp.min_num_params are mutually "
            "exclusive; pass one of them"
        )
    named = [(n, m) for n, m in model.named_modules() if n]
    if fsdp.min_num_params is not None:
        # Bottom-up, like FSDP1's size-based policy: a module becomes a unit when the parameters
        # not already in a unit below it reach the threshold (the root is always the last unit).
        units, covered = [], set()
        for name, module in reversed(named):  # children before their parents
            remaining = [p for p in module.parameters() if id(p) not in covered]
            if sum(p.numel() for p in remaining) >= fsdp.min_num_params:
                if name in bypassed:
                    passed_over.append(name)  # its parameters stay for the unit above it
                    continue
                units.append((name, module))
                covered.update(id(p) for p in remaining)
        units.reverse()
        if not units:
            raise ConfigError(
                f"--accelerator.fsdp.min_num_params={fsdp.min_num_params}: no submodule has that "
                "many parameters; lower it or pass --accelerator.fsdp.wrap_modules"
            )
        return units
    class_names = fsdp.wrap_modules if fsdp.wrap_modules is not None else policy_wrap_modules
    flag = (
        "--accelerator.fsdp.wrap_modules"
        if fsdp.wrap_modules is not None
        else "the policy's _fsdp_wrap_modules"
    )
    if not class_names:
        raise ConfigError(
            "sharding needs wrap units: pass --accelerator.fsdp.wrap_modules='[\"ClassName\"]' or "
            "--accelerator.fsdp.min_num_params=N (this policy declares no _fsdp_wrap_modules)"
        )
    present = set(_module_classes(model))
    missing = [c for c in class_names if c not in present]
    # A policy names the units of its optional parts too (the backbone exists with cameras only).
    policy_default = fsdp.wrap_modules is None and len(missing) < len(class_names)
    if missing and not policy_default:
        raise ConfigError(
            f"{flag}: {', '.join(missing)} match no module of the model; module classes present: "
            f"{', '.join(sorted(present))}"
        )
    units = [(n, m) for n, m in named if type(m).__name__ in class_names]
    refused = [n for n, _ in units if n in bypassed]
    if refused:
        shown = "; ".join(f"{n} (its {bypassed[n]} is used outside it)" for n in refused[:3])
        more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
        raise ConfigError(
            f"{flag}: FSDP2 gathers a unit's parameters when its forward runs, and the policy "
            f"uses these units without calling their forward: {shown}{more}; name classes whose "
            "forward runs (their children or parents), or pass "
            "--accelerator.fsdp.min_num_params=N, which passes over such modules, or train "
            "with DDP (--parallelism.dp_shard=1), which needs no units"
        )
    return units


def check_shared_parameters(model: nn.Module, units: list[tuple[str, nn.Module]]) -> None:
    """Fail before the first step when one parameter would be managed by two FSDP units (each
    occurrence of a parameter belongs to the innermost unit above it, or to the root)."""
    unit_names = [name for name, _ in units]
    first_seen: dict[int, tuple[str, str]] = {}
    for full_name, p in model.named_parameters(remove_duplicate=False):
        unit = _unit_of(full_name, unit_names)
        other_name, other_unit = first_seen.setdefault(id(p), (full_name, unit))
        if other_unit != unit:
            raise ConfigError(
                f"parameter {full_name} is shared (tied) with {other_name}, which sits in another "
                f"FSDP unit ({other_unit or 'the root'}, not {unit or 'the root'}); tied parameters "
                "must sit in one unit: choose wrap units that contain both "
                "(--accelerator.fsdp.wrap_modules) or untie them"
            )


def _unit_of(full_name: str, unit_names: list[str]) -> str:
    """The innermost unit above a parameter ('' for the root)."""
    return max((u for u in unit_names if full_name.startswith(u + ".")), key=len, default="")


def check_unit_dtypes(
    model: nn.Module,
    units: list[tuple[str, nn.Module]],
    mp_policy: MixedPrecisionPolicy,
    ignored_modules: list[str] = (),
) -> None:
    """Without a mixed-precision policy FSDP2 reduces each unit's gradients in their own dtype,
    one dtype per unit: a unit whose trainable parameters mix dtypes (a bf16 base with fp32
    heads, smolvla_base) is refused before the first step, naming it and the flag. With one,
    every trainable parameter is kept in float32 (apply_fsdp), frozen ones keep theirs."""
    if mp_policy.param_dtype is not None:
        return
    unit_names = [name for name, _ in units]
    seen: dict[str, dict[torch.dtype, str]] = {}
    for full_name, p in model.named_parameters():
        if p.requires_grad and not any(full_name.startswith(m + ".") for m in ignored_modules):
            seen.setdefault(_unit_of(full_name, unit_names), {}).setdefault(p.dtype, full_name)
    for unit, dtypes in seen.items():
        if len(dtypes) > 1:
            shown = ", ".join(
                f"{name} is {str(d).removeprefix('torch.')}" for d, name in dtypes.items()
            )
            raise ConfigError(
                f"FSDP2 unit {unit or '(the root)'}: its trainable parameters mix dtypes ({shown}), "
                "and FSDP2 reduces one gradient dtype per unit; pass "
                "--accelerator.mixed_precision=bf16 (trainable parameters are then kept in "
                "float32, frozen ones in their dtype)"
            )


def keep_trainable_in_float32(model: nn.Module) -> None:
    """Under a mixed-precision policy: every trainable floating parameter in float32 (the
    optimizer's master copy, checkpointed so); frozen ones keep their dtype."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
                p.data = p.data.float()


def mixed_precision_policy(accelerator: AcceleratorConfig) -> MixedPrecisionPolicy:
    custom = accelerator.fsdp.mixed_precision_policy
    if custom.is_set():
        if custom.param_dtype is None:
            raise ConfigError(
                "--accelerator.fsdp.mixed_precision_policy.param_dtype must be set once any "
                "mixed_precision_policy field is set"
            )
        for name in ("param_dtype", "reduce_dtype", "output_dtype"):
            value = getattr(custom, name)
            if value is not None and value not in DTYPES:
                raise ConfigError(
                    f"--accelerator.fsdp.mixed_precision_policy.{name}={value!r}: choose one of "
                    f"{', '.join(DTYPES)}"
                )
        if (
            "float16" in (custom.param_dtype, custom.reduce_dtype)
            and accelerator.mixed_precision != "fp16"
        ):
            raise ConfigError(
                "float16 in --accelerator.fsdp.mixed_precision_policy needs "
                "--accelerator.mixed_precision=fp16 (which builds the loss scaler)"
            )
        kwargs = {"param_dtype": DTYPES[custom.param_dtype]}
        if custom.reduce_dtype is not None:
            kwargs["reduce_dtype"] = DTYPES[custom.reduce_dtype]
        if custom.output_dtype is not None:
            kwargs["output_dtype"] = DTYPES[custom.output_dtype]
        if custom.cast_forward_inputs is not None:
            kwargs["cast_forward_inputs"] = custom.cast_forward_inputs
        return MixedPrecisionPolicy(**kwargs)
    dtype = _PRECISION_DTYPE.get(accelerator.mixed_precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def build_mesh(dims: ParallelDims, env: DistEnv) -> DeviceMesh:
    if dims.dp_replicate > 1:
        return init_device_mesh(
            env.device.type,
            (dims.dp_replicate, dims.dp_shard),
            mesh_dim_names=("dp_replicate", "dp_shard"),
        )
    return init_device_mesh(env.device.type, (dims.dp_shard,), mesh_dim_names=("dp_shard",))


PEFT_PREFIX = "base_model.model."  # PeftModel's path to the policy


def ignored_module_names(model: nn.Module, pattern: str | None) -> list[str]:
    """The modules (with parameters) whose names ``--accelerator.fsdp.ignored_modules`` matches."""
    if not pattern:
        return []
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise ConfigError(
            f"--accelerator.fsdp.ignored_modules={pattern!r}: invalid regex ({e})"
        ) from None
    names = [
        n
        for n, m in model.named_modules()
        if n and regex.search(n) and next(m.parameters(), None) is not None
    ]
    if not names:
        hint = ""
        if any(n.startswith(PEFT_PREFIX) for n, _ in model.named_modules()):
            hint = (
                f"; with --peft.* module names start with {PEFT_PREFIX!r} (e.g. "
                f"{PEFT_PREFIX}model.state_proj): start the pattern with '.*'"
            )
        raise ConfigError(
            f"--accelerator.fsdp.ignored_modules={pattern!r} matches no module with "
            f"parameters{hint}"
        )
    return names


@dataclass(frozen=True)
class ShardingPlan:
    """How FSDP2 wraps the policy, decided once before launch on the meta-device model (where
    every check of it fails with a message) and applied to the real model by name."""

    wrap_units: tuple[str, ...]  # module names that become FSDP2 units, in model order
    ignored_modules: tuple[str, ...]  # modules whose parameters FSDP2 neither shards nor reduces
    mp_policy: MixedPrecisionPolicy  # the units' mixed-precision policy
    # modules the size policy would have made units but passed over: their forward is bypassed
    passed_over: tuple[str, ...] = ()
    # embeddings sharded by rows and never gathered (lerobot_pipe/distributed/vocab_parallel.py)
    vocab_parallel: tuple[str, ...] = ()

    def ignored_parameters(self, model: nn.Module) -> list[nn.Parameter]:
        """The parameters of the ignored modules (each once), whose gradients the loop averages."""
        params = {
            id(p): p
            for name in self.ignored_modules
            for p in model.get_submodule(name).parameters()
        }
        return list(params.values())


def plan_sharding(
    model: nn.Module,
    accelerator: AcceleratorConfig,
    policy_wrap_modules: list[str],
    bypassed: Mapping[str, str] | None = None,
) -> ShardingPlan:
    """Choose the wrap units (none of the ``bypassed`` modules), check that no tied parameter
    spans two of them, match the ignored modules and build the precision policy; ConfigError
    naming the flag when one cannot be."""
    passed_over: list[str] = []
    units = select_wrap_units(model, accelerator.fsdp, policy_wrap_modules, bypassed, passed_over)
    ignored = ignored_module_names(model, accelerator.fsdp.ignored_modules)
    vocab_parallel = vocab_parallel_modules(model, units, ignored)
    if accelerator.fsdp.cpu_offload:
        # Offloaded shards live on the host, the lookup's on the device: such an embedding is
        # a unit of its own instead (gathered on its forward).
        order = {name: i for i, (name, _) in enumerate(model.named_modules())}
        units += [(name, model.get_submodule(name)) for name in vocab_parallel]
        units.sort(key=lambda unit: order[unit[0]])
        vocab_parallel = []
    check_shared_parameters(model, units)
    mp_policy = mixed_precision_policy(accelerator)
    check_unit_dtypes(model, units, mp_policy, ignored + vocab_parallel)
    return ShardingPlan(
        wrap_units=tuple(name for name, _ in units),
        passed_over=tuple(passed_over),
        ignored_modules=tuple(ignored),
        mp_policy=mp_policy,
        vocab_parallel=tuple(vocab_parallel),
    )


def vocab_parallel_modules(
    model: nn.Module, units: list[tuple[str, nn.Module]], ignored: list[str]
) -> list[str]:
    """The modules that declare themselves vocab-parallel (``fsdp_vocab_parallel``) and that
    would otherwise sit in the root unit: no wrap unit covers them and they are not ignored."""
    covering = [name for name, _ in units] + list(ignored)
    return [
        name
        for name, module in model.named_modules()
        if name
        and declares_vocab_parallel(module)
        and not any(name == c or name.startswith(c + ".") for c in covering)
    ]


def apply_fsdp(
    model: nn.Module,
    dims: ParallelDims,
    env: DistEnv,
    accelerator: AcceleratorConfig,
    sharding: ShardingPlan,
) -> nn.Module:
    fsdp = accelerator.fsdp
    ignored = set(sharding.ignored_parameters(model))
    mesh = build_mesh(dims, env)
    kwargs = {
        "mesh": mesh,
        "reshard_after_forward": fsdp.reshard_after_forward,
        "offload_policy": CPUOffloadPolicy(pin_memory=env.device.type == "cuda")
        if fsdp.cpu_offload
        else OffloadPolicy(),
        "ignored_params": ignored or None,
    }
    unit_policy = sharding.mp_policy
    if unit_policy.param_dtype is not None:
        keep_trainable_in_float32(model)
    for name in sharding.vocab_parallel:  # sharded by rows here; FSDP2 leaves them alone
        module = model.get_submodule(name)
        ignored.add(shard_rows(module, mesh, env.device, unit_policy.param_dtype))
    kwargs["ignored_params"] = ignored or None
    # Nested units (min_num_params) are sharded innermost first, as FSDP2 requires.
    for name in sorted(sharding.wrap_units, key=lambda unit: -unit.count(".")):
        unit = model.get_submodule(name)
        fully_shard(unit, mp_policy=unit_policy, **kwargs)
        if has_unit_entry(unit):  # its work runs through its entry, not its forward
            register_fsdp_forward_method(unit, UNIT_ENTRY)
    # output_dtype on every unit would feed the next unit's LayerNorm fp32: set it on the root only.
    root_policy = MixedPrecisionPolicy(
        param_dtype=unit_policy.param_dtype,
        reduce_dtype=unit_policy.reduce_dtype,
        output_dtype=unit_policy.output_dtype
        or (torch.float32 if unit_policy.param_dtype else None),
        cast_forward_inputs=unit_policy.cast_forward_inputs,
    )
    fully_shard(model, mp_policy=root_policy, **kwargs)
    register_inference_methods(model)
    return model


INFERENCE_METHODS = ("predict_action_chunk", "select_action")


def register_inference_methods(root: nn.Module) -> None:
    """The policy's inference methods gather the root unit as its forward does (each unit below
    gathers on its own forward or entry), so that a sharded policy acts: on the policy itself,
    or, under PEFT, on the PeftModel root with the wrapped policy's methods pointing at them."""
    policy = root.get_base_model() if hasattr(root, "get_base_model") else root
    for name in INFERENCE_METHODS:
        if not callable(getattr(type(policy), name, None)):
            continue
        if policy is not root:
            root.__dict__[name] = getattr(policy, name)  # PeftModel forwards other names itself
        register_fsdp_forward_method(root, name)
        root.__dict__[name] = _resharding(root, root.__dict__[name])
        if policy is not root:
            policy.__dict__[name] = root.__dict__[name]


def _resharding(root: nn.Module, method):
    """``method``, then every unit resharded: a forward without gradients leaves the units that
    do not reshard after forward (``--accelerator.fsdp.reshard_after_forward=false``, and the
    root) gathered, with no backward to reshard them, and training after it went wrong (FSDP2
    then skips the next gather)."""

    @functools.wraps(method)
    def run(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        finally:
            for module in root.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    return run


def apply_parallelism(
    model: nn.Module,
    dims: ParallelDims,
    env: DistEnv,
    accelerator: AcceleratorConfig,
    sharding: ShardingPlan | None = None,
) -> nn.Module:
    """Move ``model`` to the device and wrap it for ``dims`` (a sharded ``dims`` needs the
    ``sharding`` planned for it); returns the module to call. With
    ``accelerator.sync_batch_norm`` its batch norms first become cross-rank ones."""
    if accelerator.sync_batch_norm:
        convert_sync_batch_norm(model)
    if dims.is_sharded:
        if sharding is None:
            raise ValueError("a sharded topology needs its ShardingPlan (plan_sharding)")
        return apply_fsdp(model, dims, env, accelerator, sharding)
    model.to(env.device)
    if dims.world_size == 1:
        return model
    ddp = accelerator.ddp
    return DistributedDataParallel(
        model,
        device_ids=[env.device.index] if env.device.type == "cuda" else None,
        # A policy whose forward leaves some parameters out by design says so (LeRobot's vqbet
        # trains its VQ-VAE alone first).
        find_unused_parameters=ddp.find_unused_parameters
        or getattr(model, "ddp_find_unused_parameters", False),
        gradient_as_bucket_view=ddp.gradient_as_bucket_view,
        static_graph=ddp.static_graph,
    )


def make_grad_scaler(
    device: torch.device, dims: ParallelDims, enabled: bool
) -> torch.amp.GradScaler:
    """fp16 loss scaler. Sharded runs see only their gradient shard, so the found-inf flag must be
    agreed across ranks (ShardedGradScaler all-reduces it) or ranks would step differently."""
    if dims.is_sharded:
        return ShardedGradScaler(device.type, enabled=enabled)
    return torch.amp.GradScaler(device.type, enabled=enabled)


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip by the global gradient norm over sharded (DTensor) and plain gradients alike (FSDP2
    with ignored modules has both; torch's clip_grad_norm_ cannot mix them)."""
    grads = [p.grad for p in params if p.grad is not None]
    groups = [
        g
        for g in (
            [x for x in grads if isinstance(x, DTensor)],
            [x for x in grads if not isinstance(x, DTensor)],
        )
        if g
    ]
    if not groups:
        return torch.zeros(())
    if len(groups) == 1:
        norm = nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
    norms = []
    for group in groups:
        norm = nn.utils.get_total_norm(group)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))
    coef = min(1.0, max_norm / (total.item() + 1e-6))
    for group in groups:
        for grad in group:
            grad.mul_(coef)
    return total


def average_gradients(params: list[nn.Parameter]) -> None:
    """All-reduce-average the gradients of parameters no wrapper reduces (FSDP2-ignored ones)."""
    if not params or not dist.is_initialized():
        return
    world_size = dist.get_world_size()
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world_size
