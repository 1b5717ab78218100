"""ACT with a camera through the real trainer (prepare_session / run_loop, real gloo groups):
DDP on 2 processes vs one process at the same global batch, FSDP2 with the backbone sharded,
and a resharded resume FSDP2 -> DDP whose loaded state is bit-exact.

The frames come from an in-memory stand-in for LeRobotDataset (the attributes and get_batch()
the trainer reads, frames float32 (B, 3, H, W) in [0, 1]) so that these tests do not depend on
video decoding; everything after the dataset is the trainer's own code.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from launch import run_distributed
from safetensors.torch import load_file
from tiny import DETERMINISTIC, full_state, losses, tiny_act_flags

from lerobot_pipe import constants as C
from lerobot_pipe.configs.loading import parse_train_config
from lerobot_pipe.convert import load_dcp_state_dict
from lerobot_pipe.distributed.parallel_dims import resolve_parallelism
from lerobot_pipe.distributed.runtime import destroy, init_distributed
from lerobot_pipe.training.config_checks import resolve_config
from lerobot_pipe.training.loop import run_loop
from lerobot_pipe.training.preflight import TrainingPlan, plan_on_dataset, resume_point
from lerobot_pipe.training.session import prepare_session

# Its runs share one fixture, too long for the fast tier's 5 minutes.
pytestmark = pytest.mark.slow

CAMERA = "observation.images.top"
HW, STATE_DIM, ACTION_DIM = (64, 64), 2, 2
LR_BACKBONE = 3e-4


class InMemoryCameraDataset:
    """Episodes of random frames, states and actions; ``action`` windows of ``chunk`` steps
    padded at the episode end, as LeRobotDataset returns them with delta timestamps."""

    def __init__(self, root: str, num_frames: int = 48, episode_length: int = 12, chunk: int = 10):
        gen = torch.Generator().manual_seed(0)
        self.root = Path(root)
        self.num_episodes = num_frames // episode_length
        self.episode_length, self.chunk = episode_length, chunk
        self.frames = torch.rand(num_frames, 3, *HW, generator=gen)
        self.state = torch.randn(num_frames, STATE_DIM, generator=gen)
        self.actions = torch.randn(num_frames, ACTION_DIM, generator=gen)
        self.features = {
            CAMERA: {"dtype": "video", "shape": [*HW, 3], "names": ["height", "width", "channels"]},
            "observation.state": {"dtype": "float32", "shape": [STATE_DIM]},
            "action": {"dtype": "float32", "shape": [ACTION_DIM]},
        }
        # Camera stats per channel, shaped (3, 1, 1) as LeRobot's stats.json holds them.
        camera = {"mean": np.full((3, 1, 1), 0.5), "std": np.full((3, 1, 1), 0.29)}
        self.stats = {
            CAMERA: {**camera, "min": np.zeros((3, 1, 1)), "max": np.ones((3, 1, 1))},
            "observation.state": self._stats(self.state),
            "action": self._stats(self.actions),
        }

    @staticmethod
    def _stats(x: torch.Tensor) -> dict[str, np.ndarray]:
        return {
            "mean": x.mean(0).numpy(),
            "std": x.std(0).numpy(),
            "min": x.min(0).values.numpy(),
            "max": x.max(0).values.numpy(),
        }

    def __len__(self) -> int:
        return len(self.frames)

    def get_batch(self, indices) -> dict[str, torch.Tensor]:
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.int64)
        last = (idx // self.episode_length + 1) * self.episode_length - 1
        wanted = idx[:, None] + torch.arange(self.chunk)
        return {
            CAMERA: self.frames[idx],
            "observation.state": self.state[idx],
            "action": self.actions[torch.minimum(wanted, last[:, None])],
            "action_is_pad": wanted > last[:, None],
        }


def camera_plan(argv: list[str], world_size: int) -> TrainingPlan:
    """make_plan's steps, with the in-memory dataset in place of the one it opens."""
    cfg, source_step = parse_train_config(argv)
    cfg = resolve_config(cfg)
    dims = resolve_parallelism(cfg.parallelism, world_size)
    dataset = InMemoryCameraDataset(cfg.dataset.root, chunk=cfg.policy.chunk_size)
    return plan_on_dataset(cfg, dims, dataset, resume_point(cfg, source_step))


def train_rank(argv: list[str]) -> dict:
    """One rank: build (and restore) the session, record its optimizer groups, how much of the
    backbone this rank holds and the loaded state, train, and return the final state."""
    plan = camera_plan(argv, int(os.environ.get("WORLD_SIZE", "1")))
    env = init_distributed()
    try:
        session = prepare_session(plan, env)
        backbone = list(session.policy.model.backbone.parameters())
        local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in backbone)
        out = {
            "groups": [(len(g["params"]), g["lr"]) for g in session.optimizer.param_groups],
            "n_backbone": len(backbone),
            "backbone_fraction": local / sum(p.numel() for p in backbone),
        }
        if plan.resume_from is not None:
            # Only then: reading a fresh optimizer's state makes torch initialize it with a step.
            out["loaded"] = full_state(session)
        run_loop(env, session)
        out["final"] = full_state(session)
    finally:
        destroy()
    return out if env.is_main else {k: out[k] for k in ("groups", "backbone_fraction")}


def _flags(root: Path, **overrides) -> list[str]:
    return tiny_act_flags(
        **DETERMINISTIC,
        **{
            "dataset.root": root / "frames",
            "policy.pretrained_backbone_weights": "null",
            "policy.optimizer_lr_backbone": LR_BACKBONE,
            "steps": 4,
            "save_freq": 0,
            **overrides,
        },
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("act_cameras")
    single = train_rank(
        [*_flags(root, save_freq=4), "--batch_size=8", f"--output_dir={root / 'single'}"]
    )
    ddp = run_distributed(
        train_rank, 2, [*_flags(root), "--batch_size=4", f"--output_dir={root / 'ddp'}"]
    )
    fsdp = run_distributed(
        train_rank,
        2,
        [
            *_flags(root, steps=2, save_freq=2),
            "--batch_size=4",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=dcp",
            f"--output_dir={root / 'fsdp'}",
        ],
    )
    step_dir = root / "fsdp" / C.CHECKPOINTS_DIR / "000002"
    resumed = run_distributed(
        train_rank,
        2,
        [
            "--resume=true",
            f"--config_path={step_dir}",
            "--steps=4",
            "--parallelism.dp_shard=null",
            "--checkpoint_format=safetensors",
            f"--output_dir={root / 'resumed'}",
        ],
    )
    base = root / "single" / C.CHECKPOINTS_DIR / "000004" / C.PRETRAINED_MODEL_DIR
    lora = run_distributed(
        train_rank,
        2,
        [
            *_flags(root, steps=2),
            f"--policy.path={base}",
            "--peft.r=4",
            '--peft.target_modules=["linear1","conv2"]',
            "--batch_size=4",
            "--parallelism.dp_shard=2",
            f"--output_dir={root / 'lora'}",
        ],
    )
    return {
        "root": root,
        "base": base,
        "lora": lora,
        "step_dir": step_dir,
        "single": single,
        "ddp": ddp,
        "fsdp": fsdp,
        "resumed": resumed,
    }


def test_ddp_two_processes_match_one_process_with_a_camera(runs) -> None:
    root = runs["root"]
    single, ddp = losses(root / "single"), losses(root / "ddp")
    assert single.keys() == ddp.keys() == {1, 2, 3, 4}
    for step in single:
        assert abs(single[step] - ddp[step]) < 1e-5, (step, single[step], ddp[step])
    assert len(set(single.values())) == 4  # the camera policy trains: every step differs


def test_backbone_lr_group_survives_every_topology(runs) -> None:
    n_backbone = runs["single"]["n_backbone"]
    assert n_backbone == 20  # resnet18: 20 convolution weights (its batch norm has none)
    for rank in [runs["single"], *runs["ddp"], *runs["fsdp"], *runs["resumed"]]:
        (_, lr_rest), (n_group, lr_group) = rank["groups"]
        assert (n_group, lr_group, lr_rest) == (n_backbone, LR_BACKBONE, 1e-3)


def test_lora_on_backbone_convolutions_under_fsdp2(runs) -> None:
    """LoRA on the backbone's conv2 layers trains in the backbone's group at its learning rate;
    the base weights and the frozen batch norms do not move."""
    (_, lr_rest), (n_group, lr_group) = runs["lora"][0]["groups"]
    assert (n_group, lr_group, lr_rest) == (2 * 8, LR_BACKBONE, 1e-3)  # lora_A/B of 8 blocks
    final = runs["lora"][0]["final"]["model"]
    base = load_file(runs["base"] / "model.safetensors")
    prefix = "base_model.model."
    moved = [k for k in final if "lora_B" in k and ".backbone." in k and final[k].abs().sum() > 0]
    assert len(moved) == 8
    for key, value in base.items():
        name = prefix + key.replace(".conv2.", ".conv2.base_layer.").replace(
            ".linear1.", ".linear1.base_layer."
        )
        assert torch.equal(final[name], value), key


def test_fsdp2_shards_the_backbone(runs) -> None:
    assert runs["ddp"][0]["backbone_fraction"] == 1.0
    for rank in runs["fsdp"]:
        assert 0.45 < rank["backbone_fraction"] < 0.55, rank["backbone_fraction"]
    fsdp = losses(runs["root"] / "fsdp")
    single = losses(runs["root"] / "single")
    for step in (1, 2):
        assert abs(fsdp[step] - single[step]) < 1e-5, (step, fsdp[step], single[step])


def test_fsdp2_checkpoint_resumes_on_ddp_bit_exact(runs) -> None:
    saved = runs["fsdp"][0]["final"]
    loaded = runs["resumed"][0]["loaded"]
    files = load_dcp_state_dict(runs["step_dir"] / C.PRETRAINED_MODEL_DIR / C.MODEL_DCP_DIR)
    buffers = [k for k in files if ".backbone." in k and k.endswith("running_var")]
    assert len(buffers) == 20  # every frozen batch norm's statistics were checkpointed
    for what, state in (("files", files), ("fsdp2 state", saved["model"])):
        assert state.keys() == loaded["model"].keys(), what
        for key, value in state.items():
            assert torch.equal(loaded["model"][key], value), f"{what}: {key}"
    assert saved["optim"].keys() == loaded["optim"].keys()
    for key, value in saved["optim"].items():
        assert torch.equal(loaded["optim"][key], value), key
    # And it continues where the uninterrupted run would be.
    ddp, resumed = losses(runs["root"] / "ddp"), losses(runs["root"] / "resumed")
    for step in (3, 4):
        assert abs(resumed[step] - ddp[step]) < 1e-5, (step, resumed[step], ddp[step])
