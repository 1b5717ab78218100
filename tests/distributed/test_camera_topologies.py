"""ACT on a real camera dataset (AV1 video decoded by the loader) across topologies: fp16 DDP on
2 processes with both checkpoint formats, resumed resharded onto HSDP 2x2 on 4 processes."""

from __future__ import annotations

import json
import math

import pytest
from launch import run_distributed
from tiny import losses, run_train, tiny_act_flags

from lerobot_pipe.datasets import write_synthetic_dataset

pytestmark = pytest.mark.slow


def test_fp16_ddp_camera_run_resumes_resharded_on_hsdp(tmp_path):
    root = write_synthetic_dataset(
        tmp_path / "ds", num_episodes=4, episode_length=20, cameras=("top",), image_size=32
    )
    out = tmp_path / "out"
    flags = tiny_act_flags(
        **{
            "dataset.root": root,
            "output_dir": out,
            "batch_size": 2,
            "save_freq": 2,
            "policy.pretrained_backbone_weights": "null",
            "accelerator.mixed_precision": "fp16",
            "checkpoint_format": "safetensors_dcp",
        }
    )
    run_distributed(run_train, 2, [*flags, "--steps=2"])
    step2 = out / "checkpoints/000002"
    assert (step2 / "training_state/scaler_state.json").is_file()  # fp16's loss scale
    assert (step2 / "pretrained_model/model.safetensors").is_file()
    assert (step2 / "pretrained_model/pytorch_model_fsdp_0/.metadata").is_file()

    run_distributed(
        run_train,
        4,
        [
            *flags,
            "--steps=4",
            "--resume=true",
            "--parallelism.dp_replicate=2",
            "--parallelism.dp_shard=2",
        ],
    )
    info = json.loads((out / "checkpoints/000004/training_state/training_step.json").read_text())
    assert info["parallelism"]["mode"] == "hsdp" and info["world_size"] == 4
    curve = losses(out)
    assert sorted(curve) == [1, 2, 3, 4] and all(math.isfinite(v) for v in curve.values())
