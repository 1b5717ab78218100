"""The tiny ACT learns the synthetic reaching task."""

from __future__ import annotations

from tiny import losses, run_train, tiny_act_flags


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
