"""The tiny ACT and the tiny Diffusion Policy learn the synthetic reaching task."""

from __future__ import annotations

import pytest
from tiny import losses, run_train, tiny_act_flags, tiny_diffusion_flags


def test_tiny_act_learns_synthetic_task(dataset_root, tmp_path):
    run_train(
        [
            *tiny_act_flags(
                **{
                    "dataset.root": dataset_root,
                    "batch_size": 16,
                    "steps": 150,
                    "save_freq": 0,
                    "log_freq": 10,
                }
            ),
            f"--output_dir={tmp_path}",
        ]
    )
    curve = losses(tmp_path)
    assert curve[150] < 0.25 * curve[10], curve


@pytest.mark.slow
def test_tiny_act_learns_the_task_from_pixels_alone(tmp_path):
    """No observation.environment_state: the goal is only visible in the camera (AV1 video);
    the ResNet backbone starts from random weights."""
    from lerobot_pipe.datasets import write_synthetic_dataset

    root = write_synthetic_dataset(
        tmp_path / "ds",
        num_episodes=20,
        episode_length=50,
        cameras=("top",),
        image_size=32,
        pixels_only=True,
    )
    run_train(
        [
            *tiny_act_flags(
                **{
                    "dataset.root": root,
                    "batch_size": 16,
                    "steps": 100,
                    "save_freq": 0,
                    "log_freq": 10,
                    "policy.pretrained_backbone_weights": "null",
                    "policy.optimizer_lr_backbone": 1e-3,
                    "policy.use_vae": "false",
                    "policy.dropout": 0.0,
                }
            ),
            f"--output_dir={tmp_path / 'out'}",
        ]
    )
    curve = losses(tmp_path / "out")
    assert curve[100] < 0.3 * curve[10], curve


@pytest.mark.slow
def test_tiny_diffusion_learns_the_camera_task(diffusion_camera_root, tmp_path):
    """The denoising loss of the tiny Diffusion Policy (random-init resnet18 on the 48x48
    camera, random crops) falls well below its start."""
    run_train(
        [
            *tiny_diffusion_flags(
                **{
                    "dataset.root": diffusion_camera_root,
                    "batch_size": 16,
                    "steps": 60,
                    "save_freq": 0,
                    "log_freq": 10,
                    "policy.crop_shape": "[40,40]",
                    "policy.optimizer_lr": 3e-3,
                }
            ),
            f"--output_dir={tmp_path}",
        ]
    )
    curve = losses(tmp_path)
    # Measured: 1.05 -> 0.36-0.53 (window means of random timesteps and noise; the trajectory
    # differs with the worker's history: 0.53 after CI's earlier tests, 0.40 alone).
    assert curve[60] < 0.6 * curve[10], curve
