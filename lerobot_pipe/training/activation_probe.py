"""What a policy's training forward saves for its backward, measured on the meta device.

:func:`probe_activations` runs the trainee's training forward (the one the loop calls) on the
policy built on the meta device, on one real batch of the run's dataset moved there, twice: at
one sample and at two. Every tensor autograd saves for the backward passes through a
``torch.autograd.graph.saved_tensors_hooks`` pack hook, where its storage is counted once (views
of one storage are one allocation) if it is still alive when the forward returns (a branch of
the graph that does not reach the output is freed with what it saved), without the parameters', buffers' and the batch's own
storages (they exist before the forward and are counted elsewhere). Meta tensors carry shapes and
dtypes but no values, so this costs no memory and no arithmetic, even for a 4 B-parameter model,
and the bytes are those of the real forward for this batch's shapes (values the forward reads,
``.item()``, answer 1 there: unit_probe.MetaValues).

Each saved storage is charged to the innermost wrap unit whose forward (or unit entry) was
running when it was saved, or to the root; the storages a unit's forward receives as inputs are
recorded too (what a checkpointed unit keeps). The two batch sizes give a fixed and a
per-sample part of each (bytes = fixed + per_sample x batch): the policy's token counts (images,
language, action chunk) are in the shapes, so scaling by batch is all that is left. Under mixed
precision the probe runs on a copy of the model in the compute dtype, as FSDP2's policy computes.

On the meta device ``F.scaled_dot_product_attention`` has no fused kernel to choose: it runs the
math path, which saves each head's attention weights (batch x heads x queries x keys). A real
run uses a fused kernel where one applies (flash or memory-efficient on a GPU, flash on a CPU),
which saves the output and one log-sum-exp per query instead. The probe therefore runs it as the
fused CPU kernel (``_scaled_dot_product_flash_attention_for_cpu``, which has a meta kernel) when
no dropout is asked for; otherwise as called.

The same forward tells which trainable parameters the loss reaches (a backward on the meta
device): the others get no gradient and no optimizer state (pi0's lm_heads).
"""

from __future__ import annotations

import copy
import functools
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.overrides import TorchFunctionMode

from lerobot_pipe.datasets import BatchPrefetcher
from lerobot_pipe.distributed.unit_probe import (
    UNIT_ENTRY,
    MetaValues,
    _track_forwards,
    has_unit_entry,
)
from lerobot_pipe.training.data import make_sampler

if TYPE_CHECKING:
    from lerobot_pipe.processors import PolicyProcessorPipeline
    from lerobot_pipe.training.preflight import TrainingPlan

log = logging.getLogger(__name__)

PROBE_BATCHES = (1, 2)


@dataclass(frozen=True)
class Linear:
    """Bytes = fixed + per_sample x batch."""

    fixed: int = 0
    per_sample: int = 0

    def at(self, batch: int) -> int:
        return max(0, self.fixed + self.per_sample * batch)

    @staticmethod
    def fit(at_one: int, at_two: int) -> Linear:
        return Linear(fixed=2 * at_one - at_two, per_sample=at_two - at_one)


@dataclass(frozen=True)
class ActivationProfile:
    """Saved-for-backward bytes of one training forward, per unit, linear in the batch."""

    root: Linear  # saved outside every unit
    units: dict[str, Linear] = field(default_factory=dict)  # saved inside each unit
    inputs: dict[str, Linear] = field(default_factory=dict)  # each unit's input storages
    order: tuple[str, ...] = ()  # units in the order they first ran (never run: not listed)
    reached: frozenset[str] = frozenset()  # trainable parameters the loss reaches
    saved_parameters: frozenset[str] = frozenset()  # parameters autograd saves (their casts too)

    def saved(self, batch: int) -> int:
        return self.root.at(batch) + sum(u.at(batch) for u in self.units.values())

    def checkpointed(self, batch: int, checkpointed: set[str]) -> tuple[int, int]:
        """With these units checkpointed: what the forward keeps, and the largest recomputed
        unit (held, beside what is kept, while that unit's backward runs)."""
        kept = self.root.at(batch)
        recompute = 0
        for name, linear in self.units.items():
            if name in checkpointed:
                kept += self.inputs.get(name, Linear()).at(batch)
                recompute = max(recompute, linear.at(batch))
            else:
                kept += linear.at(batch)
        return kept, recompute


class _FusedAttention(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` on meta tensors as a fused kernel (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = _fused_attention(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _fused_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """The fused kernel's output, or None where it does not apply (then the call runs as is)."""
    if not query.is_meta or dropout_p or any(t.dim() != 4 for t in (query, key, value)):
        return None
    if key.shape[1] != query.shape[1]:  # grouped heads (enable_gqa): left to the math path
        return None
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale
    )[0]


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _measure(
    trainee: nn.Module,
    batch: dict,
    units: dict[int, str],
    depth: dict[str, int],
    as_itemsize: int | None = None,
) -> tuple[Counter, Counter, list[str], set[str], set[str]]:
    """One forward (and backward) on the meta device: bytes saved per unit ('' the root), each
    unit's input bytes, the units' first-run order, the names of the parameters reached.
    ``as_itemsize``: wider floating tensors counted at that many bytes per element."""
    param_keys = {_storage_key(p): n for n, p in trainee.named_parameters()}
    saved_params: set[str] = set()
    existing = {_storage_key(t) for t in [*trainee.parameters(), *trainee.buffers()]}
    existing |= {_storage_key(v) for v in batch.values() if isinstance(v, torch.Tensor)}
    active: Counter = Counter()
    # Weak references: a storage saved by a graph branch that does not reach the output is freed
    # with that branch when the forward drops it, as in a real run; it is not counted.
    seen: dict[int, tuple[int, int, str, float]] = {}  # weak reference, bytes, unit, scale
    inputs: Counter = Counter()
    order: list[str] = []

    def innermost() -> str:
        running = [units[k] for k, n in active.items() if n > 0 and k in units]
        return max(running, key=lambda name: depth[name], default="")

    def pack(t: torch.Tensor):
        key = _storage_key(t)
        if key in param_keys:
            saved_params.add(param_keys[key])
        if key not in existing and key not in seen:
            scale = 1.0
            if as_itemsize and t.is_floating_point() and t.element_size() > as_itemsize:
                scale = as_itemsize / t.element_size()
            storage = t.untyped_storage()
            seen[key] = (storage._weak_ref(), storage.nbytes(), innermost(), scale)
        return t

    def unit_input(module, args, kwargs):
        name = units[id(module)]
        if name not in order:
            order.append(name)
        for a in [*args, *kwargs.values()]:
            if isinstance(a, torch.Tensor) and _storage_key(a) not in existing:
                inputs[name] += a.untyped_storage().nbytes()

    def entered(module: nn.Module, entry):  # a unit run through its entry, not its forward
        @functools.wraps(entry)
        def run(*args, **kwargs):
            if units[id(module)] not in order:
                order.append(units[id(module)])
            return entry(*args, **kwargs)

        return run

    handles, entries = [], []
    for m in trainee.modules():
        if id(m) in units:
            handles.append(m.register_forward_pre_hook(unit_input, with_kwargs=True))
            if has_unit_entry(m):
                entries.append((m, m.__dict__[UNIT_ENTRY]))
                m.__dict__[UNIT_ENTRY] = entered(m, m.__dict__[UNIT_ENTRY])
    try:
        with (
            _track_forwards(trainee, active),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            _FusedAttention(),
        ):
            out = trainee(batch)
    finally:
        for h in handles:
            h.remove()
        for m, entry in entries:
            m.__dict__[UNIT_ENTRY] = entry
    loss = out[0] if isinstance(out, tuple) else out
    saved: Counter = Counter()
    for weak, nbytes, unit, scale in seen.values():
        if not torch.UntypedStorage._expired(weak):  # still held when the forward returns
            saved[unit] += int(nbytes * scale)
        torch.UntypedStorage._free_weak_ref(weak)
    names = {id(p): n for n, p in trainee.named_parameters()}
    trainable = [p for p in trainee.parameters() if p.requires_grad]
    reached = set()
    if trainable and loss.requires_grad:
        grads = torch.autograd.grad(loss, trainable, allow_unused=True)
        reached = {names[id(p)] for p, g in zip(trainable, grads, strict=True) if g is not None}
    return saved, inputs, order, reached, saved_params


def probe_activations(
    plan: TrainingPlan,
    trainee: nn.Module,
    pre: PolicyProcessorPipeline,
    unit_names: list[str],
    compute_dtype: torch.dtype | None = None,
) -> ActivationProfile:
    """The trainee's (on the meta device) saved-for-backward bytes per unit at one and two
    samples of the run's dataset (module docstring). ``compute_dtype``: the floating
    parameters and inputs cast to it first, as FSDP2's mixed precision computes; when the
    policy cannot run so (a tensor it makes itself in float32 meets a cast weight), it runs as
    built and every wider floating tensor it saves counts at the compute dtype's size."""
    if compute_dtype is not None:
        try:
            return _probe(
                plan, copy.deepcopy(trainee).to(compute_dtype), pre, unit_names, compute_dtype
            )
        except RuntimeError as e:
            log.debug(
                "the probe in %s failed (%s): scaled from the policy's dtype", compute_dtype, e
            )
            return _probe(plan, trainee, pre, unit_names, None, compute_dtype.itemsize)
    return _probe(plan, trainee, pre, unit_names, None)


def _probe(
    plan: TrainingPlan,
    trainee: nn.Module,
    pre: PolicyProcessorPipeline,
    unit_names: list[str],
    compute_dtype: torch.dtype | None,
    as_itemsize: int | None = None,
) -> ActivationProfile:
    modules = dict(trainee.named_modules())
    units = {id(modules[n]): n for n in unit_names}
    depth = {n: n.count(".") for n in unit_names}
    results = []
    for size in PROBE_BATCHES:
        sampler = make_sampler(plan, size, 0, 1)
        with BatchPrefetcher(plan.dataset, sampler, 0, device=torch.device("cpu")) as loader:
            batch = pre(loader.next())
        batch = {k: _to_meta(v, compute_dtype) for k, v in batch.items()}
        trainee.train()
        with MetaValues():
            results.append(_measure(trainee, batch, units, depth, as_itemsize))
    (saved1, inputs1, order, reached, saved_params), (saved2, inputs2, *_) = results
    return ActivationProfile(
        root=Linear.fit(saved1[""], saved2[""]),
        units={n: Linear.fit(saved1[n], saved2[n]) for n in unit_names},
        inputs={n: Linear.fit(inputs1[n], inputs2[n]) for n in unit_names},
        order=tuple(order),
        reached=frozenset(reached),
        saved_parameters=frozenset(saved_params),
    )


def _to_meta(value, dtype: torch.dtype | None):
    if not isinstance(value, torch.Tensor):
        return value
    if dtype is not None and value.is_floating_point():
        value = value.to(dtype)
    return value.to("meta")
