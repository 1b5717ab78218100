"""The progress channel from trainer to train job: events written by every rank, followed from
where a new attempt starts, drawn by the one renderer; on an 80-column terminal the line keeps
its ETA."""

from __future__ import annotations

import io
import json
import logging

from lerobot_pipe.pipeline.train_job import Terminal
from lerobot_pipe.training.progress import (
    EventChannel,
    EventFollower,
    ProgressReporter,
    events_path,
    render_progress,
)

EVENT = {
    "event": "progress",
    "step": 40,
    "total": 60,
    "loss": 0.12345,
    "samples_per_s": 12.34,
    "eta_s": 12.4,
    "saved": None,
}


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_render_progress():
    assert render_progress(EVENT) == "step 40/60 (66%) loss 0.1235 12.3 samples/s ETA 0:00:12"
    saved = {**EVENT, "loss": None, "eta_s": None, "saved": "out/checkpoints/000040"}
    assert render_progress(saved) == (
        "step 40/60 (66%) loss - 12.3 samples/s ETA ?; saved out/checkpoints/000040"
    )
    # The share of the step time spent waiting for data (dataloading_s / step_s).
    waiting = {**saved, "data_wait": 0.354}
    assert render_progress(waiting) == (
        "step 40/60 (66%) loss - 12.3 samples/s ETA ? data wait 35%; saved out/checkpoints/000040"
    )


def test_channel_carries_progress_and_every_ranks_warnings(tmp_path):
    old = EventChannel(tmp_path, rank=0)
    old.emit_event({**EVENT, "step": 1})  # an earlier attempt's
    old.close()
    follower = EventFollower(events_path(tmp_path))  # a new attempt starts at the end
    channels = [EventChannel(tmp_path, rank) for rank in (0, 1)]
    logger = logging.getLogger("lerobot_pipe.test_progress")
    logger.propagate = False
    try:
        logger.addHandler(channels[1])
        logger.info("not shown")  # below WARNING
        logger.warning("disk %s is slow", "/data")
        reporter = ProgressReporter(True, 0, 60, 8, channel=channels[0], stream=io.StringIO())
        reporter.set_loss(0.5, data_wait=0.25)
        import torch

        reporter.update(60, torch.tensor([1.5, 3.0]))  # the last step always reports
    finally:
        logger.removeHandler(channels[1])
        for channel in channels:
            channel.close()
    events = follower.events()
    assert [e["event"] for e in events] == ["log", "progress"]
    assert events[0]["rank"] == 1 and events[0]["message"] == "disk /data is slow"
    assert events[1]["step"] == 60 and events[1]["loss"] == 0.5
    assert events[1]["data_wait"] == 0.25
    assert follower.events() == []
    lines = events_path(tmp_path).read_text().splitlines()
    assert all(json.loads(line) for line in lines) and len(lines) == 3


def test_the_eta_stays_on_an_80_column_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    stream = _Tty()
    terminal = Terminal(stream)
    terminal.show({**EVENT, "step": 1000, "total": 100000, "samples_per_s": 1234.5, "eta_s": 1e5})
    drawn = stream.getvalue().split("\r\x1b[K")[-1]
    assert len(drawn) <= 79 and drawn.endswith("ETA 1 day, 3:46:40"), drawn
    # The data-wait share comes after the ETA: a narrow terminal cuts it, not the ETA.
    terminal.show({**EVENT, "step": 1000, "total": 100000, "eta_s": 1e5, "data_wait": 0.5})
    drawn = stream.getvalue().split("\r\x1b[K")[-1]
    assert len(drawn) <= 79 and "ETA 1 day, 3:46:40" in drawn, drawn
    monkeypatch.setenv("COLUMNS", "200")
    terminal.show(EVENT)
    drawn = stream.getvalue().split("\r\x1b[K")[-1]
    assert drawn.startswith("train: |#############       | step 40/60"), drawn


def test_warnings_and_errors_are_lines(monkeypatch):
    stream = io.StringIO()
    terminal = Terminal(stream)
    terminal.show({"event": "log", "level": "ERROR", "rank": 1, "message": "--steps=0: bad"})
    assert stream.getvalue() == "train: [rank1] ERROR --steps=0: bad [config: train.steps]\n"
