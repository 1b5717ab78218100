"""``--ema.*`` under FSDP2 and HSDP on real gloo process groups: the sharded shadow equals one
process's, holds 1/N of the bytes per rank, is saved as DCP shards (FSDP2, staged for an async
save) and also gathered into model.safetensors (HSDP), and resumes on another topology (from
the DCP shards, from model.safetensors)."""

from __future__ import annotations

import pytest
import torch
from launch import run_distributed
from safetensors.torch import load_file
from tiny import DETERMINISTIC, run_on_topology, tiny_act_flags, train_one_rank

from lerobot_pipe import constants as C
from lerobot_pipe.convert import load_dcp_state_dict

pytestmark = pytest.mark.torch_range

K, TOTAL = 2, 4
# Plain SGD: Adam's first updates (~lr x the gradient's sign) turn the reduction order's rounding
# into weight differences of 1e-4; SGD keeps the live weights of the topologies within 1e-6.
SGD = {
    "use_policy_training_preset": "false",
    "optimizer.type": "sgd",
    "optimizer.lr": 0.1,
    "optimizer.momentum": 0.9,
    "scheduler.type": "constant_with_warmup",
    "scheduler.num_warmup_steps": 0,
}
# name -> (world size, per-rank batch, flags); the global batch is 8 everywhere.
TOPOLOGIES = {
    "single": (1, 8, ["--checkpoint_format=safetensors"]),
    "fsdp2": (
        2,
        4,
        ["--parallelism.dp_shard=2", "--checkpoint_format=dcp", "--checkpoint_async=true"],
    ),
    "hsdp": (
        4,
        2,
        [
            "--parallelism.dp_replicate=2",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=safetensors_dcp",
        ],
    ),
    # model.safetensors of an async sharded save: gathered in the background from staged shards.
    "fsdp2_async_safetensors": (
        2,
        4,
        ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors", "--checkpoint_async=true"],
    ),
}
# What each run writes of the EMA policy: its DCP shards, the gathered model.safetensors.
WRITES = {
    "fsdp2": (True, False),
    "hsdp": (True, True),
    "fsdp2_async_safetensors": (False, True),
}


def _measure(session, env) -> dict:
    ema = session.state.ema
    return {
        "local": ema.local_bytes(),
        "full": sum(t.numel() * t.element_size() for t in ema.shadow.values()),
        "sharded": all(hasattr(t, "to_local") for t in ema.shadow.values()),
    }


def train_and_measure(argv: list[str]) -> dict:
    """One rank: train; the bytes of shadow this rank holds, and of the whole shadow."""
    return train_one_rank(argv, _measure)


def _run(topology: str, argv: list[str]) -> list[dict]:
    return run_on_topology(TOPOLOGIES, topology, argv, train_and_measure)


@pytest.fixture(scope="module")
def flags(dataset_root):
    return tiny_act_flags(
        **DETERMINISTIC,
        **SGD,
        **{"dataset.root": dataset_root, "steps": TOTAL, "save_freq": 1, "ema.enable": "true"},
    )


@pytest.fixture(scope="module")
def runs(flags, tmp_path_factory):
    root = tmp_path_factory.mktemp("ema_sharded")
    return {
        name: (root / name, _run(name, [*flags, f"--output_dir={root / name}"]))
        for name in TOPOLOGIES
    }


def _folder(out, step, folder):
    return out / C.CHECKPOINTS_DIR / f"{step:06d}" / folder


def _weights(out, step, folder) -> dict:
    """model.safetensors, else the DCP shards."""
    path = _folder(out, step, folder)
    if (path / C.MODEL_SAFETENSORS).is_file():
        return load_file(path / C.MODEL_SAFETENSORS)
    return load_dcp_state_dict(path / C.MODEL_DCP_DIR)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), set(a) ^ set(b)
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.mark.parametrize("name", list(WRITES))
def test_sharded_shadow_equals_one_process(runs, name):
    """The EMA after each update is a convex combination of the weights so far: it agrees with
    one process's as closely as those weights do, within 1e-5; the shards and the gathered file
    (in the loop, or in the background) hold the same bytes."""
    single, _ = runs["single"]
    out, _ = runs[name]
    writes_dcp, writes_file = WRITES[name]
    for step in range(1, TOTAL + 1):
        live = C.PRETRAINED_MODEL_DIR
        live_diff = _max_diff(_weights(single, step, live), _weights(out, step, live))
        ema_dir = _folder(out, step, C.PRETRAINED_MODEL_EMA_DIR)
        assert (ema_dir / C.MODEL_DCP_DIR).is_dir() == writes_dcp
        assert (ema_dir / C.MODEL_SAFETENSORS).is_file() == writes_file
        ema = _weights(out, step, C.PRETRAINED_MODEL_EMA_DIR)
        ema_diff = _max_diff(_weights(single, step, C.PRETRAINED_MODEL_EMA_DIR), ema)
        print(f"{name} step {step}: live weights differ by {live_diff:.2e}, EMA by {ema_diff:.2e}")
        assert live_diff < 1e-5 and ema_diff < 1e-5, (name, step, live_diff, ema_diff)
        if writes_dcp and writes_file:
            assert _max_diff(ema, load_dcp_state_dict(ema_dir / C.MODEL_DCP_DIR)) == 0.0


def test_shadow_memory_is_one_shard_per_rank(runs):
    (single,) = runs["single"][1]
    assert not single["sharded"] and single["local"] == single["full"]
    for name, shard_degree in (("fsdp2", 2), ("hsdp", 2)):
        ranks = runs[name][1]
        assert all(r["sharded"] and r["full"] == single["full"] for r in ranks)
        for r in ranks:
            assert abs(r["local"] / r["full"] - 1 / shard_degree) < 0.05, (name, r)
        # dp_shard ranks of one replica hold the whole shadow between them, once.
        assert sum(r["local"] for r in ranks[:shard_degree]) == single["full"], name
    print(
        "shadow bytes per rank: single",
        single["local"],
        "fsdp2",
        [r["local"] for r in runs["fsdp2"][1]],
        "hsdp",
        [r["local"] for r in runs["hsdp"][1]],
    )


# From DCP shards onto one process and onto a 2-D mesh; from model.safetensors onto shards.
@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("fsdp2", "single"),
        ("fsdp2", "hsdp"),
        pytest.param("hsdp", "fsdp2", marks=pytest.mark.one_torch),  # the same DCP load path
    ],
)
def test_resume_reshards_the_shadow(runs, source, target, tmp_path):
    src, _ = runs[source]
    out = tmp_path / target
    world, batch, topology_flags = TOPOLOGIES[target]
    argv = [
        "--resume=true",
        f"--config_path={_folder(src, K, C.PRETRAINED_MODEL_DIR)}",
        f"--output_dir={out}",
        f"--steps={TOTAL}",
        f"--batch_size={batch}",
        # The target's own topology, not the checkpoint's.
        "--parallelism.dp_replicate=null",
        "--parallelism.dp_shard=null",
        *topology_flags,
    ]
    if world == 1:
        train_and_measure(argv)
    else:
        run_distributed(train_and_measure, world, argv)
    reference = _weights(runs["single"][0], TOTAL, C.PRETRAINED_MODEL_EMA_DIR)
    resumed = _weights(out, TOTAL, C.PRETRAINED_MODEL_EMA_DIR)
    assert _max_diff(reference, resumed) < 1e-5
    live = _weights(out, TOTAL, C.PRETRAINED_MODEL_DIR)
    assert not torch.equal(resumed["model.action_head.weight"], live["model.action_head.weight"])
