"""gather_full_tensors on 4 real gloo ranks: DTensors on an HSDP-like 2-D mesh and on a 1-D
mesh, uneven and empty shards, several dtypes, small buckets; the result equals DTensor's own
full_tensor() bit for bit, on a process group of its own."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from launch import run_distributed
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from lerobot_pipe.checkpoint.gather import gather_full_tensors
from lerobot_pipe.distributed.runtime import destroy, init_distributed

pytestmark = pytest.mark.torch_range


def _state() -> dict[str, torch.Tensor]:
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    flat = init_device_mesh("cpu", (4,), mesh_dim_names=("dp_shard",))
    g = torch.Generator().manual_seed(0)
    return {
        # HSDP: replicated across the first mesh dimension, sharded (unevenly) across the second
        "weight": distribute_tensor(torch.randn(7, 3, generator=g), hsdp, [Replicate(), Shard(0)]),
        "bias": distribute_tensor(
            torch.randn(5, generator=g).to(torch.bfloat16), hsdp, [Replicate(), Shard(0)]
        ),
        "one_row": distribute_tensor(  # the second shard is empty
            torch.randint(0, 100, (1, 2), generator=g), hsdp, [Replicate(), Shard(0)]
        ),
        "scalar": distribute_tensor(torch.tensor(3.5), hsdp, [Replicate(), Replicate()]),
        "buffer": torch.arange(4, dtype=torch.int32),  # not a DTensor: replicated
        # FSDP2 on 4 ranks: 2, 2, 2, 1 elements; 3, 3, 3, 1 columns; 1, 1, 1, 0 elements
        "mask": distribute_tensor(torch.randn(7, generator=g) > 0, flat, [Shard(0)]),
        "columns": distribute_tensor(
            torch.randn(2, 10, generator=g).to(torch.float16), flat, [Shard(1)]
        ),
        "short": distribute_tensor(torch.randn(3, generator=g), flat, [Shard(0)]),
    }


def _gather_rank(bucket_bytes: int) -> dict | None:
    init_distributed()
    try:
        state = _state()
        expected = {
            k: v.full_tensor() if isinstance(v, DTensor) else v.clone() for k, v in state.items()
        }
        group = dist.new_group(backend="gloo")
        full = gather_full_tensors(state, group, bucket_bytes=bucket_bytes)
        if dist.get_rank() != 0:
            return {"none": full is None}
        return {
            "keys": list(full) == list(state),
            "equal": {
                k: full[k].dtype == expected[k].dtype
                and full[k].shape == expected[k].shape
                and torch.equal(full[k], expected[k])
                for k in expected
            },
        }
    finally:
        destroy()


def test_gathers_hsdp_and_uneven_shards_bit_for_bit():
    for bucket_bytes in (48, 1 << 20):  # a chunk per message; everything in one
        results = run_distributed(_gather_rank, 4, bucket_bytes)
        assert results[0]["keys"]
        assert all(results[0]["equal"].values()), results[0]["equal"]
        assert all(r["none"] for r in results[1:])


def _mismatch_rank() -> str:
    init_distributed()
    try:
        state = _state()
        if dist.get_rank() == 2:
            state["extra"] = torch.zeros(1)
        try:
            gather_full_tensors(state, dist.new_group(backend="gloo"))
        except ValueError as e:
            return str(e)
        return "no error"
    finally:
        destroy()


def test_ranks_holding_other_keys_fail_alike():
    messages = run_distributed(_mismatch_rank, 4)
    assert all("rank 2's state dict has other keys" in m for m in messages), messages
