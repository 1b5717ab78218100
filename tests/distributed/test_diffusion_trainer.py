"""Diffusion Policy through the real trainer (make_plan / prepare_session / run_loop, real gloo
groups, the synthetic camera dataset decoded from AV1), with its randomness on (noise, diffusion
steps, random crops):

- DDP, FSDP2 and HSDP vs one process at the same global batch (group norm: no per-rank batch
  statistics), within 1e-5;
- resume on the same topology bit-exact, and FSDP2 DCP -> one process (resharded) with the
  loaded state bit-exact; the DCP checkpoint converts to a model.safetensors LeRobot's names;
- trainable batch norm: without sync, DDP and FSDP2 save the same (rank 0's) statistics and every
  FSDP2 rank holds them after a save; with --accelerator.sync_batch_norm, FSDP2 matches one
  process, statistics included;
- bf16 FSDP2 with LoRA from a trained checkpoint, fp16 with the loss scaler;
- the sampler never draws an episode's last drop_n_last_frames frames.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from launch import run_distributed
from safetensors.torch import load_file
from tiny import full_state, losses, tiny_diffusion_flags

from lerobot_pipe import constants as C
from lerobot_pipe.convert import convert_checkpoint, load_dcp_state_dict
from lerobot_pipe.datasets import GlobalBatchSampler
from lerobot_pipe.distributed.batch_norm import batch_norms
from lerobot_pipe.distributed.runtime import destroy, init_distributed
from lerobot_pipe.policies.diffusion import DiffusionPolicy
from lerobot_pipe.training.data import sample_indices
from lerobot_pipe.training.loop import run_loop
from lerobot_pipe.training.preflight import make_plan
from lerobot_pipe.training.session import prepare_session

# Twelve runs behind one fixture: too long for the fast tier's 5 minutes.
pytestmark = pytest.mark.slow

GN = {"policy.use_group_norm": "true"}
CROP = {"policy.crop_shape": "[40,40]"}  # of 48x48 frames; resnet18's feature map stays 2x2


def train_rank(argv: list[str]) -> dict:
    """One rank: plan, build (and restore), train; the loaded and final full states (main rank)
    and this rank's batch norm statistics after the last save."""
    plan = make_plan(argv, int(os.environ.get("WORLD_SIZE", "1")), os.environ)
    env = init_distributed()
    try:
        session = prepare_session(plan, env)
        out = {}
        if plan.resume_from is not None:
            out["loaded"] = full_state(session)
        run_loop(env, session)
        out["final"] = full_state(session)
        out["bn"] = {
            f"{i}.{name}": buffer.clone()
            for i, module in enumerate(batch_norms(session.model))
            for name, buffer in module.named_buffers()
        }
    finally:
        destroy()
    return out if env.is_main else {"bn": out["bn"]}


@pytest.fixture(scope="module")
def runs(diffusion_camera_root, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("diffusion_trainer")

    def flags(name: str, steps: int, batch: int, **overrides) -> list[str]:
        return tiny_diffusion_flags(
            **{
                "dataset.root": diffusion_camera_root,
                "steps": steps,
                "save_freq": 0,
                "batch_size": batch,
                "output_dir": root / name,
                **overrides,
            }
        )

    fsdp = {"parallelism.dp_shard": 2, "checkpoint_format": "dcp"}
    out = {"root": root}
    out["single"] = train_rank(flags("single", 4, 8, save_freq=2, **GN, **CROP))
    out["ddp"] = run_distributed(train_rank, 2, flags("ddp", 4, 4, **GN, **CROP))
    out["fsdp"] = run_distributed(
        train_rank, 2, flags("fsdp", 4, 4, save_freq=2, **fsdp, **GN, **CROP)
    )
    step2 = root / "fsdp" / C.CHECKPOINTS_DIR / "000002"
    resume = ["--resume=true", f"--config_path={step2}", "--steps=4"]
    out["resumed_same"] = run_distributed(
        train_rank, 2, [*resume, f"--output_dir={root / 'resumed_same'}"]
    )
    out["resumed_single"] = train_rank(
        [
            *resume,
            "--batch_size=8",  # the same global batch on one process
            "--parallelism.dp_shard=1",
            "--checkpoint_format=safetensors",
            f"--output_dir={root / 'resumed_single'}",
        ]
    )
    out["hsdp"] = run_distributed(
        train_rank,
        4,
        flags(
            "hsdp", 2, 2, **{"parallelism.dp_replicate": 2, "parallelism.dp_shard": 2}, **GN, **CROP
        ),
    )
    sync = {"accelerator.sync_batch_norm": "true"}
    out["single_sync"] = train_rank(flags("single_sync", 2, 8, **sync))
    out["fsdp_sync"] = run_distributed(train_rank, 2, flags("fsdp_sync", 2, 4, **fsdp, **sync))
    out["ddp_bn"] = run_distributed(train_rank, 2, flags("ddp_bn", 2, 4))
    out["fsdp_bn"] = run_distributed(train_rank, 2, flags("fsdp_bn", 2, 4, **fsdp))
    base = root / "single" / C.CHECKPOINTS_DIR / "000004" / C.PRETRAINED_MODEL_DIR
    out["lora_bf16"] = run_distributed(
        train_rank,
        2,
        flags(
            "lora_bf16",
            2,
            4,
            **{
                "policy.path": base,
                "peft.r": 4,
                "parallelism.dp_shard": 2,
                "accelerator.mixed_precision": "bf16",
            },
        ),
    )
    out["fp16"] = train_rank(flags("fp16", 2, 8, **{"accelerator.mixed_precision": "fp16"}))
    return out


def close(a: dict[int, float], b: dict[int, float], steps) -> None:
    for step in steps:
        assert abs(a[step] - b[step]) < 1e-5, (step, a[step], b[step])


def test_ddp_fsdp2_hsdp_match_one_process(runs) -> None:
    root = runs["root"]
    single = losses(root / "single")
    assert len(set(single.values())) == 4  # it trains, with noise: every step differs
    close(single, losses(root / "ddp"), range(1, 5))
    close(single, losses(root / "fsdp"), range(1, 5))
    close(single, losses(root / "hsdp"), (1, 2))


def test_resume_on_the_same_topology_is_bit_exact(runs) -> None:
    root = runs["root"]
    fsdp, resumed = losses(root / "fsdp"), losses(root / "resumed_same")
    assert [resumed[s] for s in (3, 4)] == [fsdp[s] for s in (3, 4)]
    final, again = runs["fsdp"][0]["final"], runs["resumed_same"][0]["final"]
    for part in ("model", "optim"):
        assert final[part].keys() == again[part].keys()
        for key, value in final[part].items():
            assert torch.equal(again[part][key], value), f"{part}: {key}"


def test_fsdp2_checkpoint_resumes_resharded_and_converts(runs, tmp_path) -> None:
    step2 = runs["root"] / "fsdp" / C.CHECKPOINTS_DIR / "000002"
    files = load_dcp_state_dict(step2 / C.PRETRAINED_MODEL_DIR / C.MODEL_DCP_DIR)
    loaded = runs["resumed_single"]["loaded"]["model"]
    assert files.keys() == loaded.keys()
    for key, value in files.items():
        assert torch.equal(loaded[key], value), key
    close(losses(runs["root"] / "fsdp"), losses(runs["root"] / "resumed_single"), (3, 4))
    weights = convert_checkpoint(
        runs["root"] / "fsdp" / C.CHECKPOINTS_DIR / "000004", output_dir=tmp_path / "out"
    )
    policy = DiffusionPolicy.from_pretrained(tmp_path / "out")  # strict
    for key, value in runs["fsdp"][0]["final"]["model"].items():
        assert torch.equal(policy.state_dict()[key], value), key
    assert load_file(weights).keys() == policy.state_dict().keys()


def test_batch_norm_statistics_are_rank_zeros_in_every_topology(runs) -> None:
    ddp, fsdp = runs["ddp_bn"], runs["fsdp_bn"]
    saved = load_dcp_state_dict(
        runs["root"]
        / "fsdp_bn"
        / C.CHECKPOINTS_DIR
        / "000002"
        / C.PRETRAINED_MODEL_DIR
        / C.MODEL_DCP_DIR
    )
    stats = {k: v for k, v in saved.items() if k.endswith(("running_mean", "running_var"))}
    assert len(stats) == 40
    ddp_final = ddp[0]["final"]["model"]
    for key, value in stats.items():
        torch.testing.assert_close(value, ddp_final[key], rtol=0, atol=1e-5)
    # After a save every FSDP2 rank holds rank 0's statistics (each had its own before).
    for key, value in fsdp[0]["bn"].items():
        assert torch.equal(fsdp[1]["bn"][key], value), key
    # Without sync each rank normalizes by its own half, in DDP and FSDP2 alike.
    assert abs(losses(runs["root"] / "ddp_bn")[1] - losses(runs["root"] / "fsdp_bn")[1]) < 1e-5


def test_sync_batch_norm_matches_one_process(runs) -> None:
    single, fsdp = runs["single_sync"], runs["fsdp_sync"]
    close(losses(runs["root"] / "single_sync"), losses(runs["root"] / "fsdp_sync"), (1, 2))
    stats = [k for k in single["final"]["model"] if k.endswith(("running_mean", "running_var"))]
    assert len(stats) == 40
    for key in stats:
        expected = single["final"]["model"][key]
        torch.testing.assert_close(fsdp[0]["final"]["model"][key], expected, rtol=0, atol=1e-5)
    for key, value in fsdp[0]["bn"].items():
        assert torch.equal(fsdp[1]["bn"][key], value), key
    unsynced = losses(runs["root"] / "fsdp_bn")
    assert abs(unsynced[1] - losses(runs["root"] / "single_sync")[1]) > 1e-5


def test_lora_under_fsdp2_bf16_and_fp16(runs) -> None:
    final = runs["lora_bf16"][0]["final"]["model"]
    moved = [k for k in final if "lora_B" in k and final[k].abs().sum() > 0]
    assert moved and all(".cond_encoder.1." in k or ".conv1.block.0." in k for k in moved)
    adapter = runs["root"] / "lora_bf16" / C.CHECKPOINTS_DIR / "000002" / C.PRETRAINED_MODEL_DIR
    assert (adapter / C.ADAPTER_SAFETENSORS).is_file()
    for name in ("lora_bf16", "fp16"):
        assert all(np.isfinite(v) for v in losses(runs["root"] / name).values()), name


def test_the_sampler_never_draws_the_last_frames(diffusion_camera_root, tmp_path) -> None:
    plan = make_plan(
        tiny_diffusion_flags(**{"dataset.root": diffusion_camera_root, "output_dir": tmp_path}),
        1,
        {},
    )
    drawable = sample_indices(plan.cfg.policy, plan.dataset)
    frame = plan.dataset.get_batch(drawable)["frame_index"].numpy()
    assert len(drawable) == 6 * (30 - 3) and frame.max() == 30 - 3 - 1
    sampler = GlobalBatchSampler(len(plan.dataset), 8, 0, 1, seed=0, indices=drawable)
    seen = np.concatenate([sampler.next_indices() for _ in range(2 * len(drawable) // 8)])
    assert set(seen.tolist()) == set(drawable.tolist())
