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
