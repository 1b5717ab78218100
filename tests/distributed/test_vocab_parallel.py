"""The vocab-parallel embedding (lerobot_pipe/distributed/vocab_parallel.py) on 4 real gloo ranks,
on FSDP2's 1-D mesh and HSDP's 2 x 2 one: each rank looks up its own ids (different ones, a
different count on each rank) and gets exactly the rows of the whole table, in the compute dtype;
the gradient each rank holds is its rows of the gradient that one process computes over all
ranks' ids (averaged as FSDP2 averages), the padding row none; no rank ever holds more than its
rows. Then the plan: pi's token embedding is vocab-parallel under FSDP2 unless a unit covers it,
the flags name it or CPU offload is on."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from launch import run_distributed
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from lerobot_pipe.distributed.runtime import destroy, init_distributed
from lerobot_pipe.distributed.vocab_parallel import shard_rows

pytestmark = pytest.mark.torch_range

WIDTH = 5


class Scaled(nn.Embedding):
    fsdp_vocab_parallel = True

    def finish_lookup(self, rows):
        return rows * 3


def _table(vocab: int) -> torch.Tensor:
    return torch.randn(vocab, WIDTH, generator=torch.Generator().manual_seed(0))


def _ids(rank: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 + rank)
    ids = torch.randint(0, vocab, (2, 3 + rank), generator=g)  # a different count per rank
    ids[0, 0] = 0  # the padding row
    ids[1, :2] = 4  # a repeated id
    return ids


def _output_grad(rank: int, shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(100 + rank))


def _rank(mesh_shape: tuple[int, ...], dtype_name: str | None, vocab: int) -> dict:
    env = init_distributed()
    try:
        names = ("dp_replicate", "dp_shard") if len(mesh_shape) == 2 else ("dp_shard",)
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        compute = getattr(torch, dtype_name) if dtype_name else None
        module = Scaled(vocab, WIDTH, padding_idx=0)
        with torch.no_grad():
            module.weight.copy_(_table(vocab))
        shard_rows(module, mesh, env.device, compute)
        rank, world = dist.get_rank(), dist.get_world_size()
        ids = _ids(rank, vocab)
        out = module(ids)
        out.backward(_output_grad(rank, out.shape).to(out.dtype))
        # One process's view: the whole table, every rank's ids and output gradients.
        table = _table(vocab).requires_grad_(True)
        want = {}
        for r in range(world):
            rows = table.to(compute or table.dtype)[_ids(r, vocab)]
            if r == rank:
                want["out"] = (rows * 3).detach()
            (rows * 3).backward(_output_grad(r, rows.shape).to(rows.dtype) / world)
        want_grad = table.grad.clone()
        want_grad[0] = 0  # nn.Embedding's padding row gets no gradient
        weight = module.weight
        return {
            "dtype": out.dtype == (compute or torch.float32),
            "out": (out.float() - want["out"].float()).abs().max().item(),
            "grad_is_dtensor": isinstance(weight.grad, DTensor)
            and weight.grad.placements == weight.placements,
            "grad": (weight.grad.full_tensor() - want_grad).abs().max().item()
            / want_grad.abs().max().item(),
            "local_rows": weight.to_local().shape[0],
            "grad_rows": weight.grad.to_local().shape[0],
            "full": torch.equal(weight.full_tensor(), _table(vocab)),
        }
    finally:
        destroy()


@pytest.mark.parametrize(
    ("mesh_shape", "dtype_name", "vocab"),
    [((4,), None, 11), ((2, 2), None, 11), ((4,), "bfloat16", 11), ((4,), None, 5)],
    # 11 rows: 3 / 3 / 3 / 2 on 4 ranks, 6 / 5 on 2; 5 rows: 2 / 2 / 1 / 0 (a rank holds none)
    ids=["fsdp2-4", "hsdp-2x2", "fsdp2-4-bf16-compute", "fsdp2-4-an-empty-shard"],
)
def test_each_rank_gets_the_whole_tables_rows_and_its_rows_of_the_gradient(
    mesh_shape, dtype_name, vocab
):
    results = run_distributed(_rank, 4, mesh_shape, dtype_name, vocab)
    shard = mesh_shape[-1]
    rows = [len(c) for c in torch.arange(vocab).chunk(shard)]
    rows += [0] * (shard - len(rows))
    for rank, r in enumerate(results):
        assert r["dtype"], r
        # bf16: the same bf16 rows summed with zeros, then the same scale: exact as well
        assert r["out"] == 0, r
        # relative; one process sums the ranks' contributions in another order, and in bf16
        # (the rows' dtype) where the shards add bf16 gradients in float32
        assert r["grad"] < (1e-6 if dtype_name is None else 2**-7), r
        assert r["grad_is_dtensor"], r
        assert r["local_rows"] == r["grad_rows"] == rows[rank % shard], r
        assert r["full"], r


def _rank_with_an_id_outside(vocab: int) -> str:
    env = init_distributed()
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
        module = Scaled(vocab, WIDTH, padding_idx=0)
        shard_rows(module, mesh, env.device, None)
        ids = _ids(dist.get_rank(), vocab)
        if dist.get_rank() == 1:
            ids[0, 1] = vocab  # one id past the table, on one rank only
        try:
            module(ids)
        except IndexError as e:
            return str(e)
        return "no error"
    finally:
        destroy()


def test_an_id_outside_the_table_on_one_rank_raises_on_every_rank():
    """As nn.Embedding raises IndexError, and on every rank of the shard group (the others would
    otherwise wait in the next collective): not zeros for the missing row."""
    for message in run_distributed(_rank_with_an_id_outside, 2, 11):
        assert "outside the embedding's 11 rows on shard rank(s) 1 (1 of them)" in message
