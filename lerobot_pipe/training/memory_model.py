"""Bytes per rank of a training step, by phase: pure arithmetic over the parameters' shapes and
dtypes, the sharding plan and the run's flags (torch-free; training/memory_plan.py gathers the
inputs).

The terms, per rank (the largest one: FSDP2 gives rank 0 the most rows):

- parameters: FSDP2 keeps each parameter's dim-0 shard, ``ceil(rows / N)`` rows on every rank in
  a padded buffer (``FSDPParam``'s sharded data), in the dtype it is kept in (trainable ones in
  float32 under mixed precision); ignored modules and unsharded runs hold them whole; a
  vocab-parallel embedding (``ROWS``) its rows, unpadded, never gathered, its gradient written in
  its shard at the end of the backward.
- gathered: the all-gathered (padded) parameters of the units FSDP2 has unsharded, in the compute
  dtype: the root unit from its forward to the end of the backward, the unit in flight and the
  prefetched next one, and every unit with ``reshard_after_forward=false``; a unit whose forward
  never runs is never gathered. Unsharded under autocast: the compute-dtype copies of the
  trainable parameters autocast caches in the forward, and of the frozen ones an op saves.
- gradients: a sharded gradient of the rows each rank holds (unpadded) for every parameter the
  loss reaches; during a unit's backward its unsharded gradient (compute dtype) and the
  reduce-scatter input (padded, reduce dtype) and output, that input kept through the next
  unit's backward (FSDP2 frees it when the next reduce-scatter starts); under gradient
  accumulation the unsharded gradients FSDP2 accumulates while gradient sync is off (reduce
  dtype, all of them, from the first micro-batch's backward to the synchronizing one). DDP:
  whole gradients, and its buckets beside them unless ``gradient_as_bucket_view`` (then they
  are one); the buckets are allocated when DDP wraps the model and held from the forward on.
- optimizer: Adam/AdamW ``exp_avg`` and ``exp_avg_sq`` (like each rank's unpadded rows) and a
  float32 ``step`` per parameter, SGD's momentum buffer; step temporaries: none for the fused
  kernel, one parameter-sized set for ``foreach`` (its ``sqrt`` of ``exp_avg_sq``), the largest
  parameter for the per-tensor loop.
- EMA: a float32 shadow of each trainable parameter's rows on this rank.
- activations: saved for backward (training/activation_probe.py), linear in the batch; with
  activation checkpointing the units' inputs, and one unit's recomputation during its backward.
- allowance: what the plan does not see (CUDA context and kernels, NCCL buffers, the caching
  allocator's fragmentation): ``ALLOWANCE_FIXED`` plus ``ALLOWANCE_FRACTION`` of the rest, an
  assumption stated in every plan.

The phases: the end of the forward (activations all saved), the backward (walked unit by unit in
reverse, sharded or not: the activations of the units not yet back-propagated, the gradients
already written or reduced, the unit's in-flight buffers), and the optimizer step (no
activations, every gradient). The peak is the largest phase, not the sum of the terms. With CPU
offload the parameters, sharded gradients, optimizer state and EMA live in host memory
(``host_bytes``, per node).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

GIB = 1024**3
ALLOWANCE_FIXED = 1 * GIB  # CUDA context and kernels, NCCL's buffers
ALLOWANCE_FRACTION = 0.05  # the caching allocator's fragmentation, of what the plan counts
ASSUMPTIONS = (
    f"allowance: {ALLOWANCE_FIXED / GIB:.0f} GiB (CUDA context, kernels, NCCL buffers) plus "
    f"{ALLOWANCE_FRACTION:.0%} of the counted bytes (allocator fragmentation); not measured",
    "activations: saved-for-backward bytes of the training forward measured on the meta device "
    "at batch 1 and 2, linear in the batch; temporaries inside one op (attention scores before "
    "they are saved, matmul workspaces) are not counted",
    "FSDP2 prefetches one unit ahead in forward and backward; the largest rank (rank 0, the most "
    "dim-0 rows) is reported",
    "unsharded with autocast: the compute-dtype copies of the trainable parameters (autocast's "
    "cache) and of the frozen ones an op saves for the backward are held through the forward",
)


# The unit of a vocab-parallel embedding's weight (lerobot_pipe/distributed/vocab_parallel.py): a
# DTensor of the rank's rows (no padding), never gathered; its gradient is written in the shard
# at the end of the backward.
ROWS = "(rows)"


def inside(name: str, unit: str) -> bool:
    """Whether module (or parameter) ``name`` is ``unit`` or lies within it (units nest: pi's
    MLP units inside their decoder layers'; "" is the root)."""
    return name == unit or name.startswith(unit + ".")


@dataclass(frozen=True)
class Param:
    """One parameter as the run holds it."""

    name: str
    shape: tuple[int, ...]
    itemsize: int  # bytes per element as kept (float32 master weights under mixed precision)
    trainable: bool
    reached: bool  # the loss reaches it: it gets a gradient and optimizer state
    # its FSDP2 unit ('' the root; ROWS: sharded by rows, never gathered), None: not sharded
    # (ignored, or unsharded)
    unit: str | None
    saved: bool = False  # autograd saves it in the forward (autocast then saves its cast)
    # the innermost declared unit it lies in ('' none), sharded or not: where the backward walk
    # writes its gradient
    owner: str = ""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def rows(self, shards: int) -> tuple[int, int]:
        """(padded, largest) elements per rank: ceil(rows / N) rows on every rank in FSDP2's
        padded buffer, and the rows the largest rank really holds."""
        if self.unit is None or shards == 1 or not self.shape:
            return self.numel, self.numel
        rows = self.shape[0]
        rest = self.numel // rows if rows else 0
        chunk = -(-rows // shards)
        largest = min(chunk, rows) * rest
        return (largest if self.unit == ROWS else chunk * rest), largest


@dataclass(frozen=True)
class Activations:
    """Saved-for-backward bytes at this run's batch (activation_probe.ActivationProfile.at)."""

    root: int  # outside every unit
    units: dict[str, int] = field(default_factory=dict)  # inside each unit, kept in the forward
    recompute: dict[str, int] = field(default_factory=dict)  # checkpointed: its recomputation
    order: tuple[str, ...] = ()  # the units that run, in forward order

    @property
    def saved(self) -> int:
        return self.root + sum(self.units.values())


@dataclass(frozen=True)
class Setup:
    """The run's flags that decide its memory."""

    world_size: int = 1
    nproc_per_node: int = 1
    dp_shard: int = 1  # FSDP2 shards (1: unsharded, DDP or one process)
    compute_itemsize: int | None = None  # mixed precision's compute dtype (None: as kept)
    reduce_itemsize: int | None = None  # gradient reduction dtype (None: as kept)
    autocast: bool = False  # unsharded mixed precision (autocast)
    optimizer: str = "adamw"  # adamw, adam, sgd
    momentum: bool = False  # SGD with a momentum buffer
    optimizer_impl: str = "fused"  # fused, foreach or for_loop
    ema: bool = False
    accumulation: int = 1
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    bucket_view: bool = True  # DDP's gradient_as_bucket_view

    @property
    def sharded(self) -> bool:
        return self.dp_shard > 1


@dataclass(frozen=True)
class Breakdown:
    """Device bytes per rank at one phase."""

    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    ema: int = 0
    gathered: int = 0
    activations: int = 0

    @property
    def counted(self) -> int:
        return (
            self.parameters
            + self.gradients
            + self.optimizer
            + self.ema
            + self.gathered
            + self.activations
        )

    @property
    def allowance(self) -> int:
        return ALLOWANCE_FIXED + int(ALLOWANCE_FRACTION * self.counted)

    @property
    def total(self) -> int:
        return self.counted + self.allowance


@dataclass(frozen=True)
class State:
    """Persistent state bytes per rank (the largest), as a real run's tensors hold it."""

    parameters: int  # padded sharded buffers (whole tensors unsharded)
    parameters_local: int  # the rows the rank holds (DTensor.to_local)
    gradients: int  # sharded (unpadded) or whole gradients of the reached parameters
    optimizer: int
    ema: int
    ddp_buckets: int


@dataclass(frozen=True)
class MemoryEstimate:
    setup: Setup
    state: State
    phases: dict[str, Breakdown]
    host_bytes: int  # per node

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: self.phases[p].total)

    @property
    def peak(self) -> Breakdown:
        return self.phases[self.peak_phase]


def state_bytes(params: list[Param], setup: Setup) -> State:
    n = setup.dp_shard
    parameters = local = grads = optim = ema = 0
    state_per_element = {"adamw": 2, "adam": 2, "sgd": 1 if setup.momentum else 0}[setup.optimizer]
    for p in params:
        padded, largest = p.rows(n)
        parameters += padded * p.itemsize
        local += largest * p.itemsize
        if p.trainable:
            ema += largest * 4
        if p.trainable and p.reached:
            grads += largest * p.itemsize
            optim += state_per_element * largest * p.itemsize
            if setup.optimizer in ("adamw", "adam"):
                optim += 4  # the float32 step count
    buckets = 0 if (setup.sharded or setup.world_size == 1 or setup.bucket_view) else grads
    return State(
        parameters=parameters,
        parameters_local=local,
        gradients=grads,
        optimizer=optim,
        ema=ema if setup.ema else 0,
        ddp_buckets=buckets,
    )


def _step_temporaries(params: list[Param], setup: Setup) -> int:
    """The optimizer step's own temporaries on this rank."""
    reached = [p.rows(setup.dp_shard)[1] * p.itemsize for p in params if p.trainable and p.reached]
    if not reached or setup.optimizer_impl == "fused":
        return 0
    if setup.optimizer_impl == "foreach":
        return sum(reached)
    return max(reached)


def estimate(params: list[Param], setup: Setup, acts: Activations) -> MemoryEstimate:
    """Each phase's bytes per rank (module docstring)."""
    state = state_bytes(params, setup)
    n = setup.dp_shard
    compute = setup.compute_itemsize
    units: dict[str, list[Param]] = {}
    for p in params:
        if p.unit is not None:
            units.setdefault(p.unit, []).append(p)

    def gathered(unit: str) -> int:  # a unit all-gathered, padded, in the compute dtype
        return sum(p.rows(n)[0] * n * (compute or p.itemsize) for p in units.get(unit, []))

    def unsharded_grads(unit: str, itemsize: int | None) -> int:
        return sum(
            p.numel * (itemsize or p.itemsize)
            for p in units.get(unit, [])
            if p.trainable and p.reached
        )

    def sharded_grads(unit: str) -> int:
        return sum(
            p.rows(n)[1] * p.itemsize for p in units.get(unit, []) if p.trainable and p.reached
        )

    on_device = not setup.cpu_offload
    params_dev = state.parameters if on_device else 0
    optim_dev = state.optimizer if on_device else 0
    ema_dev = state.ema if on_device else 0
    temps = _step_temporaries(params, setup)
    # The units FSDP2 gathers, in forward order: a unit whose forward never runs (pi's lm_heads)
    # is never gathered.
    order = [u for u in acts.order if u in units and u != ""]
    not_in_units = sum(
        p.numel * p.itemsize for p in params if p.unit is None and p.trainable and p.reached
    )

    if setup.sharded:
        root_gathered = gathered("")
        every_unit = sum(gathered(u) for u in order)
        largest_two = sum(sorted((gathered(u) for u in order), reverse=True)[:2])
        kept = every_unit if not setup.reshard_after_forward else 0
        # Gradient accumulation: FSDP2 accumulates unsharded gradients while sync is off.
        accumulated = (
            sum(unsharded_grads(u, setup.reduce_itemsize) for u in ["", *order])
            + sharded_grads(ROWS)
            if setup.accumulation > 1
            else 0
        )
        forward = Breakdown(
            parameters=params_dev,
            gradients=accumulated + (not_in_units if on_device else 0),
            optimizer=optim_dev,
            ema=ema_dev,
            gathered=root_gathered + max(kept, largest_two),
            activations=acts.saved,
        )
        backward = _walk_backward(
            order, acts, setup, params_dev, optim_dev, ema_dev, accumulated, on_device,
            gathered, unsharded_grads, sharded_grads, root_gathered, not_in_units,
        )  # fmt: skip
        optimizer = Breakdown(
            parameters=params_dev,
            gradients=state.gradients if on_device else 0,
            optimizer=optim_dev + temps,
            ema=ema_dev,
        )
    else:
        # Autocast's compute-dtype copies, by the unit whose saved tensors hold them.
        casts: dict[str, int] = {}
        for p in params:
            if setup.autocast and compute and (p.trainable or p.saved):
                casts[p.owner] = casts.get(p.owner, 0) + p.numel * compute
        cast = sum(casts.values())
        # DDP allocates its buckets when it wraps the model (again when it rebuilds them at the
        # second step) and keeps them: with gradient_as_bucket_view the gradients are views of
        # them, there from the first forward on; without, the gradients are written beside them.
        ddp_view = setup.world_size > 1 and setup.bucket_view
        always = state.gradients if ddp_view else state.ddp_buckets
        grads = always + (0 if ddp_view else state.gradients)
        # Accumulated gradients persist across micro-batches (DDP's no_sync keeps them whole).
        kept_grads = grads if setup.accumulation > 1 else always
        forward = Breakdown(
            parameters=state.parameters,
            gradients=kept_grads,
            optimizer=state.optimizer,
            ema=state.ema,
            gathered=cast,
            activations=acts.saved,
        )
        # The gradients are written while the saved tensors are freed, unit by unit in reverse:
        # the backward's start (every activation, the largest recomputation), each unit's
        # backward (its gradients and those of the units after it written, the activations of
        # the units before it and its own still held: a camera backbone that runs first keeps
        # its activations while the rest's gradients are written), and its end (every
        # gradient, the root's tensors; autocast's casts freed with the graph). Accumulated
        # gradients are there throughout.
        start = acts.saved + max(acts.recompute.values(), default=0)
        held = Breakdown(
            parameters=state.parameters,
            gradients=kept_grads,
            optimizer=state.optimizer,
            ema=state.ema,
            gathered=cast,
            activations=start,
        )
        moments = [held, replace(held, gradients=grads, gathered=0, activations=acts.root)]
        per_unit: dict[str, int] = {}  # gradient bytes
        for p in params:
            if p.trainable and p.reached and p.owner:
                per_unit[p.owner] = per_unit.get(p.owner, 0) + p.numel * p.itemsize
        order = [u for u in acts.order if u]
        written = always  # the gradients written so far (DDP's buckets: all along)
        for i in range(len(order) - 1, -1, -1):
            unit = order[i]
            written += 0 if ddp_view else per_unit.get(unit, 0)
            pending = acts.root + sum(acts.units.get(u, 0) for u in order[: i + 1])
            pending += sum(acts.recompute.get(u, 0) for u in order[: i + 1] if inside(unit, u))
            cast_held = casts.get("", 0) + sum(casts.get(u, 0) for u in order[: i + 1])
            moments.append(
                replace(
                    held,
                    gradients=max(kept_grads, written),
                    gathered=cast_held,  # freed with each unit's saved tensors
                    activations=pending,
                )
            )
        backward = max(moments, key=lambda b: b.total)
        optimizer = Breakdown(
            parameters=state.parameters,
            gradients=grads,
            optimizer=state.optimizer + temps,
            ema=state.ema,
        )
    host = 0
    if setup.cpu_offload:
        per_rank = state.parameters + state.gradients + state.optimizer + state.ema
        host = per_rank * min(setup.nproc_per_node, setup.world_size)
    return MemoryEstimate(
        setup=setup,
        state=state,
        phases={"forward": forward, "backward": backward, "optimizer": optimizer},
        host_bytes=host,
    )


def _walk_backward(
    order, acts, setup, params_dev, optim_dev, ema_dev, accumulated, on_device,
    gathered, unsharded_grads, sharded_grads, root_gathered, not_in_units,
) -> Breakdown:  # fmt: skip
    """The backward unit by unit in reverse forward order; the largest moment."""
    n = setup.dp_shard
    compute, reduce = setup.compute_itemsize, setup.reduce_itemsize
    done_grads = 0  # sharded gradients of the units already reduced
    # FSDP2 keeps the last reduce-scatter's input until the next one starts (torch's
    # reduce_scatter_max_input_buffers, 1): it overlaps the next unit's backward.
    retained = 0
    worst = None
    for i in range(len(order) - 1, -1, -1):
        unit = order[i]
        pending = acts.root + sum(acts.units.get(u, 0) for u in order[: i + 1])
        # A checkpointed unit's recomputation lives through its backward, the backward of the
        # units inside it (pi's MLPs) included.
        pending += sum(acts.recompute.get(u, 0) for u in order[: i + 1] if inside(unit, u))
        nxt = gathered(order[i - 1]) if i > 0 else 0
        in_flight = gathered(unit) if setup.reshard_after_forward else 0
        unsharded = unsharded_grads(unit, compute)
        reduce_in = unsharded_grads(unit, reduce)  # copied into the reduce-scatter input
        reduce_out = -(-reduce_in // n)
        done_dev = done_grads if on_device else 0
        grads_dev = (done_grads + sharded_grads(unit)) if on_device else 0
        everything = (
            sum(gathered(u) for u in order) if not setup.reshard_after_forward else 0
        )  # fmt: skip
        # Two moments per unit: its backward computing (the unit gathered, its gradient being
        # written, its activations held), then its post-backward (FSDP2 reshards the unit
        # first, then copies the gradient into the reduce-scatter input and reduces it).
        computing = Breakdown(
            parameters=params_dev,
            gradients=accumulated + done_dev + unsharded + retained
            + (not_in_units if on_device else 0),
            optimizer=optim_dev,
            ema=ema_dev,
            gathered=root_gathered + in_flight + nxt + everything,
            activations=pending,
        )  # fmt: skip
        reducing = Breakdown(
            parameters=params_dev,
            gradients=accumulated + grads_dev + unsharded + reduce_in + reduce_out
            + (not_in_units if on_device else 0),
            optimizer=optim_dev,
            ema=ema_dev,
            gathered=root_gathered + nxt + everything,
            activations=pending - acts.units.get(unit, 0) - acts.recompute.get(unit, 0),
        )  # fmt: skip
        for moment in (computing, reducing):
            if worst is None or moment.total > worst.total:
                worst = moment
        done_grads += sharded_grads(unit)
        retained = reduce_in or retained
    root = Breakdown(
        parameters=params_dev,
        gradients=accumulated
        + (done_grads if on_device else 0)
        + unsharded_grads("", compute)
        + unsharded_grads("", reduce)
        + (sharded_grads("") + sharded_grads(ROWS) if on_device else 0),
        optimizer=optim_dev,
        ema=ema_dev,
        gathered=root_gathered,
        activations=acts.root,
    )
    return root if worst is None or root.total > worst.total else worst
