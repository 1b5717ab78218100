"""A token embedding sharded by rows that no rank ever gathers (issue #38: pi0's 257,152 x 2048
table, 2 GiB in float32, was one FSDP2 unit gathered whole on every rank with its dense gradient).

Under FSDP2 / HSDP a module whose class sets ``fsdp_vocab_parallel = True`` and that no wrap unit
covers keeps its ``weight`` as a DTensor sharded by rows over the mesh's shard dimension
(replicated over ``dp_replicate``), exactly as FSDP2 would place it (the same rows per rank: the
checkpoints, the meta build and the conversion see no difference), but FSDP2 ignores it and its
lookup is data-parallel:

- forward: every rank's token ids are all-gathered over the shard group, each rank looks up the
  ids that fall in its rows (zeros for the others), in the compute dtype (the mixed-precision
  policy's ``param_dtype``, else the weight's), and a reduce-scatter sums the partial rows back
  to each rank's own tokens: the same values as a lookup in the gathered table;
- backward: the output gradients are all-gathered over the shard group and each rank adds those
  of the ids in its rows into its shard's gradient, in the weight's dtype, averaged as FSDP2
  averages (divided by the shard group's size, then all-reduced and averaged over
  ``dp_replicate``). The padding row gets none, as ``nn.Embedding``'s.

A rank holds 1/N of the table, of its gradient and of its optimizer state at every moment; the
step's extra bytes are the gathered ids and rows (N x the rank's tokens x the width). A module's
``finish_lookup(rows)``, when it has one, runs on the rows (Gemma's sqrt(width) scale).
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

FLAG = "fsdp_vocab_parallel"  # the class attribute that declares a module vocab-parallel
# torch 2.13 names them *_single (the *_tensor names warn); torch 2.11 has only the old ones.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def declares_vocab_parallel(module: nn.Module) -> bool:
    return bool(getattr(type(module), FLAG, False)) and isinstance(
        getattr(module, "weight", None), torch.Tensor
    )


def row_placements(mesh: DeviceMesh) -> tuple:
    """FSDP2's placement of a parameter: rows over the last (shard) dimension, replicated over
    ``dp_replicate`` when the mesh has it."""
    return (Replicate(),) * (mesh.ndim - 1) + (Shard(0),)


def shard_rows_range(rows: int, mesh: DeviceMesh) -> tuple[int, int]:
    """This rank's rows ``[lo, hi)`` under Shard(0) over the mesh's last dimension: torch.chunk's
    split (ceil(rows / N) each, the last ones shorter or empty), as DTensor and FSDP2 place them."""
    shards = mesh.size(mesh.ndim - 1)
    index = mesh.get_local_rank(mesh.ndim - 1)
    chunk = -(-rows // shards)
    lo = min(index * chunk, rows)
    return lo, min(lo + chunk, rows)


def _groups(mesh: DeviceMesh) -> tuple[dist.ProcessGroup, dist.ProcessGroup | None]:
    if mesh.ndim == 1:
        return mesh.get_group(), None
    return mesh.get_group(mesh.mesh_dim_names[-1]), mesh.get_group(mesh.mesh_dim_names[0])


def _longest(flat: Tensor, world: int, shard: dist.ProcessGroup, vocab: int) -> int:
    """The most ids any rank of the group looks up (ranks may hold different batches). An id
    outside the table on any rank raises IndexError on every rank of the group (as
    ``nn.Embedding`` raises; told in the same all-gather, so that no rank waits on the others).
    Under fake tensors (the memory benchmark: no values) every rank is taken to hold as many as
    this one."""
    if isinstance(flat, FakeTensor):
        return flat.numel()
    outside = ((flat < 0) | (flat >= vocab)).sum()
    counts = torch.stack([torch.tensor(flat.numel(), device=flat.device), outside])
    every = torch.empty(2 * world, dtype=counts.dtype, device=flat.device)
    _all_gather(every, counts, group=shard)
    every = every.view(world, 2).tolist()
    bad = [r for r, (_, n) in enumerate(every) if n]
    if bad:
        raise IndexError(
            f"token ids outside the embedding's {vocab} rows on shard rank(s) "
            f"{', '.join(map(str, bad))} ({sum(every[r][1] for r in bad)} of them): ids must be in "
            f"[0, {vocab}) (the tokenizer's vocabulary is larger than the model's?)"
        )
    return max(n for n, _ in every)


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_weight, ids, rows, vocab, compute_dtype, padding_idx, shard, replicate):
        lo, hi = rows
        world = dist.get_world_size(shard)
        flat = ids.reshape(-1)
        longest = _longest(flat, world, shard, vocab)
        padded = torch.full((longest,), -1, dtype=flat.dtype, device=flat.device)
        padded[: flat.numel()] = flat
        every = torch.empty(world * longest, dtype=flat.dtype, device=flat.device)
        _all_gather(every, padded, group=shard)
        mine = (every >= lo) & (every < hi)
        local_ids = torch.where(mine, every - lo, torch.zeros_like(every))
        width = local_weight.shape[1]
        if hi > lo:
            found = F.embedding(local_ids, local_weight).to(compute_dtype)
            found = found.masked_fill(~mine[:, None], 0)
        else:  # more ranks than chunks of rows: this one holds none
            found = torch.zeros(every.numel(), width, dtype=compute_dtype, device=every.device)
        out = torch.empty(longest, width, dtype=compute_dtype, device=found.device)
        _reduce_scatter(out, found, group=shard)
        ctx.save_for_backward(local_ids, mine)
        ctx.weight_meta = (local_weight.shape, local_weight.dtype, local_weight.device)
        ctx.sizes = (flat.numel(), longest)
        ctx.rows = rows
        ctx.padding_idx = padding_idx
        ctx.groups = (shard, replicate)
        return out[: flat.numel()].reshape(*ids.shape, width)

    @staticmethod
    def backward(ctx, grad_out):
        local_ids, mine = ctx.saved_tensors
        shape, dtype, device = ctx.weight_meta
        n, longest = ctx.sizes
        shard, replicate = ctx.groups
        world = dist.get_world_size(shard)
        grad = grad_out.reshape(n, shape[1])
        padded = grad.new_zeros(longest, shape[1])
        padded[:n] = grad
        every = grad.new_empty(world * longest, shape[1])
        _all_gather(every, padded.contiguous(), group=shard)
        # Other ranks' rows add zeros to row 0 (no data-dependent shapes: no sync on a GPU).
        every.masked_fill_(~mine[:, None], 0)
        grad_weight = torch.zeros(shape, dtype=dtype, device=device)
        if shape[0]:
            grad_weight.index_add_(0, local_ids, every.to(dtype))
        lo, hi = ctx.rows
        if ctx.padding_idx is not None and lo <= ctx.padding_idx < hi:
            grad_weight[ctx.padding_idx - lo] = 0
        grad_weight /= world
        if replicate is not None:
            dist.all_reduce(grad_weight, group=replicate)
            grad_weight /= dist.get_world_size(replicate)
        return grad_weight, None, None, None, None, None, None, None


def lookup(module: nn.Embedding, ids: Tensor) -> Tensor:
    """The rows of ``ids`` from a vocab-parallel ``module`` (all ranks of the shard group call it
    together, as FSDP2 units are)."""
    spec = module._vocab_parallel
    weight = module.weight
    local = weight.to_local()
    dtype = spec["compute_dtype"] or weight.dtype
    return _Lookup.apply(
        local,
        ids,
        spec["rows"],
        weight.shape[0],  # the whole table's rows
        dtype,
        module.padding_idx,
        spec["shard"],
        spec["replicate"],
    )


def _forward(self: nn.Embedding, ids: Tensor) -> Tensor:
    found = lookup(self, ids)
    finish = getattr(self, "finish_lookup", None)
    return finish(found) if finish is not None else found


def shard_rows(
    module: nn.Embedding, mesh: DeviceMesh, device: torch.device, compute_dtype: torch.dtype | None
) -> nn.Parameter:
    """Make ``module.weight`` a DTensor of this rank's rows (a meta weight stays meta: the meta
    build writes the rows later) and its forward the data-parallel lookup; returns the new
    parameter (for FSDP2's ``ignored_params``)."""
    weight = module.weight
    placements = row_placements(mesh)
    lo, hi = shard_rows_range(weight.shape[0], mesh)
    if weight.is_meta:
        local = torch.empty((hi - lo, *weight.shape[1:]), dtype=weight.dtype, device="meta")
    else:
        local = weight.detach()[lo:hi].to(device).clone()
    sharded = DTensor.from_local(
        local, mesh, placements, run_check=False, shape=weight.shape, stride=weight.stride()
    )
    param = nn.Parameter(sharded, requires_grad=weight.requires_grad)
    module.weight = param
    shard, replicate = _groups(mesh)
    module._vocab_parallel = {
        "rows": (lo, hi),
        "compute_dtype": compute_dtype if weight.is_floating_point() else None,
        "shard": shard,
        "replicate": replicate,
    }
    module.forward = types.MethodType(_forward, module)
    return param
