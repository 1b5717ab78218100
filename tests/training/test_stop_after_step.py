"""--stop_after_step (the pipeline's training segments): a launch that stops at a checkpoint and
a launch that resumes from it train exactly what one unbroken launch does, the learning-rate
schedule following --steps; the stop is not written into the checkpoint's train_config.json."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from tiny import losses, run_train, tiny_act_flags


def _lrs(output_dir) -> dict[int, float]:
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return {rec["step"]: rec["lr"] for rec in map(json.loads, lines) if "lr" in rec}


def test_two_segments_train_what_one_launch_does(dataset_root, tmp_path):
    # save_freq 4 does not divide the stop at 6: the stop saves a checkpoint there anyway.
    common = tiny_act_flags(**{"dataset.root": dataset_root, "batch_size": 8, "save_freq": 4})
    full = run_train([*common, f"--output_dir={tmp_path / 'full'}", "--steps=12"])
    out = tmp_path / "segments"
    first = run_train([*common, f"--output_dir={out}", "--steps=12", "--stop_after_step=6"])
    assert first.endswith("000006")
    config = json.loads((out / "checkpoints/000006/pretrained_model/train_config.json").read_text())
    assert config["steps"] == 12 and "stop_after_step" not in config
    # The same flags again: nothing to train past the stop.
    again = run_train(
        [*common, f"--output_dir={out}", "--steps=12", "--stop_after_step=6", "--resume=true"]
    )
    assert again.endswith("000006")
    second = run_train([*common, f"--output_dir={out}", "--steps=12", "--resume=true"])
    assert second.endswith("000012") and full.endswith("000012")
    for rel in ("pretrained_model/model.safetensors", "training_state/optimizer_state.safetensors"):
        a, b = load_file(f"{full}/{rel}"), load_file(f"{second}/{rel}")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), rel
    assert losses(tmp_path / "full") == losses(out)
    # The schedule over 12 steps in both (a 6-step run would have decayed to its end by step 6).
    assert _lrs(tmp_path / "full") == _lrs(out)
