"""LeRobot's step-time split (dataloading_s, preprocessing_s, update_s, step_s; each the max over
ranks) in metrics.jsonl, the progress line and the report's throughput figure."""

from __future__ import annotations

import json
import runpy
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from launch import run_distributed
from tiny import run_train, tiny_act_flags

from lerobot_pipe.training.progress import render_progress
from lerobot_pipe.training.step_time import KEYS, StepTimer

DELAY = 0.15  # seconds rank 1's loader sleeps per batch


@pytest.fixture(scope="module")
def slow_rank_run(dataset_root, tmp_path_factory):
    """Two DDP ranks, 4 steps logged at 2 and 4; rank 1's loader (not the main rank's) sleeps
    DELAY per batch: a fault delay at the prefetcher's batch loading."""
    out = tmp_path_factory.mktemp("step-time") / "out"
    flags = tiny_act_flags(
        **{"dataset.root": dataset_root, "steps": 4, "log_freq": 2, "save_freq": 0}
    )
    run_distributed(
        run_train,
        2,
        [*flags, "--batch_size=4", f"--output_dir={out}"],
        env={"LEROBOT_PIPE_FAULT_DELAY": f"data:load_batch:rank1={DELAY}"},
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    events = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    return records, [e for e in events if e["event"] == "progress"]


def test_the_slowest_ranks_loader_sets_the_split(slow_rank_run):
    records, _ = slow_rank_run
    assert [r["step"] for r in records] == [2, 4]
    for r in records:
        assert set(KEYS) <= set(r)
        # Only rank 1 waits for its loader: the main rank's record holds rank 1's wait (max),
        # not the main rank's own (~0) nor the mean of the two.
        assert r["dataloading_s"] >= DELAY
        # step_s is each rank's whole step, max-reduced on its own: at least the slowest
        # phase, at most the phases' maxima together.
        assert r["step_s"] >= r["dataloading_s"]
        phases = r["dataloading_s"] + r["preprocessing_s"] + r["update_s"]
        assert r["step_s"] <= phases + 1e-6
        assert r["samples_per_s"] == pytest.approx(4 * 2 / r["step_s"])


def test_the_progress_line_shows_the_data_wait(slow_rank_run):
    records, events = slow_rank_run
    last = events[-1]
    assert last["step"] == 4
    assert last["data_wait"] == pytest.approx(records[-1]["dataloading_s"] / records[-1]["step_s"])
    assert f"data wait {100 * last['data_wait']:.0f}%" in render_progress(last)


def test_the_timer_splits_a_step_into_its_phases():
    timer = StepTimer(__import__("torch").device("cpu"))
    for _ in range(2):
        timer.start()
        time.sleep(0.03)
        timer.lap("dataloading_s")
        time.sleep(0.01)
        timer.lap("preprocessing_s")
        time.sleep(0.02)
        timer.stop(sync=True)
    times = timer.reduce()
    assert times["dataloading_s"] == pytest.approx(0.03, abs=0.015)
    assert times["preprocessing_s"] == pytest.approx(0.01, abs=0.015)
    assert times["update_s"] == pytest.approx(0.02, abs=0.015)
    phases = times["dataloading_s"] + times["preprocessing_s"] + times["update_s"]
    assert times["step_s"] == pytest.approx(phases, abs=1e-9)
    # A new window starts after each reduction.
    assert timer.reduce() == dict.fromkeys(KEYS, 0.0)


def test_the_report_plots_the_split(tmp_path, slow_rank_run):
    """workflow/scripts/plot_training.py as Snakemake runs it (its `snakemake` object)."""
    records, _ = slow_rank_run
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = SimpleNamespace(loss=str(tmp_path / "loss.svg"), throughput=str(tmp_path / "tp.svg"))
    snakemake = SimpleNamespace(
        params=SimpleNamespace(metrics=str(metrics), run="r"),
        output=out,
        log=[str(tmp_path / "plot.log")],
    )
    script = Path(__file__).parents[2] / "workflow/scripts/plot_training.py"
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text, to read it back
        runpy.run_path(str(script), init_globals={"snakemake": snakemake})
    svg = Path(out.throughput).read_text()
    for label in ("waiting for data (dataloading_s)", "preprocessing (preprocessing_s)"):
        assert label in svg
    assert "step (step_s)" in svg and "samples / s" in svg


def test_a_single_process_run_logs_the_split(dataset_root, tmp_path):
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2, "save_freq": 0})
    run_train([*flags, f"--output_dir={tmp_path / 'out'}"])
    lines = (tmp_path / "out/metrics.jsonl").read_text().splitlines()
    record = json.loads(lines[-1])
    assert set(KEYS) <= set(record) and record["samples"] == 2 * 8
    assert record["samples_per_s"] == pytest.approx(8 / record["step_s"])
