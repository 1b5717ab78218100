"""FSDP2 / HSDP on real gloo process groups: parity with DDP and single process, sharding, and
the resharding matrix (save on any topology, resume on any other)."""

from __future__ import annotations

import pytest
import torch
from launch import run_distributed
from safetensors.torch import load_file
from tiny import (
    DETERMINISTIC,
    WITH_SCHEDULER,
    full_state,
    losses,
    run_on_topology,
    run_train,
    tiny_act_flags,
    train_one_rank,
)

from lerobot_pipe.convert import load_dcp_state_dict

pytestmark = pytest.mark.torch_range

# name -> (world size, per-rank batch, flags). Global batch is 8 everywhere.
TOPOLOGIES = {
    "single": (
        1,
        8,
        [
            "--parallelism.dp_replicate=null",
            "--parallelism.dp_shard=null",
            "--checkpoint_format=safetensors",
        ],
    ),
    "ddp2": (
        2,
        4,
        [
            "--parallelism.dp_replicate=null",
            "--parallelism.dp_shard=null",
            "--checkpoint_format=safetensors",
        ],
    ),
    "fsdp2": (
        2,
        4,
        ["--parallelism.dp_replicate=null", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"],
    ),
    "hsdp": (
        4,
        2,
        ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"],
    ),
}
K, TOTAL = 3, 6


def _inspect(session, env) -> dict:
    """How much of the parameters this rank holds, and (main rank) the loaded state."""
    params = list(session.model.parameters())
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
    initial = full_state(session)
    out = {"local_fraction": local / sum(p.numel() for p in params)}
    if env.is_main:
        out["model"] = initial["model"]
        out["optim"] = initial["optim"]
    return out


def train_and_inspect(argv: list[str]) -> dict:
    """One rank: build (and restore) the session, record the loaded state and how much of the
    parameters this rank holds, then train."""
    return train_one_rank(argv, _inspect)


def _run(topology: str, argv: list[str]) -> list[dict]:
    return run_on_topology(TOPOLOGIES, topology, argv, train_and_inspect)


@pytest.fixture(scope="module")
def sources(dataset_root, tmp_path_factory):
    """Uninterrupted deterministic runs on every topology, checkpointing at step K and TOTAL."""
    root = tmp_path_factory.mktemp("sources")
    flags = tiny_act_flags(
        **DETERMINISTIC,
        **{
            "dataset.root": dataset_root,
            "steps": TOTAL,
            "save_freq": K,
            **WITH_SCHEDULER,
        },
    )
    return {
        name: (root / name, _run(name, [*flags, f"--output_dir={root / name}"]))
        for name in TOPOLOGIES
    }


def test_sharded_losses_match_ddp_and_single(sources):
    curves = {name: losses(out) for name, (out, _) in sources.items()}
    for name in ("ddp2", "fsdp2", "hsdp"):
        for step in range(1, TOTAL + 1):
            assert abs(curves[name][step] - curves["single"][step]) < 1e-5, (name, step)
    assert abs(curves["fsdp2"][TOTAL] - curves["ddp2"][TOTAL]) < 1e-5
    # The runs trained: the weights moved from their start (six single-batch losses are too
    # noisy to say more), and every topology's curve is the same one.
    out, ranks = sources["single"]
    final = load_file(
        out / "checkpoints" / f"{TOTAL:06d}" / "pretrained_model" / "model.safetensors"
    )
    moved = [k for k, v in ranks[0]["model"].items() if not torch.equal(v, final[k])]
    assert len(moved) > len(final) // 2, moved


def test_parameters_are_really_sharded(sources):
    assert sources["ddp2"][1][0]["local_fraction"] == 1.0
    for name in ("fsdp2", "hsdp"):
        for rank in sources[name][1]:
            assert 0.45 < rank["local_fraction"] < 0.55, (name, rank["local_fraction"])


def _equal(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), (what, set(a) ^ set(b))
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k} differs"


@pytest.mark.slow
@pytest.mark.parametrize(
    "source",
    # ddp2 saves what single saves (model.safetensors): the same load path on the range's ends
    [pytest.param(s, marks=pytest.mark.one_torch) if s == "ddp2" else s for s in TOPOLOGIES],
)
def test_resharding_matrix(sources, source, tmp_path):
    src_out, _ = sources[source]
    step_dir = src_out / "checkpoints" / f"{K:06d}"
    reference_curve = losses(src_out)
    loaded = {}
    for target in TOPOLOGIES:
        out = tmp_path / target
        results = _run(
            target,
            [
                "--resume=true",
                f"--config_path={step_dir}",
                f"--output_dir={out}",
                f"--steps={TOTAL}",
            ],
        )
        loaded[target] = results[0]
        resumed = losses(out)
        for step in range(K + 1, TOTAL + 1):
            assert abs(resumed[step] - reference_curve[step]) < 1e-5, (source, target, step)
    # Loaded state is bit-exact on every topology: equal to the files, and to each other.
    model_file = step_dir / "pretrained_model/model.safetensors"
    saved_model = (
        load_file(model_file)
        if model_file.exists()
        else load_dcp_state_dict(step_dir / "pretrained_model/pytorch_model_fsdp_0")
    )
    optim_file = step_dir / "training_state/optimizer_state.safetensors"
    for target, state in loaded.items():
        _equal(state["model"], saved_model, f"{source}->{target} model")
        if optim_file.exists():
            _equal(state["optim"], load_file(optim_file), f"{source}->{target} optimizer")
        _equal(state["optim"], loaded["single"]["optim"], f"{source}->{target} optimizer vs single")


def test_an_optimizer_without_tensor_state_saves_and_resumes_sharded(dataset_root, tmp_path):
    """Plain SGD keeps no tensor state: a rank's DCP plan for the optimizer is then empty, and
    DCP still writes that rank an (empty) shard file, which the manifest must list."""
    sgd = {
        "use_policy_training_preset": "false",
        "optimizer.type": "sgd",
        "optimizer.lr": 1e-2,
        "optimizer.momentum": 0.0,
        "scheduler.type": "constant_with_warmup",
        "scheduler.num_warmup_steps": 0,
    }
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "batch_size": 4, **sgd})
    common = ["--parallelism.dp_shard=2", "--checkpoint_format=dcp", f"--output_dir={tmp_path}"]
    run_distributed(run_train, 2, [*flags, "--steps=2", "--save_freq=2", *common])
    run_distributed(run_train, 2, [*flags, "--steps=3", "--save_freq=3", "--resume=true", *common])
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name != "last") == [
        "000002",
        "000003",
    ]
