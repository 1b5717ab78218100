"""Sharded runs build the policy on the meta device and materialize only each rank's shards
(issue #20 item 7; distributed/meta_init.py): on real gloo process groups, FSDP2 built so
starts from exactly the eager build's weights and trains as it does."""

from __future__ import annotations

import pytest
import torch
from tiny import DETERMINISTIC, full_state, losses, run_on_topology, tiny_act_flags, train_one_rank

pytestmark = pytest.mark.torch_range

TOPOLOGIES = {
    "single": (1, 4, ["--parallelism.dp_shard=null", "--checkpoint_format=safetensors"]),
    "fsdp2": (2, 2, ["--parallelism.dp_shard=2", "--checkpoint_format=dcp"]),
}
STEPS = 3


def _inspect(session, env) -> dict:
    out = {"meta": session.built_on_meta}
    initial = full_state(session)
    if env.is_main:
        out["model"] = initial["model"]
    return out


def _train(argv):
    return train_one_rank(argv, _inspect)


def _run(topology, argv, monkeypatch, eager=False):
    if eager:
        monkeypatch.setenv("LEROBOT_PIPE_META_BUILD", "0")
    else:
        monkeypatch.delenv("LEROBOT_PIPE_META_BUILD", raising=False)
    return run_on_topology(TOPOLOGIES, topology, argv, _train)


def _equal(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), (what, set(a) ^ set(b))
    bad = [k for k in a if not torch.equal(a[k], b[k])]
    assert not bad, f"{what}: {bad[:5]} differ"


def test_act_meta_build_is_the_eager_build(dataset_root, tmp_path, monkeypatch):
    flags = tiny_act_flags(**DETERMINISTIC, **{"dataset.root": dataset_root, "steps": STEPS})
    runs = {}
    for name, topology, eager in (
        ("single", "single", False),
        ("eager", "fsdp2", True),
        ("meta", "fsdp2", False),
    ):
        out = tmp_path / name
        runs[name] = (out, _run(topology, [*flags, f"--output_dir={out}"], monkeypatch, eager))
    assert [r["meta"] for r in runs["meta"][1]] == [True, True]
    assert [r["meta"] for r in runs["eager"][1]] == [False, False]
    _equal(runs["meta"][1][0]["model"], runs["eager"][1][0]["model"], "meta vs eager FSDP2")
    _equal(runs["meta"][1][0]["model"], runs["single"][1][0]["model"], "meta vs one process")
    curves = {name: losses(out) for name, (out, _) in runs.items()}
    for step in range(1, STEPS + 1):
        assert abs(curves["meta"][step] - curves["eager"][step]) < 1e-5, step
        assert abs(curves["meta"][step] - curves["single"][step]) < 1e-5, step


@pytest.fixture(scope="module")
def base_policy(dataset_root, tmp_path_factory):
    """A trained tiny ACT checkpoint to fine-tune from."""
    from tiny import run_train

    out = tmp_path_factory.mktemp("meta_base") / "out"
    run_train(
        [
            *tiny_act_flags(
                **DETERMINISTIC, **{"dataset.root": dataset_root, "steps": 2, "save_freq": 2}
            ),
            f"--output_dir={out}",
        ]
    )
    return out / "checkpoints/000002/pretrained_model"


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_policy_path_fine_tune_loads_shards_as_the_eager_build(
    dataset_root, base_policy, tmp_path, monkeypatch, lora
):
    """--policy.path read shard by shard from its safetensors (the loaded state is the file's),
    with LoRA the adapters initialized as the eager build does them; losses as eager FSDP2."""
    from safetensors.torch import load_file

    extra = {"peft.method_type": "LORA", "peft.r": 4} if lora else {}
    flags = [
        *tiny_act_flags(**DETERMINISTIC, **{"dataset.root": dataset_root, "steps": STEPS}, **extra),
        f"--policy.path={base_policy}",
    ]
    runs = {}
    for name, eager in (("eager", True), ("meta", False)):
        out = tmp_path / name
        runs[name] = (out, _run("fsdp2", [*flags, f"--output_dir={out}"], monkeypatch, eager))
    assert [r["meta"] for r in runs["meta"][1]] == [True, True]
    meta, eager = runs["meta"][1][0]["model"], runs["eager"][1][0]["model"]
    _equal(meta, eager, "meta vs eager FSDP2")
    saved = load_file(base_policy / "model.safetensors")
    prefix = "base_model.model." if lora else ""
    for key, value in saved.items():
        name = key if not lora or key in {k.removeprefix(prefix) for k in meta} else None
        if name is None:  # a LoRA-wrapped layer's weight: PeftModel's base_layer
            module, leaf = key.rsplit(".", 1)
            name = f"{module}.base_layer.{leaf}"
        assert torch.equal(meta[prefix + name], value), key
    curves = {name: losses(out) for name, (out, _) in runs.items()}
    for step in range(1, STEPS + 1):
        assert abs(curves["meta"][step] - curves["eager"][step]) < 1e-5, step
