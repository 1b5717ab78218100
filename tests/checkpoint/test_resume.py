"""The one resume resolver: locate reads sizes only (no file's data), verify hashes and falls
back, returning a new point; and the plan a run trains with is never edited."""

from __future__ import annotations

import copy
import dataclasses
import logging

import pytest
from tiny import run_train, tiny_act_flags

from lerobot_pipe.checkpoint import resume
from lerobot_pipe.checkpoint.layout import CheckpointError
from lerobot_pipe.configs.parser import to_dict
from lerobot_pipe.training.preflight import make_plan
from lerobot_pipe.training.train import train


@pytest.fixture(scope="module")
def run(dataset_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("resolver") / "out"
    run_train(tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2, "save_freq": 1,
                                "output_dir": out}))  # fmt: skip
    return out


def _same_size_garbage(path):
    path.write_bytes(b"\0" * path.stat().st_size)


def test_locate_reads_no_data_and_verify_falls_back(run, tmp_path, caplog):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(run, out, symlinks=True)
    newest = out / "checkpoints/000002"
    _same_size_garbage(newest / "pretrained_model/model.safetensors")
    point = resume.locate(out, policy_type="act")
    assert point.step_dir == newest.resolve() and point.step == 2  # sizes match: not read
    with caplog.at_level(logging.WARNING):
        verified = resume.verify(point, out, policy_type="act")
    assert verified.step == 1 and not verified.explicit and point.step == 2  # a new value
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("checkpoint 000002 cannot be resumed (") and "SHA-256" in warning
    assert "resuming from 000001 instead: training rewrites 000002" in warning
    explicit = resume.locate(out, explicit=newest)
    assert explicit.explicit
    with pytest.raises(CheckpointError, match="model.safetensors: SHA-256 does not match"):
        resume.verify(explicit, out)


def test_locate_checks_sizes_and_the_policy_type(run, tmp_path, caplog):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(run, out, symlinks=True)
    with pytest.raises(CheckpointError, match="holds a 'act' policy but --policy.type is"):
        resume.locate(out, policy_type="diffusion")
    weights = out / "checkpoints/000002/pretrained_model/model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    with caplog.at_level(logging.WARNING):
        assert resume.locate(out).step == 1  # truncated: skipped before any process group
    # Said once, `last` (on the truncated one) included.
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "checkpoint 000002 cannot be resumed" in warning and "(truncated?)" in warning
    assert "resuming from 000001 instead" in warning
    for step_dir in (out / "checkpoints").glob("00000*"):
        (step_dir / "training_state/training_step.json").unlink()
    assert resume.locate(out) is None
    with pytest.raises(CheckpointError, match="holds no complete, undamaged checkpoint"):
        resume.require(out, None, "act")


def test_the_plan_is_frozen_and_training_leaves_it_as_it_was(dataset_root, tmp_path):
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2,
                              "output_dir": tmp_path / "out"})  # fmt: skip
    plan = make_plan(flags, 1, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.resume = None
    # Resolved once: the job name, the presets, the features filled in from the dataset.
    assert plan.cfg.job_name == "act" and plan.cfg.optimizer is not None
    assert plan.cfg.policy.input_features and plan.cfg.policy.output_features
    before = copy.deepcopy(to_dict(plan.cfg))
    train(plan)
    assert to_dict(plan.cfg) == before
    resumed = make_plan(["--resume=true", *flags, "--steps=3"], 1, {})
    assert resumed.start_step == 2 and resumed.resume.step_dir.name == "000002"
    assert resumed.resuming(resumed.resume) is resumed
