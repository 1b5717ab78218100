"""Kill anywhere: SIGKILL one rank of a real 2-process run at many points of the step and of the
checkpoint write, then rerun the same command. Nothing complete is lost or damaged, the rerun
resumes from the newest complete checkpoint, and the final weights equal an uninterrupted run's.

The fault hook (LEROBOT_PIPE_FAULT_POINT=<point>@<step>:rank<r>) kills at named points; see
lerobot_pipe/utils/faults.py. Every fault point in the package is killed at by a case here or
in test_kill_conversion.py: test_every_fault_point_is_killed_at reads them from the source, so a
new point without a case fails. Each test runs alone (no test depends on another having run)."""

from __future__ import annotations

import hashlib
import importlib.util
import queue
import re
import shutil
from pathlib import Path

import pytest
import torch
from launch import run_distributed
from safetensors.torch import load_file
from tiny import WITH_SCHEDULER, run_train, tiny_act_flags

import lerobot_pipe
from lerobot_pipe.checkpoint.layout import is_complete, list_complete_checkpoints

pytestmark = pytest.mark.slow

MODES = {
    "ddp": ["--checkpoint_format=safetensors"],
    "fsdp2": ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp"],
    # fp16 saves the loss scaler's state too (save:after_scaler).
    "ddp-fp16": ["--checkpoint_format=safetensors", "--accelerator.mixed_precision=fp16"],
}
# Points of the save at step 4 (and of the step itself); after "before_last_link" the step-4
# checkpoint is already complete.
AFTER_RENAME = {"save:before_last_link", "save:during_last_link", "save:end"}
CASES = [
    *[
        ("ddp", point, 0)
        for point in (
            "save:begin",
            "save:after_model_file",
            "save:after_processors",
            "save:after_pretrained",
            "save:after_optimizer",
            "save:after_param_groups",
            "save:after_rng",
            "save:after_scheduler",
            "save:before_training_step",
            "save:before_rename",
            "save:before_last_link",
            "save:during_last_link",
            "save:end",
            "train:after_backward",
            "train:after_optimizer_step",
        )
    ],
    *[
        ("ddp", point, 1)
        for point in (
            "save:begin",
            "save:after_optimizer",
            "train:after_backward",
            "data:load_batch",  # a rank killed while it loads a batch
        )
    ],
    *[
        ("fsdp2", point, 0)
        for point in (
            "save:after_model_dcp",
            "save:after_pretrained",
            "save:after_optimizer",
            "save:before_rename",
        )
    ],
    *[
        ("fsdp2", point, 1)
        for point in (
            "save:begin",
            "save:after_model_dcp",
            "save:after_optimizer",
            "train:after_backward",
        )
    ],
    ("ddp-fp16", "save:after_scaler", 0),
]
# With --checkpoint_async=true the save of step 4 runs in a background thread while the loop
# goes on to steps 5 and 6: each point the background path added (staging in the loop, the
# background's start, after a rank hashed its files, retention mid-delete) on DDP and on FSDP2,
# on both ranks, and the save's points where it is mid-DCP, written but not renamed, renamed but
# `last` not moved; on FSDP2 also right after the background assembled the full model from the
# staged shards (either rank).
ASYNC_CASES = [
    ("ddp", "save:staged", 1),
    ("fsdp2", "save:staged", 0),
    ("ddp", "save:persist_begin", 0),
    ("fsdp2", "save:persist_begin", 1),
    ("ddp", "save:after_hash", 0),
    ("fsdp2", "save:after_hash", 1),
    ("ddp", "save:during_prune", 0),
    ("fsdp2", "save:during_prune", 0),
    ("fsdp2", "save:after_model_dcp", 1),
    ("fsdp2", "save:after_model_gather", 0),
    ("fsdp2", "save:after_model_gather", 1),
    ("ddp", "save:before_rename", 0),
    ("fsdp2", "save:during_last_link", 0),
]
# Points of replacing a complete checkpoint of the same step (test_replacing_...): with the
# atomic exchange (renameat2), and without it (a file system that lacks it) moving the old aside.
REPLACE_POINTS = ["save:before_rename", "save:after_exchange", "save:during_replace"]


def _flags(dataset_root, mode, out):
    flags = tiny_act_flags(
        **{
            "dataset.root": dataset_root,
            "steps": 6,
            "save_freq": 2,
            "batch_size": 4,
            **WITH_SCHEDULER,
        }
    )
    return [*flags, *MODES[mode], f"--output_dir={out}"]


@pytest.fixture(scope="module")
def uninterrupted(dataset_root, tmp_path_factory):
    """mode -> the output folder of an uninterrupted run (tests copy it, never change it)."""
    runs = {}
    for mode in MODES:
        runs[mode] = tmp_path_factory.mktemp(mode) / "out"
        run_distributed(run_train, 2, _flags(dataset_root, mode, runs[mode]))
    return runs


@pytest.fixture(scope="module")
def reference(uninterrupted):
    """mode -> the final weights of an uninterrupted run."""
    return {
        mode: load_file(out / "checkpoints/000006/pretrained_model/model.safetensors")
        for mode, out in uninterrupted.items()
    }


def _digest(folder):
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(path.relative_to(folder).as_posix().encode() + path.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize(
    ("mode", "point", "rank"), CASES, ids=[f"{m}-{p}-rank{r}" for m, p, r in CASES]
)
def test_kill_and_rerun(reference, dataset_root, tmp_path, mode, point, rank):
    out = tmp_path / "out"
    argv = _flags(dataset_root, mode, out)
    with pytest.raises((RuntimeError, queue.Empty)):
        run_distributed(
            run_train,
            2,
            argv,
            env={"LEROBOT_PIPE_FAULT_POINT": f"{point}@4:rank{rank}"},
            timeout=90,
        )

    complete = {p.name: (_digest(p), p.stat().st_ino) for p in list_complete_checkpoints(out)}
    expected = {"000002", "000004"} if point in AFTER_RENAME else {"000002"}
    assert set(complete) == expected, (point, sorted(complete))

    run_distributed(run_train, 2, ["--resume=true", *argv])
    for name, (
        digest,
        inode,
    ) in complete.items():  # untouched: resumed from the newest, damaged none
        step = out / "checkpoints" / name
        assert step.stat().st_ino == inode and _digest(step) == digest, name
    final = load_file(out / "checkpoints/000006/pretrained_model/model.safetensors")
    assert final.keys() == reference[mode].keys()
    assert all(torch.equal(final[k], reference[mode][k]) for k in final), "final weights differ"
    assert not list((out / "checkpoints").glob(".*")), "temporaries left behind"


def run_train_without_exchange(argv):
    """run_train on a file system without renameat2's RENAME_EXCHANGE (NFS, some FUSE)."""
    from lerobot_pipe.checkpoint import layout

    layout._exchange_paths = lambda a, b: False
    return run_train(argv)


@pytest.mark.parametrize("point", REPLACE_POINTS)
def test_replacing_a_checkpoint_of_the_same_step_never_loses_it(
    uninterrupted, reference, dataset_root, tmp_path, point
):
    """Resuming from step 2 while step 4 exists saves step 4 again: the old one is swapped out
    atomically (or, without the exchange, moved aside and put back by the next start), so a kill
    on either side of the swap leaves one complete step 4."""
    out = tmp_path / "out"
    argv = _flags(dataset_root, "ddp", out)
    # The same command's uninterrupted run, copied instead of trained again.
    shutil.copytree(uninterrupted["ddp"], out, symlinks=True)
    resume_from_2 = ["--resume=true", f"--config_path={out / 'checkpoints/000002'}", *argv]
    trainer = run_train_without_exchange if point == "save:during_replace" else run_train
    with pytest.raises((RuntimeError, queue.Empty)):
        run_distributed(
            trainer,
            2,
            resume_from_2,
            env={"LEROBOT_PIPE_FAULT_POINT": f"{point}@4:rank0"},
            timeout=90,
        )
    complete = [p.name for p in list_complete_checkpoints(out)]
    if point == "save:during_replace":  # the old step 4 is aside, complete, until the next start
        assert complete == ["000002", "000006"]
        assert is_complete(out / "checkpoints/.tmp-old-000004")
    else:
        assert complete == ["000002", "000004", "000006"]
    run_distributed(run_train, 2, ["--resume=true", *argv, "--steps=8"])
    final = load_file(out / "checkpoints/000006/pretrained_model/model.safetensors")
    assert all(torch.equal(final[k], reference["ddp"][k]) for k in final)
    assert not list((out / "checkpoints").glob(".*"))
    assert [p.name for p in list_complete_checkpoints(out)] == [
        "000002",
        "000004",
        "000006",
        "000008",
    ]


@pytest.mark.parametrize(
    ("mode", "point", "rank"), ASYNC_CASES, ids=[f"{m}-{p}-rank{r}" for m, p, r in ASYNC_CASES]
)
def test_kill_during_a_background_save_and_rerun(
    reference, dataset_root, tmp_path, mode, point, rank
):
    """A trainer killed with a save in flight: that save is abandoned (no complete-looking
    checkpoint, the earlier ones intact), the next start removes what it left, the rerun ends
    as an uninterrupted run. At ``save:during_prune`` (--checkpoint_keep_last=1) step 4 is
    complete and step 2 half-deleted under a temporary name."""
    out = tmp_path / "out"
    prune = point == "save:during_prune"
    keep = ["--checkpoint_keep_last=1"] if prune else []
    argv = [*_flags(dataset_root, mode, out), "--checkpoint_async=true", *keep]
    with pytest.raises((RuntimeError, queue.Empty)):
        run_distributed(
            run_train,
            2,
            argv,
            env={"LEROBOT_PIPE_FAULT_POINT": f"{point}@4:rank{rank}"},
            timeout=90,
        )

    complete = {p.name: (_digest(p), p.stat().st_ino) for p in list_complete_checkpoints(out)}
    if prune:
        expected = {"000004"}
    else:
        expected = {"000002", "000004"} if point in AFTER_RENAME else {"000002"}
    assert set(complete) == expected, (point, sorted(complete))

    run_distributed(run_train, 2, ["--resume=true", *argv])
    for name, (digest, inode) in complete.items():
        step = out / "checkpoints" / name
        if step.exists() or not prune:  # retention may delete it once step 6 is complete
            assert step.stat().st_ino == inode and _digest(step) == digest, name
    final = load_file(out / "checkpoints/000006/pretrained_model/model.safetensors")
    assert final.keys() == reference[mode].keys()
    assert all(torch.equal(final[k], reference[mode][k]) for k in final), "final weights differ"
    assert not list((out / "checkpoints").glob(".*")), "temporaries left behind"
    kept = ["000006"] if prune else ["000002", "000004", "000006"]
    assert [p.name for p in list_complete_checkpoints(out)] == kept


def test_every_fault_point_is_killed_at():
    """Every fault_point("...") of the package, read from its source, has a kill case."""
    package = Path(lerobot_pipe.__file__).parent
    in_source = {
        name
        for path in package.rglob("*.py")
        for name in re.findall(r'fault_point\(\s*"([^"]+)"', path.read_text())
    }
    assert len(in_source) >= 20, sorted(in_source)
    spec = importlib.util.spec_from_file_location(
        "kill_conversion", Path(__file__).with_name("test_kill_conversion.py")
    )
    conversion = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conversion)
    covered = {point for _, point, _ in (*CASES, *ASYNC_CASES)}
    covered |= {*REPLACE_POINTS, *conversion.POINTS}
    assert in_source <= covered, f"fault points without a kill case: {sorted(in_source - covered)}"
