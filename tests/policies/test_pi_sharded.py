"""pi0 and pi0.5 under FSDP2 and HSDP on real gloo process groups (issue #38, item 4), on the dummy
geometry (49.8 M parameters, of which the three 257,152-row matrices are 49.4 M).

The units are the policy's: every SigLIP encoder layer, every decoder layer of both Gemma stacks
(the pair's joint attention runs inside both layers' unit entries: paligemma_expert.py) and the two
lm_heads; the token embedding is vocab-parallel (sharded by rows, never gathered:
lerobot_pipe/distributed/vocab_parallel.py), so that nothing large stays in the root unit. Shown here: FSDP2
and HSDP train as one process (fp32, the same global batch, noise and flow times from the sample
keys; losses within 1e-5) and act as one process (``predict_action_chunk`` and ``select_action``
from fixed noise); every rank holds 1/N of the parameters, of the gradients and of the AdamW
state (<= 1.1/N); the lm_heads get no gradient and no optimizer state; sharded runs build on the
meta device with the eager build's values; ``--accelerator.mixed_precision=bf16`` keeps fp32
master weights; ``--policy.dtype=bfloat16`` is refused before launch naming the unit; activation
checkpointing (the accelerator's and the policy's own ``gradient_checkpointing``) gives the same
gradients; LoRA with LeRobot's default targets fine-tunes a bf16-stored base on FSDP2 and its
adapter converts."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import torch
from pi_tiny import paligemma_tokenizer_cache
from tiny import losses, run_on_topology, train_one_rank
from torch.distributed.tensor import DTensor
from vla_tools import gradients_of_one_batch

from lerobot_pipe.policies.pi0 import PI_TINY_PRESET

# Its module fixtures train several topologies: the rest tier.
pytestmark = pytest.mark.slow

STEPS = 2
TOPOLOGIES = {
    "single": (
        1,
        4,
        [
            "--parallelism.dp_replicate=null",
            "--parallelism.dp_shard=null",
            "--checkpoint_format=safetensors",
        ],
    ),
    "fsdp2": (
        2,
        2,
        ["--parallelism.dp_replicate=null", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"],
    ),
    "hsdp": (
        4,
        1,
        ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"],
    ),
}
UNIT_CLASSES = (
    "SiglipEncoderLayer",
    "PiGemmaDecoderLayer",
    "GemmaMLP",
    "PiTokenEmbedding",
    "PiLMHead",
)
LM_HEADS = (
    "model.paligemma_with_expert.paligemma.lm_head.weight",
    "model.paligemma_with_expert.gemma_expert.lm_head.weight",
)
RUNS = [
    ("pi05", "single"),
    ("pi05", "fsdp2"),
    ("pi05", "hsdp"),
    ("pi0", "single"),
    ("pi0", "fsdp2"),
]


def _local_bytes(tensors) -> int:
    return sum((t.to_local() if hasattr(t, "to_local") else t).nbytes for t in tensors)


def _inference_batch(config) -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    batch = {
        "observation.images.top": torch.rand(2, 3, 56, 56, generator=g),
        "observation.state": torch.randn(2, 2, generator=g),
        "observation.language.tokens": torch.randint(4, 250, (2, 9), generator=g),
        "observation.language.attention_mask": torch.tensor([[True] * 9, [True] * 6 + [False] * 3]),
    }
    noise = torch.randn(2, config.chunk_size, config.max_action_dim, generator=g)
    return batch, noise


def _inspect(session, env) -> dict:
    """Before training: each unit's local and full bytes, the parameters' local and full bytes,
    dtypes, the actions from fixed noise, the initial state (main rank of single/fsdp2) and one
    forward/backward's local gradient bytes (the gradients then dropped: the run goes on as
    without it)."""
    from lerobot_pipe.checkpoint.lerobot_state import flatten_tensors

    trainee = session.trainee
    units = {}
    for name, module in trainee.named_modules():
        if type(module).__name__.removeprefix("FSDP") in UNIT_CLASSES:
            params = list(module.parameters())
            units[name] = (_local_bytes(params), sum(p.numel() * p.element_size() for p in params))
    params = list(trainee.parameters())
    out = {
        "units": units,
        "param_bytes": (_local_bytes(params), sum(p.numel() * p.element_size() for p in params)),
        "dtypes": {n: p.dtype for n, p in trainee.named_parameters()},
        "meta": session.built_on_meta or session.eager_reason,
        # the token embedding as vocab_parallel.py keeps it: a DTensor of rows, no FSDP2 unit
        "embedding_by_rows": [
            isinstance(m.weight, DTensor)
            for m in trainee.modules()
            if type(m).__name__ == "PiTokenEmbedding"
        ],
    }
    policy = session.policy
    batch, noise = _inference_batch(policy.config)
    out["chunk"] = policy.predict_action_chunk(batch, noise=noise)
    policy.reset()
    out["first"] = policy.select_action(batch, noise=noise)
    policy.reset()
    trainee.train()
    model = {k: v.clone() for k, v in session.state.model.full_state_dict().items()}
    if env.is_main and os.environ.get("WORLD_SIZE", "1") in ("1", "2"):
        out["model"] = flatten_tensors(model)
    g = torch.Generator().manual_seed(3)
    train_batch = dict(batch)
    train_batch["action"] = torch.randn(2, policy.config.chunk_size, 2, generator=g)
    loss, _ = session.model(train_batch, noise=noise, time=torch.tensor([0.3, 0.8]))
    loss.backward()
    grads = [p.grad for p in params if p.grad is not None]
    out["grad_bytes"] = _local_bytes(grads)
    out["grad_names"] = sorted(n for n, p in trainee.named_parameters() if p.grad is not None)
    for p in params:
        p.grad = None
    return out


def train_and_inspect(argv: list[str]) -> dict:
    """One rank: _inspect before training, the run, then the local bytes of AdamW's state and
    the parameters it holds state for."""
    seen = {}

    def inspect(session, env):
        seen["session"] = session
        return _inspect(session, env)

    out = train_one_rank(argv, inspect)
    optimizer = seen["session"].optimizer
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    out["optim_bytes"] = _local_bytes(state)
    named = {id(p): n for n, p in seen["session"].trainee.named_parameters()}
    out["optim_names"] = sorted(named[id(p)] for p in optimizer.state)
    return out


def _run(topology: str, argv: list[str], rank_fn=None) -> list[dict]:
    return run_on_topology(TOPOLOGIES, topology, argv, rank_fn or train_and_inspect)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from lerobot_pipe.datasets import write_synthetic_dataset

    tmp = tmp_path_factory.mktemp("pi_sharded")
    root = write_synthetic_dataset(
        tmp / "ds", num_episodes=4, episode_length=10, cameras=["top"], image_size=56,
        pixels_only=True, num_tasks=2,
    )  # fmt: skip
    with paligemma_tokenizer_cache(tmp / "hf"):
        yield {"tmp": tmp, "dataset": root}


def _flags(parts: dict, kind: str, **changes) -> list[str]:
    preset = {k: v for k, v in PI_TINY_PRESET.items() if k != "image_resolution"}
    flags = {
        "policy.type": kind,
        **{f"policy.{k}": v for k, v in preset.items()},
        "policy.image_resolution": "[56,56]",
        "dataset.root": str(parts["dataset"]),
        "steps": STEPS,
        "save_freq": STEPS,
        "num_workers": 0,
        "log_freq": 1,
        **changes,
    }
    return [f"--{k}={v}" for k, v in flags.items() if v is not None]


@pytest.fixture(scope="module")
def sources(parts) -> dict[tuple[str, str], tuple[Path, list[dict]]]:
    """Uninterrupted fp32 runs of both policies on their topologies."""
    runs = {}
    for kind, name in RUNS:
        out = parts["tmp"] / f"{kind}_{name}"
        runs[kind, name] = (out, _run(name, [*_flags(parts, kind), f"--output_dir={out}"]))
    return runs


@pytest.mark.parametrize("kind, name", [r for r in RUNS if r[1] != "single"])
def test_fsdp2_and_hsdp_train_and_act_as_one_process(sources, kind, name):
    out, ranks = sources[kind, name]
    reference_out, (one,) = sources[kind, "single"]
    curve, reference = losses(out), losses(reference_out)
    assert curve.keys() == reference.keys() == set(range(1, STEPS + 1))
    for step in reference:
        assert abs(curve[step] - reference[step]) < 1e-5, (kind, name, step)
    for rank in ranks:
        torch.testing.assert_close(rank["chunk"], one["chunk"], atol=1e-5, rtol=0)
        torch.testing.assert_close(rank["first"], one["first"], atol=1e-5, rtol=0)
        torch.testing.assert_close(rank["first"], one["chunk"][:, 0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_sharded_runs_build_on_the_meta_device_with_the_eager_values(sources, kind):
    (one,) = sources[kind, "single"][1]
    assert one["meta"] is None  # one process: built eagerly
    rank0 = sources[kind, "fsdp2"][1][0]
    assert all(rank["meta"] is True for rank in sources[kind, "fsdp2"][1]), rank0["meta"]
    assert rank0["model"].keys() == one["model"].keys()
    for key, value in one["model"].items():
        assert torch.equal(rank0["model"][key], value), key


@pytest.mark.parametrize("kind, name", [r for r in RUNS if r[1] != "single"])
def test_each_rank_holds_half_of_parameters_gradients_and_optimizer_state(sources, kind, name):
    """Every unit (20: 2 vision layers, 4 + 4 decoder layers and their MLPs, two lm_heads) and the
    token embedding (vocab-parallel: sharded by rows, no unit, never gathered) is split between
    the shard group's 2 ranks; the parameters, gradients and AdamW state a rank holds are <= 1.1/2
    of one process's."""
    (one,) = sources[kind, "single"][1]
    assert len(one["units"]) == 21, sorted(one["units"])
    assert one["embedding_by_rows"] == [False]
    full_params = one["param_bytes"][1]
    assert one["param_bytes"][0] == full_params
    for rank in sources[kind, name][1]:
        assert rank["embedding_by_rows"] == [True]
        assert rank["units"].keys() == one["units"].keys()
        for unit, (local, full) in rank["units"].items():
            assert full == one["units"][unit][1]
            assert 0.45 * full <= local <= 0.55 * full, (unit, local, full)
        assert rank["param_bytes"][1] == full_params
        assert rank["param_bytes"][0] <= 0.55 * full_params, rank["param_bytes"]
        assert rank["grad_bytes"] <= 0.55 * one["grad_bytes"], (rank["grad_bytes"], one)
        assert rank["optim_bytes"] <= 0.55 * one["optim_bytes"], rank["optim_bytes"]


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_the_lm_heads_get_no_gradient_and_no_optimizer_state(sources, kind):
    """The two lm_heads (never used in the forward) stay in the checkpoint but are frozen: no
    gradient, no AdamW state, and nothing else is left without a gradient (DDP needs no
    find_unused_parameters)."""
    for name in ("single", "fsdp2"):
        out, ranks = sources[kind, name]
        rank = ranks[0]
        trainable = {n for n, d in rank["dtypes"].items()}
        for head in LM_HEADS:
            assert head in trainable and head not in rank["grad_names"]
            assert head not in rank["optim_names"]
        assert set(rank["optim_names"]) == set(rank["grad_names"])
    step_dir = sources[kind, "single"][0] / f"checkpoints/{STEPS:06d}/pretrained_model"
    from safetensors import safe_open

    with safe_open(str(step_dir / "model.safetensors"), "pt") as f:
        assert set(LM_HEADS) <= set(f.keys())


def test_dtype_bfloat16_without_mixed_precision_is_refused_before_launch(
    parts, tmp_path, monkeypatch, capsys
):
    """As rank 0 of a 2-process FSDP2 run: LeRobot's dtype=bfloat16 keeps each decoder layer's
    norms in fp32 beside bf16 projections, and FSDP2 reduces one gradient dtype per unit; exit
    status 2, one line naming the unit and the flag that trains it (fp32 master weights)."""
    from lerobot_pipe.scripts.train import main as train_main

    for key, value in {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", "1")
    argv = _flags(parts, "pi05", **{"policy.dtype": "bfloat16", "parallelism.dp_shard": 2})
    assert train_main([*argv, f"--output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    unit = "FSDP2 unit model.paligemma_with_expert.paligemma.model.language_model.layers.0:"
    assert unit in err and "mix dtypes" in err, err
    assert "--accelerator.mixed_precision=bf16" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def bf16_runs(parts) -> dict[str, tuple[Path, list[dict]]]:
    """pi0.5 on FSDP2 with --accelerator.mixed_precision=bf16 (fp32 master weights, bf16
    compute), from float32 and from dtype=bfloat16; LoRA (LeRobot's default targets) on FSDP2 on
    a base stored in bf16 (dtype=bfloat16, saved by one process), with mixed precision."""
    from lerobot_pipe.policies.factory import make_policy_config
    from lerobot_pipe.policies.pi05 import PI05Policy

    runs = {}
    out = parts["tmp"] / "bf16_fsdp2"
    argv = _flags(parts, "pi05", **{"accelerator.mixed_precision": "bf16"})
    runs["fsdp2"] = (out, _run("fsdp2", [*argv, f"--output_dir={out}"]))
    out = parts["tmp"] / "bf16_dtype_fsdp2"
    argv = _flags(
        parts, "pi05", **{"accelerator.mixed_precision": "bf16", "policy.dtype": "bfloat16"}
    )
    runs["dtype"] = (out, _run("fsdp2", [*argv, f"--output_dir={out}"]))
    torch.manual_seed(0)
    features = dict(
        input_features={
            "observation.images.top": {"type": "VISUAL", "shape": [3, 56, 56]},
            "observation.state": {"type": "STATE", "shape": [2]},
        },
        output_features={"action": {"type": "ACTION", "shape": [2]}},
    )
    cfg = make_policy_config("pi05", **PI_TINY_PRESET, dtype="bfloat16", **features)
    base = parts["tmp"] / "bf16_base"
    PI05Policy(cfg).save_pretrained(base)
    out = parts["tmp"] / "lora_fsdp2"
    argv = [
        f"--policy.path={base}",
        f"--dataset.root={parts['dataset']}",
        "--peft.r=4",
        "--accelerator.mixed_precision=bf16",
        f"--steps={STEPS}",
        f"--save_freq={STEPS}",
        "--num_workers=0",
        "--log_freq=1",
        f"--output_dir={out}",
    ]
    runs["lora"] = (out, _run("fsdp2", argv))
    runs["base"] = base
    return runs


@pytest.mark.parametrize("name", ["fsdp2", "dtype"])
def test_bf16_mixed_precision_keeps_fp32_master_weights(bf16_runs, sources, name):
    """From float32 and from dtype=bfloat16 alike: every trainable parameter is kept (and
    checkpointed) in float32, the two lm_heads (frozen) in their dtype; the losses are close to
    the fp32 run's (bf16 compute), not equal."""
    out, ranks = bf16_runs[name]
    curve, fp32 = losses(out), losses(sources["pi05", "fsdp2"][0])
    assert curve.keys() == fp32.keys()
    for step in curve:
        assert abs(curve[step] - fp32[step]) < 0.05 * abs(fp32[step]), (step, curve, fp32)
    dtypes = ranks[0]["dtypes"]
    assert ranks[0]["grad_names"] and all(
        dtypes[p] == torch.float32 for p in ranks[0]["grad_names"]
    )
    head = torch.bfloat16 if name == "dtype" else torch.float32
    assert {dtypes[h] for h in LM_HEADS} == {head}


def test_lora_fine_tunes_on_fsdp2_and_its_adapter_converts(bf16_runs):
    from safetensors.torch import load_file

    from lerobot_pipe.policies.pi05 import PI05Policy
    from lerobot_pipe.scripts.convert_dcp import main as convert_main

    out, ranks = bf16_runs["lora"]
    assert len(losses(out)) == STEPS
    assert all(rank["meta"] is True for rank in ranks), ranks[0]["meta"]
    trainable = [n for n in ranks[0]["grad_names"]]
    assert trainable and all(".lora_" in n for n in trainable), trainable
    for rank in ranks:  # the frozen base is sharded with the adapters
        for unit, (local, full) in rank["units"].items():
            assert 0.45 * full <= local <= 0.55 * full, (unit, local, full)
    step = out / f"checkpoints/{STEPS:06d}"
    assert convert_main([f"--checkpoint_dir={step}"]) == 0
    adapter = load_file(step / "pretrained_model/adapter_model.safetensors")
    prefix = "base_model.model.model."
    modules = {k.removeprefix(prefix).rsplit(".lora_", 1)[0] for k in adapter if ".lora_" in k}
    expert = "paligemma_with_expert.gemma_expert.model.layers"
    assert modules == {
        *(f"{expert}.{i}.self_attn.{p}_proj" for i in range(4) for p in "qv"),
        "action_in_proj", "action_out_proj",
    }  # fmt: skip
    assert PI05Policy._peft_target_modules.startswith(r"(.*\.gemma_expert\.")


# --- activation checkpointing -----------------------------------------------------------------

RECOMPUTED = (
    "model.paligemma_with_expert.gemma_expert.model.layers.0.mlp",
    "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.mlp",
)


def _training_batch(config) -> tuple[dict, torch.Tensor]:
    batch, noise = _inference_batch(config)
    batch["action"] = torch.randn(2, config.chunk_size, 2, generator=torch.Generator())
    return batch, noise


# One rank's loss and gradients on _training_batch (vla_tools.gradients_of_one_batch).
ONE_BATCH = functools.partial(
    gradients_of_one_batch, make_batch=_training_batch, counted=RECOMPUTED
)


@pytest.fixture(scope="module")
def checkpointed(parts) -> dict[str, list[dict]]:
    runs = {}
    for label, topology, changes in [
        ("none", "fsdp2", {}),
        ("full", "fsdp2", {"accelerator.activation_checkpointing.mode": "full"}),
        ("policy", "single", {"policy.gradient_checkpointing": "true"}),
    ]:
        out = parts["tmp"] / f"ac_{label}"
        argv = [*_flags(parts, "pi0", **changes), f"--output_dir={out}"]
        runs[label] = _run(topology, argv, ONE_BATCH)
    return runs


@pytest.mark.parametrize("label", ["full", "policy"])
def test_activation_checkpointing_gives_the_same_gradients(checkpointed, label):
    """Each unit recomputed in the backward (a decoder layer pair and a vision layer run twice),
    fewer activation bytes kept, the same loss and gradients within 1e-6: the accelerator's
    mode=full on FSDP2, and the policy's own gradient_checkpointing on one process."""
    plain = checkpointed["none"][0]
    for rank in checkpointed[label]:
        torch.testing.assert_close(rank["loss"], plain["loss"], atol=1e-6, rtol=0)
        assert rank["grads"].keys() == plain["grads"].keys() and len(plain["grads"]) > 50
        for name, grad in plain["grads"].items():
            torch.testing.assert_close(rank["grads"][name], grad, atol=1e-6, rtol=0, msg=name)
        assert rank["calls"] == dict.fromkeys(RECOMPUTED, 2)
        assert rank["kept"] < 0.5 * plain["kept"], (rank["kept"], plain["kept"])
    assert plain["calls"] == dict.fromkeys(RECOMPUTED, 1)
