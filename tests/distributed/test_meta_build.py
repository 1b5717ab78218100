"""Sharded runs build the policy on the meta device and materialize only each rank's shards
(issue #20 item 7; distributed/meta_init.py): on real gloo process groups, FSDP2 built so
starts from exactly the eager build's weights and trains as it does."""

from __future__ import annotations

import pytest
import torch
from tiny import (
    DETERMINISTIC,
    full_state,
    losses,
    run_on_topology,
    tiny_act_flags,
    tiny_diffusion_flags,
    train_one_rank,
)

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


@pytest.mark.parametrize(
    "policy",
    # diffusion: ~16 s, on the pinned torch only (the meta build's torch calls are act's; the
    # probe on diffusion's meta model below runs on the range's ends)
    ["act", pytest.param("diffusion", marks=[pytest.mark.slow, pytest.mark.one_torch])],
)
def test_meta_build_is_the_eager_build(
    policy, dataset_root, diffusion_camera_root, tmp_path, monkeypatch
):
    """FSDP2 2 built on the meta device starts from the eager build's weights bit for bit (and
    one process's), and trains as they do. Diffusion: a camera, the size policy passing over
    the bypassed diffusion_step_encoder (found by the probe on the meta model)."""
    if policy == "act":
        flags = tiny_act_flags(**DETERMINISTIC, **{"dataset.root": dataset_root, "steps": STEPS})
    else:
        flags = [
            *tiny_diffusion_flags(**{"dataset.root": diffusion_camera_root, "steps": STEPS}),
            "--accelerator.fsdp.min_num_params=2000",
        ]
    runs = {}
    for name, topology, eager in (
        ("single", "single", False),
        ("eager", "fsdp2", True),
        ("meta", "fsdp2", False),
    ):
        out = tmp_path / name
        argv = flags if topology == "fsdp2" else [a for a in flags if "min_num_params" not in a]
        runs[name] = (out, _run(topology, [*argv, f"--output_dir={out}"], monkeypatch, eager))
    assert [r["meta"] for r in runs["meta"][1]] == [True, True]
    assert [r["meta"] for r in runs["eager"][1]] == [False, False]
    _equal(runs["meta"][1][0]["model"], runs["eager"][1][0]["model"], "meta vs eager FSDP2")
    _equal(runs["meta"][1][0]["model"], runs["single"][1][0]["model"], "meta vs one process")
    curves = {name: losses(out) for name, (out, _) in runs.items()}
    for step in range(1, STEPS + 1):
        assert abs(curves["meta"][step] - curves["eager"][step]) < 1e-5, (step, curves)
        if policy == "act":  # Diffusion's batch norms see per-rank batches: not one process's
            assert abs(curves["meta"][step] - curves["single"][step]) < 1e-5, (step, curves)


def _plan(flags: list[str], out) -> object:
    from lerobot_pipe.training.preflight import make_plan

    return make_plan([*flags, "--parallelism.dp_shard=2", f"--output_dir={out}"], 2, {})


def _meta_and_real_probe(plan) -> tuple[dict, dict, object]:
    """The bypassed modules the probe finds on the meta-built policy and on the eager one."""
    from lerobot_pipe.distributed.meta_init import MetaBuild
    from lerobot_pipe.policies.factory import make_policy
    from lerobot_pipe.training.data import make_processors
    from lerobot_pipe.training.unit_probes import probe_forwards as _probe_forwards

    build = MetaBuild()
    with build.recording():
        meta = make_policy(plan.cfg.policy, plan.dataset.features, pretrained_parts=False)
    pre, _ = make_processors(plan, "cpu")
    on_meta = _probe_forwards(plan, meta, meta, pre, torch.device("cpu"), on_meta=True)
    real = make_policy(plan.cfg.policy, plan.dataset.features, pretrained_parts=False)
    return on_meta, _probe_forwards(plan, real, real, pre, torch.device("cpu")), build


@pytest.mark.parametrize("policy", ["act", "diffusion", "smolvla"])
def test_the_probe_on_the_meta_model_finds_what_the_real_one_finds(
    policy, dataset_root, diffusion_camera_root, tmp_path
):
    """Values read from meta tensors answer 1 (unit_probe.MetaValues): for every policy the
    probe still finds exactly the modules it finds on the real model."""
    if policy == "act":
        flags = tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2})
    elif policy == "diffusion":
        flags = tiny_diffusion_flags(**{"dataset.root": diffusion_camera_root, "steps": 2})
    else:
        flags = _smolvla_flags(tmp_path)
    on_meta, real, _ = _meta_and_real_probe(_plan(flags, tmp_path / "out"))
    assert on_meta == real
    if policy == "diffusion":
        assert "diffusion.unet.diffusion_step_encoder" in on_meta


def _smolvla_flags(tmp_path) -> list[str]:
    pytest.importorskip("transformers", reason="SmolVLA needs transformers: lerobot_pipe[smolvla]")
    from memory_runs import tiny_smolvla_flags

    return [*tiny_smolvla_flags(tmp_path, num_episodes=2), "--steps=2", "--num_workers=0"]


def test_materializing_holds_a_few_whole_tensors_not_the_model(dataset_root, tmp_path):
    """The replay keeps a tensor whole only from the call that last overwrites it to its last
    use: its peak is a few tensors, however large the model."""
    from lerobot_pipe.policies.factory import make_policy

    plan = _plan(tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2}), tmp_path)
    from lerobot_pipe.distributed.meta_init import MetaBuild

    build = MetaBuild()
    with build.recording():
        policy = make_policy(plan.cfg.policy, plan.dataset.features, pretrained_parts=False)
    deferred = build.finish(policy)
    deferred.materialize(policy, torch.device("cpu"))
    sizes = sorted(p.numel() * p.element_size() for p in policy.parameters())
    assert 0 < deferred.peak_bytes <= 2 * sizes[-1] < sum(sizes) / 4, (
        deferred.peak_bytes,
        sizes[-1],
    )


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


def test_the_row_reader_reads_any_rows_of_any_tensor_without_a_memory_map(tmp_path):
    """--policy.path's weights are read by row ranges with pread (a memory map's touched pages
    would count in the rank's resident memory): every row range, and a column slice after it, of
    each dtype and rank equals the tensor safetensors saved."""
    import itertools

    from safetensors.torch import save_file

    from lerobot_pipe.distributed.meta_init import _RowReader

    tensors = {
        "w": torch.randn(7, 5, 3),
        "half": torch.randn(4).to(torch.bfloat16),
        "scalar": torch.tensor(3.5),
        "ints": torch.arange(12, dtype=torch.int64).view(3, 4),
        "empty": torch.randn(0, 3),
    }
    save_file(tensors, tmp_path / "model.safetensors")
    reader = _RowReader(tmp_path / "model.safetensors")
    try:
        for key, t in tensors.items():
            assert reader.shape(key) == tuple(t.shape)
            if t.dim() == 0:
                assert torch.equal(reader.read(key, ()), t)
                continue
            for a, b in itertools.combinations(range(t.shape[0] + 1), 2):
                index = (slice(a, b), *(slice(0, n) for n in t.shape[1:]))
                assert torch.equal(reader.read(key, index), t[index]), (key, a, b)
        index = (slice(1, 7), slice(2, 4), slice(0, 3))
        assert torch.equal(reader.read("w", index), tensors["w"][index])
    finally:
        reader.close()
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(RuntimeError, match="not a safetensors file"):
        _RowReader(tmp_path / "bad.safetensors")
