"""SmolVLA under FSDP2 and HSDP on real gloo process groups (issue #20, items 5 and 6).

Every decoder layer (VLM and expert) and every vision layer is a unit; the decoder layers' work
runs through their unit entries (vlm_expert.py). Shown here: FSDP2 (the declared units, and
the size policy's) and HSDP train as one process (fp32, same global batch, noise and flow times from the sample keys) and act as one
process (``predict_action_chunk`` and ``select_action`` from fixed noise); each rank holds half
of every layer unit; a checkpoint reshards bit-exactly (FSDP2 2 -> 1 process, 1 -> FSDP2 2).
Then a ``smolvla_base``-style checkpoint (bf16 VLM and expert, fp32 heads and swapped k/v
projections): fine-tuned on FSDP2 and HSDP with ``--accelerator.mixed_precision=bf16`` its
trainable parameters are kept and checkpointed in fp32 and the frozen ones stay bf16; without
mixed precision it is refused before launch, naming the unit and the flag; with LoRA (LeRobot's
default SmolVLA targets, adapters in fp32, the frozen base sharded) it fine-tunes on FSDP2 and
its adapter converts."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import torch
from tiny import full_state, losses, run_on_topology, train_one_rank
from vla_tools import gradients_of_one_batch

from lerobot_pipe.policies.smolvla import SMOLVLA_TINY_PRESET

# Its module fixtures train several topologies (~40 s together): the rest tier.
pytestmark = pytest.mark.slow

pytest.importorskip("transformers", reason="SmolVLA needs transformers: lerobot_pipe[smolvla]")

STEPS, K = 4, 2
# name -> (world size, per-rank batch, flags); global batch 4 everywhere.
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
    # The size policy: here it chooses the VLM layers (entered units) with their MLPs as
    # nested units, the expert layers' linears, passing over the attention modules.
    "fsdp2-size": (
        2,
        2,
        [
            "--parallelism.dp_replicate=null",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=dcp",
            "--accelerator.fsdp.min_num_params=10000",
        ],
    ),
    # Item 7's options on SmolVLA: parameters, gradients and optimizer state on the CPU, and
    # the units left gathered after forward.
    "fsdp2-offload": (
        2,
        2,
        [
            "--parallelism.dp_replicate=null",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=dcp",
            "--accelerator.fsdp.cpu_offload=true",
            "--accelerator.fsdp.reshard_after_forward=false",
        ],
    ),
    "hsdp": (
        4,
        1,
        ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"],
    ),
}
LAYER_CLASSES = ("LlamaDecoderLayer", "SmolVLMEncoderLayer")


def _inference_batch(config) -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    batch = {
        "observation.images.top": torch.rand(2, 3, 32, 32, generator=g),
        "observation.state": torch.randn(2, 2, generator=g),
        "observation.language.tokens": torch.randint(8, 200, (2, 5), generator=g),
        "observation.language.attention_mask": torch.ones(2, 5, dtype=torch.bool),
    }
    noise = torch.randn(2, config.chunk_size, config.max_action_dim, generator=g)
    return batch, noise


def _inspect(session, env) -> dict:
    """The bytes of each layer unit this rank holds, the parameters' dtypes, the loaded state
    (main rank) and the policy's actions from fixed noise, before training."""
    units = {}
    for name, module in session.trainee.named_modules():
        if type(module).__name__.removeprefix("FSDP") in LAYER_CLASSES:
            params = list(module.parameters())
            local = sum((p.to_local() if hasattr(p, "to_local") else p).nbytes for p in params)
            units[name] = (local, sum(p.numel() * p.element_size() for p in params))
    dtypes = {n: p.dtype for n, p in session.trainee.named_parameters()}
    initial = full_state(session)
    # Acting before training, as an evaluation between steps does: training after it must
    # be as without it (units that stay gathered after a forward are resharded).
    policy = session.policy
    batch, noise = _inference_batch(policy.config)
    chunk = policy.predict_action_chunk(batch, noise=noise)
    policy.reset()
    first = policy.select_action(batch, noise=noise)
    policy.reset()
    session.trainee.train()
    out = {"units": units, "dtypes": dtypes, "chunk": chunk, "first": first}
    out["meta"] = session.built_on_meta or session.eager_reason  # True, or why not
    if env.is_main:
        out |= initial
    return out


def train_and_inspect(argv: list[str]) -> dict:
    """One rank: build (and restore) the session; record what _inspect does; then train.
    (Taking the full optimizer state initializes it, one zero-lr step, in every topology
    alike.)"""
    return train_one_rank(argv, _inspect)


def _run(topology: str, argv: list[str], rank_fn=None) -> list[dict]:
    """``rank_fn`` (default train_and_inspect) on every rank of ``topology``."""
    return run_on_topology(TOPOLOGIES, topology, argv, rank_fn or train_and_inspect)


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict[str, Path]:
    from smolvla_tiny import build_tiny_smolvlm

    from lerobot_pipe.datasets import write_synthetic_dataset

    tmp = tmp_path_factory.mktemp("smolvla_sharded")
    root = write_synthetic_dataset(
        tmp / "ds", num_episodes=4, episode_length=10, cameras=["top"], image_size=32,
        pixels_only=True, num_tasks=2,
    )  # fmt: skip
    return {
        "tmp": tmp,
        "dataset": root,
        "vlm": build_tiny_smolvlm(tmp / "vlm"),
        "vlm_weights": build_tiny_smolvlm(tmp / "vlm_weights", with_weights=True),
    }


def _flags(parts: dict, **changes) -> list[str]:
    flags = {
        "policy.type": "smolvla",
        "policy.vlm_model_name": str(parts["vlm"]),
        **{f"policy.{k}": v for k, v in SMOLVLA_TINY_PRESET.items()},
        "policy.resize_imgs_with_padding": "[32,32]",
        "policy.train_expert_only": "false",
        "policy.freeze_vision_encoder": "false",
        "dataset.root": str(parts["dataset"]),
        "steps": STEPS,
        "save_freq": K,
        "num_workers": 0,
        "log_freq": 1,
        **changes,
    }
    return [f"--{k}={v}" for k, v in flags.items() if v is not None]


@pytest.fixture(scope="module")
def sources(parts) -> dict[str, tuple[Path, list[dict]]]:
    """Uninterrupted fp32 runs on each topology, checkpointing at step K and STEPS."""
    runs = {}
    for name in TOPOLOGIES:
        out = parts["tmp"] / name
        runs[name] = (out, _run(name, [*_flags(parts), f"--output_dir={out}"]))
    return runs


def test_fsdp2_and_hsdp_train_and_act_as_one_process(sources):
    curves = {name: losses(out) for name, (out, _) in sources.items()}
    for name in ("fsdp2", "fsdp2-size", "fsdp2-offload", "hsdp"):
        assert curves[name].keys() == curves["single"].keys() == set(range(1, STEPS + 1))
        for step in curves["single"]:
            assert abs(curves[name][step] - curves["single"][step]) < 1e-5, (name, step)
        one = sources["single"][1][0]
        for rank in sources[name][1]:
            torch.testing.assert_close(rank["chunk"], one["chunk"], atol=1e-5, rtol=0)
            torch.testing.assert_close(rank["first"], one["first"], atol=1e-5, rtol=0)
            torch.testing.assert_close(rank["first"], one["chunk"][:, 0], atol=1e-5, rtol=0)


def test_sharded_runs_are_built_on_the_meta_device_with_the_eager_weights(sources):
    """Every sharded topology builds on the meta device and materializes its shards: the
    initial state is the one-process (eager) build's, bit for bit."""
    one = sources["single"][1][0]
    assert one["meta"] is None  # one process: built eagerly, nothing to say why
    for name in ("fsdp2", "fsdp2-size", "fsdp2-offload", "hsdp"):
        ranks = sources[name][1]
        assert all(rank["meta"] is True for rank in ranks), (name, ranks[0]["meta"])
        _equal(ranks[0]["model"], one["model"], f"{name} initial state")


@pytest.fixture(scope="module")
def vlm_weight_runs(parts) -> dict:
    """Fresh runs (no --policy.path) with load_vlm_weights=true: the VLM's own bf16 weights,
    a trainable expert and heads, --accelerator.mixed_precision=bf16. FSDP2 built eagerly
    (LEROBOT_PIPE_META_BUILD=0) and on the meta device, from the VLM's one file and from the
    same weights saved in shards (model.safetensors.index.json)."""
    from smolvla_tiny import build_tiny_smolvlm

    # Three text layers, of which the policy keeps num_vlm_layers=2.
    deeper = {"with_weights": True, "text": {"num_hidden_layers": 3}}
    one = build_tiny_smolvlm(parts["tmp"] / "vlm_3", **deeper)
    shards = build_tiny_smolvlm(parts["tmp"] / "vlm_3_shards", **deeper, max_shard_size="40KB")
    assert (shards / "model.safetensors.index.json").is_file()
    assert not (shards / "model.safetensors").exists()
    runs = {"file": one}
    for name, vlm, eager in [
        ("eager", one, True),
        ("meta", one, False),
        ("meta_shards", shards, False),
    ]:
        out = parts["tmp"] / f"vlm_weights_{name}"
        flags = _flags(
            parts,
            **{
                "policy.vlm_model_name": str(vlm),
                "policy.load_vlm_weights": "true",
                "policy.train_expert_only": "true",
                "accelerator.mixed_precision": "bf16",
                "steps": 2,
                "save_freq": 2,
            },
        )
        before = os.environ.get("LEROBOT_PIPE_META_BUILD")
        os.environ["LEROBOT_PIPE_META_BUILD"] = "0" if eager else "1"
        try:
            runs[name] = (out, _run("fsdp2", [*flags, f"--output_dir={out}"]))
        finally:
            if before is None:
                os.environ.pop("LEROBOT_PIPE_META_BUILD")
            else:
                os.environ["LEROBOT_PIPE_META_BUILD"] = before
    return runs


def test_load_vlm_weights_builds_on_the_meta_device_reading_the_vlms_own_files(vlm_weight_runs):
    """Item 7 for pretraining from the VLM's weights: each rank reads its rows of the VLM's
    file (or of its shards; layers past num_vlm_layers unread) and initializes the rest as the
    eager build does: the initial state equals the eager FSDP2 build's bit for bit (and the
    VLM the file's), the losses the same."""
    from safetensors.torch import load_file

    eager = vlm_weight_runs["eager"][1]
    assert all(rank["meta"] is not True for rank in eager)
    file = load_file(vlm_weight_runs["file"] / "model.safetensors")
    prefix = "model.vlm_with_expert.vlm."
    for name in ("meta", "meta_shards"):
        ranks = vlm_weight_runs[name][1]
        assert all(rank["meta"] is True for rank in ranks), (name, ranks[0]["meta"])
        _equal(ranks[0]["model"], eager[0]["model"], f"{name} vs eager initial state")
        vlm = {
            k.removeprefix(prefix): v for k, v in ranks[0]["model"].items() if k.startswith(prefix)
        }
        assert vlm and all(torch.equal(v, file[k]) for k, v in vlm.items())
        assert {k.split(".layers.")[1].split(".")[0] for k in set(file) - set(vlm)} == {"2"}
        curve, reference = losses(vlm_weight_runs[name][0]), losses(vlm_weight_runs["eager"][0])
        assert curve.keys() == reference.keys() == {1, 2}
        for step in curve:
            assert abs(curve[step] - reference[step]) < 1e-5, (name, step)


def test_every_layer_unit_is_really_sharded(sources):
    one = sources["single"][1][0]["units"]
    decoder = [n for n in one if ".layers." in n and "vision" not in n]
    assert len(decoder) == 4 and len(one) == 6, sorted(one)  # 2 VLM + 2 expert, 2 vision
    for name in ("fsdp2", "hsdp"):
        for rank in sources[name][1]:
            assert rank["units"].keys() == one.keys()
            for unit, (local, full) in rank["units"].items():
                assert full == one[unit][1]
                assert 0.4 * full <= local <= 0.6 * full, (name, unit, local, full)


def _equal(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), (what, set(a) ^ set(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), f"{what}: {k} differs"


@pytest.mark.parametrize("source, targets", [("fsdp2", ["single", "fsdp2"]), ("single", ["fsdp2"])])
def test_resharded_resume_loads_bit_exact(sources, source, targets, tmp_path):
    """Resumed from step K on another topology: the loaded model state equals the checkpoint's
    bit for bit (dtypes too), the optimizer state equals the single-file one (or, from FSDP2's
    shards, the one FSDP2 itself loads), and the run goes on as the uninterrupted one."""
    from safetensors.torch import load_file

    from lerobot_pipe.convert import load_dcp_state_dict

    src_out, _ = sources[source]
    step_dir = src_out / "checkpoints" / f"{K:06d}"
    model_file = step_dir / "pretrained_model/model.safetensors"
    saved = (
        load_file(model_file)
        if model_file.exists()
        else load_dcp_state_dict(step_dir / "pretrained_model/pytorch_model_fsdp_0")
    )
    optim_file = step_dir / "training_state/optimizer_state.safetensors"
    loaded = {}
    for target in targets:
        out = tmp_path / target
        argv = ["--resume=true", f"--config_path={step_dir}", f"--output_dir={out}"]
        loaded[target] = _run(target, [*argv, f"--steps={STEPS}"])[0]
        _equal(loaded[target]["model"], saved, f"{source}->{target} model")
        if optim_file.exists():
            _equal(loaded[target]["optim"], load_file(optim_file), f"{source}->{target} optim")
        curve, reference = losses(out), losses(src_out)
        for step in range(K + 1, STEPS + 1):
            assert abs(curve[step] - reference[step]) < 1e-5, (source, target, step)
    for target in targets[1:]:
        _equal(loaded[target]["optim"], loaded[targets[0]]["optim"], f"{source}->{target} optim")


# --- a smolvla_base-style checkpoint: bf16 base, LoRA -----------------------------------------

FEATURES = dict(
    input_features={
        "observation.images.top": {"type": "VISUAL", "shape": [3, 32, 32]},
        "observation.state": {"type": "STATE", "shape": [2]},
    },
    output_features={"action": {"type": "ACTION", "shape": [2]}},
)


@pytest.fixture(scope="module")
def base(parts) -> tuple[Path, dict[str, torch.dtype]]:
    """A smolvla_base-style checkpoint (load_vlm_weights=true: the VLM's bf16 weights, bf16
    expert, fp32 heads and swapped k/v projections) and its dtypes per key."""
    from lerobot_pipe.policies.smolvla import SmolVLAConfig, SmolVLAPolicy

    torch.manual_seed(0)
    cfg = SmolVLAConfig.tiny(
        vlm_model_name=str(parts["vlm_weights"]), load_vlm_weights=True, **FEATURES
    )
    policy = SmolVLAPolicy(cfg)
    folder = parts["tmp"] / "base"
    policy.save_pretrained(folder)
    dtypes = {k: v.dtype for k, v in policy.state_dict().items()}
    assert {dtypes["model.vlm_with_expert.lm_expert.layers.0.mlp.up_proj.weight"],
            dtypes["model.action_out_proj.weight"],
            dtypes["model.vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight"],
            dtypes["model.vlm_with_expert.lm_expert.layers.1.self_attn.q_proj.weight"]} == {
        torch.bfloat16, torch.float32}  # fmt: skip
    return folder, dtypes


def _base_flags(parts, base, **changes) -> list[str]:
    flags = {
        "policy.path": str(base[0]),
        "dataset.root": str(parts["dataset"]),
        "steps": 2,
        "save_freq": 2,
        "num_workers": 0,
        "log_freq": 1,
        "parallelism.dp_replicate": None,
        **changes,
    }
    return [f"--{k}={v}" for k, v in flags.items() if v is not None]


def test_a_bf16_base_without_mixed_precision_is_refused_before_launch(
    parts, base, tmp_path, monkeypatch, capsys
):
    """As rank 0 of a 2-process FSDP2 run: the expert's cross-attention layer mixes bf16 and
    fp32 trainable parameters; exit status 2, one line naming the unit and the flag."""
    from lerobot_pipe.scripts.train import main as train_main

    for key, value in {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", "1")
    argv = _base_flags(parts, base, **{"parallelism.dp_shard": 2})
    assert train_main([*argv, f"--output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert "FSDP2 unit model.vlm_with_expert.lm_expert.layers.1:" in err, err
    assert "mix dtypes" in err and "--accelerator.mixed_precision=bf16" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def bf16_runs(parts, base) -> dict[str, tuple[Path, list[dict]]]:
    """The base fine-tuned with --accelerator.mixed_precision=bf16 on FSDP2 and HSDP (2 steps),
    and with LoRA on FSDP2 (LeRobot's default targets, the expert's final norm trained in full,
    the action head's LoRA module left unsharded)."""
    lora = {
        "peft.r": 4,
        "peft.full_training_modules": '["lm_expert.norm"]',
        "accelerator.fsdp.ignored_modules": r".*action_out_proj$",
    }
    runs = {}
    for name, topology, extra in [
        ("fsdp2", "fsdp2", {}),
        ("hsdp", "hsdp", {"steps": 1, "save_freq": 1}),
        ("lora", "fsdp2", lora),
    ]:
        out = parts["tmp"] / f"bf16_{name}"
        argv = _base_flags(parts, base, **{"accelerator.mixed_precision": "bf16", **extra})
        runs[name] = (out, _run(topology, [*argv, f"--output_dir={out}"]))
    return runs


@pytest.mark.parametrize("name", ["fsdp2", "hsdp"])
def test_a_bf16_base_fine_tunes_keeping_trainable_parameters_in_fp32(bf16_runs, base, name):
    from safetensors.torch import load_file

    from lerobot_pipe.convert import load_dcp_state_dict

    out, ranks = bf16_runs[name]
    curve = losses(out)
    assert curve and all(torch.isfinite(torch.tensor(v)) for v in curve.values())
    step = max(curve)
    saved = load_dcp_state_dict(
        out / f"checkpoints/{step:06d}/pretrained_model/pytorch_model_fsdp_0"
    )
    trained = {n for n, p in ranks[0]["dtypes"].items()}  # names as the policy's
    assert saved.keys() == base[1].keys() == trained
    loaded = ranks[0]["model"]  # the base as loaded, before the first step
    assert all(rank["meta"] for rank in ranks)  # read shard by shard from its file
    file = load_file(base[0] / "model.safetensors")
    for key, dtype in base[1].items():
        assert torch.equal(loaded[key], file[key].to(loaded[key].dtype)), key
        trainable = "vlm_with_expert.vlm." not in key  # train_expert_only
        want = torch.float32 if trainable else dtype
        assert saved[key].dtype == want == ranks[0]["dtypes"][key], key
        assert loaded[key].dtype == want, key
    for rank in ranks:  # every layer unit sharded, the frozen bf16 VLM's too
        for unit, (local, full) in rank["units"].items():
            assert 0.4 * full <= local <= 0.6 * full, (name, unit, local, full)


def test_lora_on_a_bf16_base_fine_tunes_on_fsdp2_and_its_adapter_converts(bf16_runs, base):
    from safetensors.torch import load_file

    from lerobot_pipe.scripts.convert_dcp import main as convert_main

    out, ranks = bf16_runs["lora"]
    assert len(losses(out)) == 2
    assert all(rank["meta"] for rank in ranks)
    for rank in ranks:  # the frozen base is sharded with the adapters
        assert len(rank["units"]) == 6
        for unit, (local, full) in rank["units"].items():
            assert unit.startswith("base_model.model.model.")
            assert 0.4 * full <= local <= 0.6 * full, (unit, local, full)
    dtypes = ranks[0]["dtypes"]
    # The base as it was (frozen), the adapters and the fully trained norm in fp32.
    for name, dtype in dtypes.items():
        if ".lora_" in name or "modules_to_save" in name:
            assert dtype == torch.float32, name
        elif "base_layer" not in name and "original_module" not in name:
            assert dtype == base[1][name.removeprefix("base_model.model.")], name
    step = out / "checkpoints/000002"
    assert convert_main([f"--checkpoint_dir={step}"]) == 0
    adapter = load_file(step / "pretrained_model/adapter_model.safetensors")
    prefix = "base_model.model.model."
    lora_modules = {k.removeprefix(prefix).rsplit(".lora_", 1)[0] for k in adapter if ".lora_" in k}
    assert lora_modules == {
        *(f"vlm_with_expert.lm_expert.layers.{i}.self_attn.{p}_proj" for i in (0, 1) for p in "qv"),
        "state_proj", "action_in_proj", "action_out_proj", "action_time_mlp_in",
        "action_time_mlp_out",
    }  # fmt: skip
    assert f"{prefix}vlm_with_expert.lm_expert.norm.weight" in adapter  # modules_to_save
    assert all(v.dtype == torch.float32 for v in adapter.values())


def test_lora_defaults_and_ignored_modules_under_peft(parts, base):
    """LeRobot's default SmolVLA targets; adapters in fp32 on a bf16 base (before any
    sharding); ``--accelerator.fsdp.ignored_modules`` is matched against PEFT's names, and a
    pattern that matches nothing says so and how to start it."""
    from lerobot_pipe.configs.parser import ConfigError
    from lerobot_pipe.configs.train import AcceleratorConfig, PeftConfig
    from lerobot_pipe.distributed.parallelize import ignored_module_names
    from lerobot_pipe.policies.peft import apply_peft
    from lerobot_pipe.policies.smolvla import SmolVLAPolicy

    policy = SmolVLAPolicy.from_pretrained(base[0])
    model = apply_peft(policy, PeftConfig(r=4), str(base[0]))
    assert model.peft_config["default"].target_modules == SmolVLAPolicy._peft_target_modules
    lora = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}
    assert lora and all(".lora_" in n and d == torch.float32 for n, d in lora.items())
    pattern = AcceleratorConfig().fsdp.ignored_modules
    assert pattern is None
    assert ignored_module_names(model, r".*model\.state_proj$") == [
        "base_model.model.model.state_proj"
    ]
    with pytest.raises(ConfigError, match=r"start with 'base_model\.model\.'.*start the pattern"):
        ignored_module_names(model, r"^model\.state_proj$")


# --- activation checkpointing (--accelerator.activation_checkpointing.mode) -------------------

RECOMPUTED = (  # a unit entered by run_as_unit (an expert layer's MLP), a vision layer (forward)
    "model.vlm_with_expert.lm_expert.layers.0.mlp",
    "model.vlm_with_expert.vlm.model.vision_model.encoder.layers.0.mlp",
)


def _training_batch(config) -> tuple[dict, torch.Tensor]:
    batch, noise = _inference_batch(config)
    g = torch.Generator().manual_seed(3)
    batch["action"] = torch.randn(2, config.chunk_size, 2, generator=g)
    batch["action_is_pad"] = torch.tensor([[False] * 4, [False, False, False, True]])
    return batch, noise


# One rank's loss and gradients on _training_batch (vla_tools.gradients_of_one_batch).
ONE_BATCH = functools.partial(
    gradients_of_one_batch, make_batch=_training_batch, counted=RECOMPUTED
)


@pytest.fixture(scope="module")
def checkpointed(parts) -> dict[tuple[str, str], list[dict]]:
    runs = {}
    for topology in ("single", "fsdp2"):
        for mode in ("none", "full"):
            out = parts["tmp"] / f"ac_{topology}_{mode}"
            argv = [
                *_flags(parts),
                f"--output_dir={out}",
                f"--accelerator.activation_checkpointing.mode={mode}",
            ]
            runs[topology, mode] = _run(topology, argv, ONE_BATCH)
    return runs


@pytest.mark.parametrize("topology", ["single", "fsdp2"])
def test_activation_checkpointing_gives_the_same_gradients(checkpointed, topology):
    """mode=full recomputes every unit in the backward (an entered expert layer and a vision
    layer run twice per step), keeps fewer activation bytes, and gives the same loss and
    gradients as mode=none within 1e-6, on one process and on FSDP2 (2 processes)."""
    plain, recomputed = checkpointed[topology, "none"], checkpointed[topology, "full"]
    for a, b in zip(plain, recomputed, strict=True):
        torch.testing.assert_close(b["loss"], a["loss"], atol=1e-6, rtol=0)
        assert a["grads"].keys() == b["grads"].keys() and len(a["grads"]) > 10
        for name, grad in a["grads"].items():
            torch.testing.assert_close(b["grads"][name], grad, atol=1e-6, rtol=0, msg=name)
        assert a["calls"] == dict.fromkeys(RECOMPUTED, 1)
        assert b["calls"] == dict.fromkeys(RECOMPUTED, 2)
        assert b["kept"] < 0.5 * a["kept"], (b["kept"], a["kept"])
