"""The memory planner (issue #40): its activation estimate against a real forward's memory, the
JSON it prints, its suggestions each making the plan fit when applied. The exact state bytes
against real sharded runs are in test_memory_state.py (the rest tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memory_runs import peak_of_a_cpu_run, saved_by_a_real_forward, tiny_smolvla_flags
from pi_tiny import paligemma_tokenizer_cache
from tiny import run_train, tiny_act_flags, tiny_diffusion_flags

from lerobot_pipe.policies.pi0 import PI_TINY_PRESET
from lerobot_pipe.training.memory_model import GIB

JSON_KEYS = {
    "parameters",
    "trainable_parameters",
    "world_size",
    "gpu_memory_bytes",
    "peak_phase",
    "per_rank",
    "dtypes",
    "assumptions",
    "fits",
    "suggestions",
}
PER_RANK_KEYS = {
    "parameters_bytes",
    "gradients_bytes",
    "optimizer_bytes",
    "ema_bytes",
    "gathered_bytes",
    "activations_bytes",
    "allowance_bytes",
    "total_bytes",
    "host_bytes",
}


def pi_flags(root: Path, kind: str = "pi05", **changes) -> list[str]:
    preset = {k: v for k, v in PI_TINY_PRESET.items() if k != "image_resolution"}
    flags = {
        "policy.type": kind,
        **{f"policy.{k}": v for k, v in preset.items()},
        "policy.image_resolution": "[56,56]",
        "dataset.root": str(root),
        "steps": 2,
        "num_workers": 0,
        **changes,
    }
    return [f"--{k}={v}" for k, v in flags.items()]


@pytest.fixture(scope="module")
def pi_root(tmp_path_factory):
    from lerobot_pipe.datasets import write_synthetic_dataset

    tmp = tmp_path_factory.mktemp("planner_pi")
    root = write_synthetic_dataset(
        tmp / "ds", num_episodes=4, episode_length=10, cameras=["top"], image_size=56,
        pixels_only=True, num_tasks=2,
    )  # fmt: skip
    with paligemma_tokenizer_cache(tmp / "hf"):
        yield root


def _profile(argv: list[str]):
    from lerobot_pipe.training.activation_probe import probe_activations
    from lerobot_pipe.training.data import make_processors
    from lerobot_pipe.training.preflight import build_on_meta_for_checks, make_plan

    plan = make_plan(argv, 1)
    _, trainee = build_on_meta_for_checks(plan.cfg, plan.dataset)
    pre, _ = make_processors(plan, "cpu")
    return plan, probe_activations(plan, trainee, pre, [])


@pytest.fixture(scope="module")
def smolvla_flags(tmp_path_factory) -> list[str]:
    """A tiny SmolVLM (smolvla_tiny) over a 32-pixel one-camera dataset."""
    pytest.importorskip("transformers", reason="SmolVLA needs transformers")
    tmp = tmp_path_factory.mktemp("planner_smolvla")
    return [*tiny_smolvla_flags(tmp, num_episodes=4), "--steps=2", "--num_workers=0"]


@pytest.fixture(scope="module")
def diffusion_lora_flags(diffusion_camera_root, tmp_path_factory) -> list[str]:
    """LoRA (its declared targets) over a tiny Diffusion Policy trained one step."""
    out = tmp_path_factory.mktemp("planner_diffusion") / "base"
    run_train([*tiny_diffusion_flags(**{"dataset.root": diffusion_camera_root, "steps": 1}),
               f"--output_dir={out}"])  # fmt: skip
    base = out / "checkpoints/000001/pretrained_model"
    return [f"--policy.path={base}", "--peft.method_type=LORA", "--peft.r=4"]


EXPERT_ONLY = {"policy.train_expert_only": "true"}


@pytest.mark.parametrize(
    "label",
    [
        "act",
        "diffusion",
        "diffusion_lora",
        "smolvla",
        "smolvla_expert_only",
        "pi0",
        "pi0_expert_only",
        "pi05",
        "pi05_expert_only",
    ],
)
def test_activations_within_15_percent_of_a_real_forward(label, request, tmp_path):
    """The estimate, from saved-tensor hooks on the meta device at batch 1 and 2, against the
    bytes a real CPU forward leaves alive (a dispatch mode's storage accounting) at 4 and 8:
    each native policy, trained in full and in a lighter mode (LoRA, or the expert alone)."""
    kind, _, mode = label.partition("_")
    if kind == "act":
        root = request.getfixturevalue("dataset_root")
        argv = tiny_act_flags(**{"dataset.root": root, "steps": 2})
    elif kind == "diffusion":
        root = request.getfixturevalue("diffusion_camera_root")
        argv = tiny_diffusion_flags(**{"dataset.root": root, "steps": 2})
        argv += request.getfixturevalue("diffusion_lora_flags") if mode == "lora" else []
    elif kind == "smolvla":
        # SmolVLA trains its expert alone by default; in full, the VLM and its vision tower too.
        frozen = "true" if mode else "false"
        argv = [*request.getfixturevalue("smolvla_flags"), f"--policy.train_expert_only={frozen}",
                f"--policy.freeze_vision_encoder={frozen}"]  # fmt: skip
    else:
        argv = pi_flags(request.getfixturevalue("pi_root"), kind, **(EXPERT_ONLY if mode else {}))
    plan, profile = _profile([*argv, f"--output_dir={tmp_path / 'out'}"])
    measured = {
        batch: (profile.saved(batch), saved_by_a_real_forward(plan, batch)) for batch in (4, 8)
    }
    for batch, (estimated, real) in measured.items():
        print(f"{label} batch {batch}: estimated/real = {estimated / real:.3f}")
    for batch, (estimated, real) in measured.items():
        assert abs(estimated - real) <= 0.15 * real, (label, batch, estimated, real)


@pytest.mark.parametrize(
    ("kind", "precision", "batch", "world"),
    [
        ("act", "no", 8, 1),
        ("act", "bf16", 32, 1),
        ("diffusion", "no", 32, 1),
        ("diffusion", "bf16", 8, 1),
        ("act", "no", 8, 2),
        ("diffusion", "no", 64, 2),
    ],
)
def test_a_whole_steps_plan_within_8_percent_of_a_real_runs_peak(
    kind, precision, batch, world, request, tmp_path
):
    """The plan's counted peak (its total less the allowance) against the most bytes a real
    3-step run held at once on the CPU (every storage it created, from creation to release; the
    larger rank of 2 under DDP): bench/gpu_memory_check.py's comparison, here at the tiny sizes
    (its rehearsal runs LeRobot's default sizes). Its band is 15 %; here, with nothing a GPU
    adds and the same allocations at every run, 8 % (measured: 0.99-1.04 in one process,
    0.95-0.99 with DDP). Diffusion's camera backbone runs first and is back-propagated last: its
    activations are still held while the U-Net's gradients are written (a plan that wrote every
    gradient only at the backward's end said 0.86 at batch 32); DDP's buckets, which hold the
    gradients, are allocated when it wraps the model (a plan without them said 0.91)."""
    from launch import run_distributed

    from lerobot_pipe.training.memory_plan import plan_memory

    if kind == "act":
        flags = tiny_act_flags(**{"dataset.root": request.getfixturevalue("dataset_root")})
    else:
        flags = tiny_diffusion_flags(
            **{"dataset.root": request.getfixturevalue("diffusion_camera_root")}
        )
    argv = [*flags, f"--batch_size={batch}", f"--accelerator.mixed_precision={precision}",
            "--steps=3", "--save_checkpoint=false", "--parallelism.dp_shard=1",
            f"--output_dir={tmp_path / 'out'}"]  # fmt: skip
    planned = plan_memory(argv, world, world, suggest=False).estimate.peak.counted
    if world == 1:
        measured = peak_of_a_cpu_run(argv)
    else:
        measured = max(run_distributed(peak_of_a_cpu_run, world, argv))
    print(f"{kind} {precision} batch {batch} x{world}: planned/measured = {planned / measured:.3f}")
    assert abs(planned - measured) <= 0.08 * measured, (planned, measured)


def test_json_has_the_documented_keys(dataset_root, tmp_path, capsys):
    from lerobot_pipe.scripts.cli import main

    argv = tiny_act_flags(**{"dataset.root": dataset_root, "output_dir": tmp_path / "o"})
    code = main(["plan-memory", *argv, "--world_size=2", "--parallelism.dp_shard=2",
                 "--gpu_memory_gb=80", "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(out) == JSON_KEYS and set(out["per_rank"]) == PER_RANK_KEYS
    assert out["world_size"] == 2 and out["gpu_memory_bytes"] == 80 * 10**9
    assert out["fits"] is True and out["suggestions"] == []
    assert out["peak_phase"] in ("forward", "backward", "optimizer")
    assert all(isinstance(a, str) for a in out["assumptions"])


def test_each_suggestion_fits_when_applied(pi_root, tmp_path):
    """pi0.5 (dummy geometry) on one process with a GPU a little too small: the suggestions
    that say they fit do, planned again with their flags."""
    from lerobot_pipe.configs.parser import split_flags
    from lerobot_pipe.training.memory_plan import plan_memory, with_flags

    argv = pi_flags(pi_root, batch_size=8, output_dir=tmp_path / "o")
    alone = plan_memory(argv, 1, suggest=False)
    gpu = alone.total_bytes - (alone.total_bytes - GIB) // 10  # 10 % of what it counts short
    plan = plan_memory(argv, 1, gpu_memory_bytes=gpu)
    assert plan.fits is False
    fitting = [s for s in plan.suggestions if s.fits]
    assert fitting, plan.describe()
    assert [s.fits for s in plan.suggestions] == sorted(
        (s.fits for s in plan.suggestions), reverse=True
    )
    for suggestion in fitting:
        flags = split_flags(list(suggestion.flags))
        world = int(flags.pop("world_size", 1))
        again = plan_memory(with_flags(argv, flags), world, suggest=False, gpu_memory_bytes=gpu)
        assert again.fits and again.total_bytes == suggestion.total_bytes, suggestion


def test_the_trainer_banner_line_names_the_plans_peak(dataset_root, tmp_path):
    import torch

    from lerobot_pipe.training.memory_plan import banner_line
    from lerobot_pipe.training.preflight import make_plan

    argv = tiny_act_flags(**{"dataset.root": dataset_root, "output_dir": tmp_path / "o"})
    before = torch.random.get_rng_state()
    line = banner_line(make_plan(argv, 1), 1, torch.device("cpu"))
    assert line.startswith("Memory plan: ") and "GiB per rank at the peak" in line
    assert torch.equal(torch.random.get_rng_state(), before)  # the run draws as without it


def test_validate_refuses_a_cpu_run_beyond_the_nodes_host_memory(dataset_root, tmp_path, capsys):
    """Without a GPU size and without GPUs the ranks train on the host: their plan is checked
    against --mem_mb (slurm.mem_mb)."""
    import torch

    from lerobot_pipe.scripts.cli import main

    if torch.cuda.is_available():
        pytest.skip("with a GPU the ranks train on it")
    argv = tiny_act_flags(**{"dataset.root": dataset_root, "output_dir": tmp_path / "o"})
    assert main(["validate", "--mem_mb=1", *argv]) == 2
    assert "raise slurm.mem_mb to at least" in capsys.readouterr().err
    assert main(["validate", "--mem_mb=8000", *argv]) == 0


def test_offload_accumulation_and_resharding_move_the_terms():
    """The arithmetic alone (memory_model): CPU offload moves the state to the host, gradient
    accumulation keeps FSDP2's unsharded gradients, reshard_after_forward=false keeps every
    unit gathered."""
    from lerobot_pipe.training.memory_model import Activations, Param, Setup, estimate

    params = [
        Param(f"u{i}.w", (1000, 100), 4, trainable=True, reached=True, unit=f"u{i}")
        for i in range(4)
    ]
    acts = Activations(root=10**6, units={f"u{i}": 10**6 for i in range(4)},
                       order=tuple(f"u{i}" for i in range(4)))  # fmt: skip
    base = Setup(world_size=4, nproc_per_node=4, dp_shard=4)
    plain = estimate(params, base, acts)
    state = plain.state
    assert state.parameters == 4 * 250 * 100 * 4 and state.optimizer == 2 * state.parameters + 16
    offload = estimate(params, Setup(**{**vars(base), "cpu_offload": True}), acts)
    assert (
        offload.phases["optimizer"].parameters == 0 and offload.phases["optimizer"].optimizer == 0
    )
    assert offload.host_bytes == 4 * (state.parameters + state.gradients + state.optimizer)
    accumulating = estimate(params, Setup(**{**vars(base), "accumulation": 2}), acts)
    unsharded = 4 * 1000 * 100 * 4
    assert accumulating.phases["forward"].gradients == unsharded
    kept = estimate(params, Setup(**{**vars(base), "reshard_after_forward": False}), acts)
    assert kept.phases["forward"].gathered == unsharded  # every unit gathered, fp32
    assert plain.phases["forward"].gathered == 2 * unsharded // 4  # in flight and prefetched
