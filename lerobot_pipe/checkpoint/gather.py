"""Full tensors assembled on one rank from every rank's local shards of DTensors, over a process
group the caller chooses.

The asynchronous checkpoint needs this: its background thread builds model.safetensors from the
copies of the shards the training loop staged in CPU memory, over the checkpoint writer's own gloo
group. ``DTensor.full_tensor()`` (and ``get_model_state_dict(full_state_dict=True)``) would run
on the tensor's device mesh instead: the training loop's process group (nccl on GPU), busy with
the loop's own collectives meanwhile.

Each rank describes its shard with DTensor's public chunk metadata (``__create_chunk_list__``:
offsets and sizes in the global tensor, what DCP saves by), so any placement on any mesh is
handled alike: FSDP2's ``Shard(0)``, HSDP's ``(Replicate(), Shard(0))`` on a 2-D mesh, uneven
shards (the last ranks hold fewer rows, or none). A chunk several ranks hold (HSDP's replicas)
is sent once: by the destination if it holds it, else by the lowest rank holding it. Tensors
that are not DTensors are replicated: the destination's own is used. Senders pack their chunks
into buckets of at most ``bucket_bytes`` (one larger chunk goes alone), one message each, so
neither side holds more than a bucket besides the output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

BUCKET_BYTES = 256 * 1024 * 1024
_ALIGN = 64  # byte alignment of each chunk in a bucket, so it views as any dtype


@dataclass(frozen=True)
class _Chunk:
    """One rank's block of a DTensor: where it sits in the global tensor."""

    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]  # the global tensor's
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.sizes) * self.dtype.itemsize

    @property
    def region(self) -> tuple[slice, ...]:
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.sizes, strict=True))


def gather_full_tensors(
    state: Mapping[str, torch.Tensor],
    group: dist.ProcessGroup,
    dst: int = 0,
    bucket_bytes: int = BUCKET_BYTES,
) -> dict[str, torch.Tensor] | None:
    """Collective on ``group`` (ranks are ``group``'s): ``{key: full CPU tensor}`` of ``state``
    (same keys, same order) on rank ``dst``, None elsewhere. Every rank passes the same keys;
    each DTensor's local tensor must be on CPU (``group`` is a CPU group: gloo)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    layouts: list[list[_Chunk | str]] = [[] for _ in range(world)]
    dist.all_gather_object(layouts, _describe(state), group=group)
    sends = _plan(layouts, dst)  # the same on every rank
    if rank != dst:
        for bucket in _buckets(sends.get(rank, []), bucket_bytes):
            dist.send(_pack(bucket, state), group=group, group_dst=dst)
        return None
    full = {
        key: torch.empty(t.shape, dtype=t.dtype) if isinstance(t, DTensor) else t.detach().cpu()
        for key, t in state.items()
    }
    for chunk in sends.get(dst, []):
        full[chunk.key][chunk.region].copy_(_local(state[chunk.key]))
    for src in sorted(r for r in sends if r != dst):
        for bucket in _buckets(sends[src], bucket_bytes):
            buffer = torch.empty(_bucket_size(bucket), dtype=torch.uint8)
            dist.recv(buffer, group=group, group_src=src)
            for chunk, at in bucket:
                full[chunk.key][chunk.region].copy_(_view(buffer, chunk, at))
    return full


def _describe(state: Mapping[str, torch.Tensor]) -> list[_Chunk | str]:
    """This rank's chunk of each DTensor; the bare key of a replicated tensor."""
    out: list[_Chunk | str] = []
    for key, t in state.items():
        if not isinstance(t, DTensor):
            out.append(key)
            continue
        chunks = t.__create_chunk_list__()
        local = t.to_local()
        if len(chunks) != 1 or tuple(local.shape) != tuple(chunks[0].sizes):
            raise ValueError(
                f"{key}: a DTensor whose local tensor is not one block of the global tensor "
                f"({type(local).__name__} of shape {tuple(local.shape)}, chunks {chunks}); "
                "only DDP, FSDP2 and HSDP shardings are supported"
            )
        if local.device.type != "cpu":
            raise ValueError(f"{key}: the local tensor is on {local.device}; stage it on CPU first")
        out.append(
            _Chunk(key, t.dtype, tuple(t.shape), tuple(chunks[0].offsets), tuple(chunks[0].sizes))
        )
    return out


def _plan(layouts: list[list[_Chunk | str]], dst: int) -> dict[int, list[_Chunk]]:
    """{rank: the chunks it provides}: each distinct non-empty chunk once, from ``dst`` when it
    holds it, else from the lowest rank holding it. Raises (on every rank alike) when the ranks
    hold different keys or a tensor's chunks do not cover it."""
    expected = [_signature(entry) for entry in layouts[dst]]
    for rank, layout in enumerate(layouts):
        if [_signature(entry) for entry in layout] != expected:
            raise ValueError(
                f"rank {rank}'s state dict has other keys, shapes or dtypes than rank {dst}'s: "
                "the ranks do not hold the same model"
            )
    order = [dst, *(r for r in range(len(layouts)) if r != dst)]
    sends: dict[int, list[_Chunk]] = {}
    for i, mine in enumerate(layouts[dst]):
        if not isinstance(mine, _Chunk):
            continue
        seen: set[tuple] = set()
        covered = 0
        for rank in order:
            chunk = layouts[rank][i]
            where = (chunk.offsets, chunk.sizes)
            if chunk.nbytes == 0 or where in seen:
                continue
            seen.add(where)
            covered += math.prod(chunk.sizes)
            sends.setdefault(rank, []).append(chunk)
        if covered != math.prod(mine.shape):
            raise ValueError(
                f"{mine.key}: the ranks' shards cover {covered} of its {math.prod(mine.shape)} "
                f"elements (shape {mine.shape}): not a sharding this gather supports"
            )
    return sends


def _signature(entry: _Chunk | str) -> tuple:
    if isinstance(entry, _Chunk):
        return entry.key, entry.dtype, entry.shape
    return entry, None, None


def _buckets(chunks: list[_Chunk], bucket_bytes: int) -> Iterator[list[tuple[_Chunk, int]]]:
    """Consecutive chunks with their byte offsets, each group at most ``bucket_bytes`` (or one
    chunk). Sender and receiver compute the same groups from the same plan."""
    bucket: list[tuple[_Chunk, int]] = []
    size = 0
    for chunk in chunks:
        at = -(-size // _ALIGN) * _ALIGN
        if bucket and at + chunk.nbytes > bucket_bytes:
            yield bucket
            bucket, at = [], 0
        bucket.append((chunk, at))
        size = at + chunk.nbytes
    if bucket:
        yield bucket


def _bucket_size(bucket: list[tuple[_Chunk, int]]) -> int:
    chunk, at = bucket[-1]
    return at + chunk.nbytes


def _pack(bucket: list[tuple[_Chunk, int]], state: Mapping[str, torch.Tensor]) -> torch.Tensor:
    buffer = torch.empty(_bucket_size(bucket), dtype=torch.uint8)
    for chunk, at in bucket:
        _view(buffer, chunk, at).copy_(_local(state[chunk.key]))
    return buffer


def _view(buffer: torch.Tensor, chunk: _Chunk, at: int) -> torch.Tensor:
    return buffer[at : at + chunk.nbytes].view(chunk.dtype).view(chunk.sizes)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t
