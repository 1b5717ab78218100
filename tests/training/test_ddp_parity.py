"""DDP on 2 real gloo processes vs one process with the same global batch (deterministic)."""

from __future__ import annotations

from launch import run_distributed
from tiny import DETERMINISTIC, losses, run_train, tiny_act_flags


def test_ddp_two_processes_match_single_process(dataset_root, tmp_path):
    flags = tiny_act_flags(
        **DETERMINISTIC, **{"dataset.root": dataset_root, "steps": 6, "save_freq": 0}
    )
    run_train([*flags, "--batch_size=8", f"--output_dir={tmp_path / 'single'}"])
    run_distributed(run_train, 2, [*flags, "--batch_size=4", f"--output_dir={tmp_path / 'ddp'}"])
    single, ddp = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert single.keys() == ddp.keys() == set(range(1, 7))
    for step in single:
        assert abs(single[step] - ddp[step]) < 1e-5, (step, single[step], ddp[step])
    assert single[6] < single[1]


def test_gradient_accumulation_matches_twice_the_batch(dataset_root, tmp_path):
    base = {**DETERMINISTIC, "dataset.root": dataset_root, "save_freq": 0}
    run_train([*tiny_act_flags(**base, batch_size=8, steps=4), f"--output_dir={tmp_path / 'big'}"])
    run_train(
        [
            *tiny_act_flags(**base, batch_size=4, steps=8, log_freq=2),
            "--accelerator.gradient_accumulation.steps=2",
            f"--output_dir={tmp_path / 'accum'}",
        ]
    )
    big, accum = losses(tmp_path / "big"), losses(tmp_path / "accum")
    # The accumulating run logs the mean of its two micro-batches = the big batch's loss.
    for step in range(1, 5):
        assert abs(big[step] - accum[2 * step]) < 1e-5, (step, big[step], accum[2 * step])
