"""--trackio.enable=true logs the reduced metrics offline (SQLite under TRACKIO_DIR)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from tiny import tiny_act_flags

pytest.importorskip("trackio")


@pytest.mark.slow
def test_trackio_logs_metrics_offline(dataset_root, tmp_path):
    # trackio reads TRACKIO_DIR at import: run lerobot-train as its own process.
    flags = tiny_act_flags(
        **{"dataset.root": dataset_root, "steps": 6, "log_freq": 3, "save_freq": 0}
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lerobot_pipe.scripts.train",
            *flags,
            "--trackio.enable=true",
            "--dataset.eval_split=0.1",
            "--eval_steps=6",
            "--trackio.project=lerobot-test",
            "--job_name=trk",
            f"--output_dir={tmp_path / 'out'}",
        ],
        env={**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    db = sqlite3.connect(tmp_path / "trackio/lerobot-test.db")
    rows = db.execute("select step, metrics from metrics order by step").fetchall()
    train = [(step, json.loads(m)) for step, m in rows if "loss" in json.loads(m)]
    assert [step for step, _ in train] == [3, 6]
    assert {"loss", "lr", "samples_per_s"} <= set(train[-1][1])
    # The held-out loss (--eval_steps) under eval/, at its step.
    (held_out,) = [(step, json.loads(m)) for step, m in rows if "eval/eval_loss" in json.loads(m)]
    assert held_out[0] == 6
    (record,) = [
        r for r in map(json.loads, (tmp_path / "out/metrics.jsonl").open()) if "eval_loss" in r
    ]
    assert held_out[1]["eval/eval_loss"] == pytest.approx(record["eval_loss"])
    config = json.loads(db.execute("select config from configs").fetchone()[0])
    assert config["steps"] == 6
