"""Asynchronous checkpoints (--checkpoint_async=true) against synchronous ones, on real 2-rank
runs: the same bytes, the same resumed run, never two saves at once, training that ends only
once its last save is durable; and retention (--checkpoint_keep_last)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

import pytest
import torch
from launch import run_distributed
from safetensors.torch import load_file, save_file
from tiny import WITH_SCHEDULER, run_train, tiny_act_flags

from lerobot_pipe.checkpoint.layout import (
    is_complete,
    list_complete_checkpoints,
    prune_checkpoints,
)
from lerobot_pipe.checkpoint.stateful import TrainState, train_states
from lerobot_pipe.checkpoint.writer import CheckpointWriter

pytestmark = pytest.mark.torch_range

MODES = {
    "ddp": ["--checkpoint_format=safetensors"],
    "fsdp2": ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp"],
}
# Sharded async saves assemble model.safetensors in the background from the staged shards
# (over the checkpoint writer's gloo group), not with the loop's full-state gather: every gathered
# format on FSDP2 (2 ranks) and HSDP (2 x 2 on 4 ranks). name -> (world size, flags).
SHARDED = {
    "fsdp2-safetensors": (2, ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors"]),
    "fsdp2-safetensors_dcp": (2, MODES["fsdp2"]),
    "hsdp-safetensors": (
        4,
        [
            "--parallelism.dp_replicate=2",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=safetensors",
        ],
    ),
    "hsdp-safetensors_dcp": (
        4,
        [
            "--parallelism.dp_replicate=2",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=safetensors_dcp",
        ],
    ),
}
TRAIN_CONFIG = "pretrained_model/train_config.json"
TRAINING_STEP = "training_state/training_step.json"


def _flags(dataset_root, out, **overrides):
    flags = tiny_act_flags(
        **{
            "dataset.root": dataset_root,
            "steps": 4,
            "save_freq": 2,
            "batch_size": 4,
            **WITH_SCHEDULER,
            **overrides,
        }
    )
    return [*flags, f"--output_dir={out}"]


def _contents(step_dir, ignore=("checkpoint_async",)):
    """Every file's bytes; train_config.json without the flags it records that differ on
    purpose (``ignore``), and the manifest without its entry."""
    files = {
        p.relative_to(step_dir).as_posix(): p.read_bytes()
        for p in sorted(step_dir.rglob("*"))
        if p.is_file()
    }
    config = json.loads(files.pop(TRAIN_CONFIG))
    for key in ignore:
        config.pop(key, None)
    info = json.loads(files.pop(TRAINING_STEP))
    info["files"].pop(TRAIN_CONFIG)
    return files, config, info


@pytest.mark.parametrize("mode", ["ddp", pytest.param("fsdp2", marks=pytest.mark.slow)])
def test_async_writes_the_same_bytes_and_resumes_the_same(dataset_root, tmp_path, mode):
    out = tmp_path / "out"  # both runs in the same place: DCP's metadata records the path
    argv = [*_flags(dataset_root, out), *MODES[mode]]
    run_distributed(run_train, 2, argv)
    shutil.move(out, tmp_path / "sync")
    run_distributed(run_train, 2, [*argv, "--checkpoint_async=true"])
    for step in ("000002", "000004"):
        sync, asynchronous = tmp_path / "sync/checkpoints" / step, out / "checkpoints" / step
        assert _contents(asynchronous) == _contents(sync), step
    info = json.loads((out / "checkpoints/000004" / TRAINING_STEP).read_text())
    on_disk = {
        p.relative_to(out / "checkpoints/000004").as_posix()
        for p in (out / "checkpoints/000004").rglob("*")
        if p.is_file()
    }
    assert set(info["files"]) == on_disk - {TRAINING_STEP}  # the assembled manifest is whole
    written = json.loads((out / "checkpoints/000004" / TRAIN_CONFIG).read_text())
    assert written["checkpoint_async"] is True
    default = json.loads((tmp_path / "sync/checkpoints/000004" / TRAIN_CONFIG).read_text())
    assert "checkpoint_async" not in default  # LeRobot 0.6.1 decodes it: not written at default
    if mode == "fsdp2":
        # Resumed from step 2 in the background mode, step 4 comes out as the uninterrupted
        # synchronous run's (it replaces the step-4 checkpoint of the same run).
        step2 = out / "checkpoints/000002"
        run_distributed(
            run_train,
            2,
            ["--resume=true", f"--config_path={step2}", *argv, "--checkpoint_async=true"],
        )
        ignore = ("checkpoint_async", "resume")
        resumed = _contents(out / "checkpoints/000004", ignore)
        assert resumed == _contents(tmp_path / "sync/checkpoints/000004", ignore)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode",
    # hsdp-safetensors_dcp gathers as hsdp-safetensors does, and also writes DCP: it alone on
    # the torch range's ends
    [
        pytest.param(m, marks=pytest.mark.one_torch) if m == "hsdp-safetensors" else m
        for m in SHARDED
        if m != "fsdp2-safetensors_dcp"
    ],
)
def test_sharded_async_gathers_the_same_bytes(dataset_root, tmp_path, mode):
    """(fsdp2-safetensors_dcp: the test above, which also resumes.)"""
    world, flags = SHARDED[mode]
    out = tmp_path / "out"
    argv = [*_flags(dataset_root, out, batch_size=8 // world), *flags]
    run_distributed(run_train, world, argv)
    shutil.move(out, tmp_path / "sync")
    run_distributed(run_train, world, [*argv, "--checkpoint_async=true"])
    for step in ("000002", "000004"):
        sync, asynchronous = tmp_path / "sync/checkpoints" / step, out / "checkpoints" / step
        assert (asynchronous / "pretrained_model/model.safetensors").is_file()
        assert _contents(asynchronous) == _contents(sync), step


class _SaveObserver(logging.Handler):
    """Looks at the checkpoint folder each time a save is staged (a log record of the loop)."""

    def __init__(self, ckpts):
        super().__init__()
        self.ckpts = ckpts
        self.seen: list[tuple[str, list[str], list[str]]] = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Checkpoint ") and "staged" in message:
            name = message.split()[1]
            temporaries = sorted(p.name for p in self.ckpts.glob(".tmp-*"))
            complete = [p.name for p in list_complete_checkpoints(self.ckpts.parent)]
            self.seen.append((name, temporaries, complete))


def _slow_saves(argv, out):
    handler = _SaveObserver(out / "checkpoints")
    logger = logging.getLogger("lerobot_pipe.checkpoint.writer")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    start = time.perf_counter()
    final = run_train(argv)
    elapsed = time.perf_counter() - start
    # Right when training returns, on every rank: the last save is complete and `last` is moved.
    durable = is_complete(out / "checkpoints/000004") and (
        os.readlink(out / "checkpoints/last") == "000004"
    )
    return {"final": final, "elapsed": elapsed, "seen": handler.seen, "durable": durable}


def test_a_slow_background_save_never_overlaps_the_next(dataset_root, tmp_path):
    out = tmp_path / "out"
    argv = [*_flags(dataset_root, out, save_freq=1), *MODES["ddp"], "--checkpoint_async=true"]
    delay = 0.8  # each background save sleeps this long just before its rename
    results = run_distributed(
        _slow_saves,
        2,
        argv,
        out,
        env={"LEROBOT_PIPE_FAULT_DELAY": f"save:before_rename:rank0={delay}"},
    )
    main = results[0]
    assert [name for name, _, _ in main["seen"]] == ["000001", "000002", "000003", "000004"]
    for i, (name, temporaries, complete) in enumerate(main["seen"]):
        # Staging a save found the previous one finished: only its own temporary folder exists.
        assert temporaries == [f".tmp-{name}"], (name, temporaries)
        assert complete == [f"{s:06d}" for s in range(1, i + 1)], (name, complete)
    assert all(r["durable"] for r in results), "training returned before its last save was durable"
    assert main["elapsed"] >= 4 * delay  # the loop waited for each slow save
    assert not list((out / "checkpoints").glob(".tmp-*"))


def test_keep_last_keeps_the_newest_complete_checkpoints(dataset_root, tmp_path):
    out = tmp_path / "out"
    run_train(_flags(dataset_root, out, save_freq=1, checkpoint_keep_last=2))
    ckpts = out / "checkpoints"
    assert [p.name for p in list_complete_checkpoints(out)] == ["000003", "000004"]
    assert os.readlink(ckpts / "last") == "000004"
    assert not list(ckpts.glob(".tmp-*"))
    config = json.loads((ckpts / "000004" / TRAIN_CONFIG).read_text())
    assert config["checkpoint_keep_last"] == 2 and "checkpoint_async" not in config
    # Resumed with the default (keep all): nothing more is deleted.
    run_train(["--resume=true", *_flags(dataset_root, out, steps=5, save_freq=1)])
    assert [p.name for p in list_complete_checkpoints(out)] == ["000003", "000004", "000005"]


def test_retention_never_deletes_what_last_points_to(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for step in range(1, 5):
        state = ckpts / f"{step:06d}" / "training_state"
        state.mkdir(parents=True)
        (state / "training_step.json").write_text(json.dumps({"step": step}))
    (ckpts / "last").symlink_to("000002")  # resumed from step 2 (explicit --config_path)
    assert prune_checkpoints(tmp_path, 0) == []
    removed = prune_checkpoints(tmp_path, 1)
    assert [p.name for p in removed] == ["000001", "000003"]
    assert [p.name for p in list_complete_checkpoints(tmp_path)] == ["000002", "000004"]
    assert sorted(p.name for p in ckpts.iterdir()) == ["000002", "000004", "last"]


class _LateBranch(torch.nn.Module):
    """Two layers; the second one joins the loss only from the second step on, so the optimizer
    holds no state for it at the first save (Adam keeps none for a parameter without a
    gradient yet)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 3)
        self.b = torch.nn.Linear(3, 3)

    def forward(self, x, step):
        return self.b(self.a(x)) if step > 1 else self.a(x)


def _save_late_branch_run(out, async_save):
    """Two saves of one writer, the optimizer's state growing in between: the async writer
    stages its CPU copies a second time (torch 2.11 / 2.12's stager did not survive that)."""
    torch.manual_seed(0)
    model = _LateBranch()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)

    def pretrained(directory, full_state):
        save_file(full_state, directory / "model.safetensors")

    state = TrainState.from_states(train_states(model, optimizer, pretrained))
    writer = CheckpointWriter(
        out,
        total_steps=2,
        checkpoint_format="safetensors",
        sharded=False,
        run_info={},
        async_save=async_save,
    )
    try:
        for step in (1, 2):
            model(torch.ones(2, 3), step).square().sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            state.progress.step = step
            writer.save(state)
    finally:
        writer.close()
    return writer


def test_async_saves_restage_when_the_state_grows(tmp_path):
    _save_late_branch_run(tmp_path / "sync", async_save=False)
    writer = _save_late_branch_run(tmp_path / "async", async_save=True)
    assert writer.staged_bytes > 0
    for step in ("000001", "000002"):
        sync = tmp_path / "sync/checkpoints" / step
        asynchronous = tmp_path / "async/checkpoints" / step
        assert is_complete(asynchronous), step
        files = {
            p.relative_to(asynchronous).as_posix(): p.read_bytes()
            for p in sorted(asynchronous.rglob("*"))
            if p.is_file()
        }
        assert files == {
            p.relative_to(sync).as_posix(): p.read_bytes()
            for p in sorted(sync.rglob("*"))
            if p.is_file()
        }, step
    step2 = load_file(
        tmp_path / "async/checkpoints/000002/training_state/optimizer_state.safetensors"
    )
    step1 = load_file(
        tmp_path / "async/checkpoints/000001/training_state/optimizer_state.safetensors"
    )
    assert len(step2) > len(step1)  # the second save holds the state the first one had not
