"""Pins (lerobot_pipe.checkpoint.pins): retention (--checkpoint_keep_last) keeps a pinned
checkpoint (the pipeline's best one, one being evaluated or published) whatever its age, as it
keeps the one `last` points to; a real training run with retention honours them."""

from __future__ import annotations

import json

import pytest

from lerobot_pipe.checkpoint.layout import list_complete_checkpoints, prune_checkpoints
from lerobot_pipe.checkpoint.pins import move_pin, pin, pinned, pinned_steps, unpin


def _checkpoints(root, steps):
    for step in steps:
        state = root / "checkpoints" / f"{step:06d}" / "training_state"
        state.mkdir(parents=True)
        (state / "training_step.json").write_text(json.dumps({"step": step}))


def _names(root):
    return [p.name for p in list_complete_checkpoints(root)]


def test_retention_keeps_pinned_checkpoints(tmp_path):
    _checkpoints(tmp_path, range(1, 7))
    (tmp_path / "checkpoints" / "last").symlink_to("000006")
    pin(tmp_path, "000002", "best")
    with pinned(tmp_path, "000003", "evaluate"):
        pin(tmp_path, "000004", "publish")
        removed = prune_checkpoints(tmp_path, 1)
        assert [p.name for p in removed] == ["000001", "000005"]
        assert _names(tmp_path) == ["000002", "000003", "000004", "000006"]
    assert pinned_steps(tmp_path) == {"000002": {"best"}, "000004": {"publish"}}
    unpin(tmp_path, "000004", "publish")
    assert [p.name for p in prune_checkpoints(tmp_path, 1)] == ["000003", "000004"]
    assert _names(tmp_path) == ["000002", "000006"]


def test_move_pin_keeps_one_best(tmp_path):
    move_pin(tmp_path, "best", ["000020"])
    pin(tmp_path, "000020", "publish")
    move_pin(tmp_path, "best", ["000040"])
    assert pinned_steps(tmp_path) == {"000020": {"publish"}, "000040": {"best"}}
    record = json.loads((tmp_path / "pins" / "000040.best").read_text())
    assert record["step"] == "000040" and record["reason"] == "best" and record["pid"] > 0


@pytest.mark.parametrize(("step", "reason"), [("000020", "favourite"), ("last", "best")])
def test_bad_pins_are_refused(tmp_path, step, reason):
    with pytest.raises(ValueError, match="pin"):
        pin(tmp_path, step, reason)


def test_training_with_retention_keeps_the_pinned_checkpoint(tmp_path):
    """lerobot-train (its library path) with --checkpoint_keep_last=1 resumed to more steps:
    the best pin on step 1 keeps it; the unpinned step 2 goes."""
    from tiny import run_train, tiny_act_flags

    from lerobot_pipe.datasets import write_synthetic_dataset

    dataset = write_synthetic_dataset(tmp_path / "ds", num_episodes=2, episode_length=10)
    out = tmp_path / "train"
    flags = [f"--output_dir={out}", "--checkpoint_keep_last=1"]
    run_train([*tiny_act_flags(**{"dataset.root": dataset, "steps": 2, "save_freq": 1}), *flags])
    assert _names(out) == ["000002"]
    pin(out, "000002", "best")
    more = tiny_act_flags(**{"dataset.root": dataset, "steps": 4, "save_freq": 1})
    run_train(["--resume=true", *more, *flags])
    assert _names(out) == ["000002", "000004"]
