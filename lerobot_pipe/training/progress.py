"""What a user watching a training run sees: step, loss, throughput and time left, and the
structured channel that carries it from the trainer to the pipeline's train job.

The trainer (:class:`ProgressReporter`) shows a tqdm bar on a terminal; anywhere else (a log
file) it logs a line every PROGRESS_INTERVAL_S seconds, at every saved checkpoint and at the
last step. Each such update is also an event in ``<output_dir>/progress.jsonl``
(:class:`EventChannel`), one JSON object a line, with every rank's warnings and errors beside
them; the pipeline's train job follows that file (:class:`EventFollower`) and draws the same
line (:func:`render_progress`, the one renderer) on its terminal, while the whole log goes to
train.log. Nothing reads the log's text. Torch-free.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from lerobot_pipe import constants as C

if TYPE_CHECKING:
    import torch

    from lerobot_pipe.distributed.runtime import DistEnv

PROGRESS_LOGGER = "lerobot_pipe.progress"
PROGRESS_INTERVAL_S = 5.0

log = logging.getLogger(PROGRESS_LOGGER)


def format_eta(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def render_progress(event: dict[str, Any]) -> str:
    """The progress line of a ``progress`` event, e.g.
    ``step 40/60 (66%) loss 0.1234 eval_loss 0.2345 12.3 samples/s ETA 0:00:12 data wait 35%;
    saved <folder>`` (``eval_loss``: the latest held-out loss, once there is one).
    The data wait is the share of the step time spent waiting for batches (``dataloading_s`` /
    ``step_s`` of the last logged step, slowest rank): when it is large, more
    ``--num_workers`` help. Last before the saved folder, so a narrow terminal cuts it first."""
    step, total, loss = event["step"], event["total"], event.get("loss")
    eta, wait = event.get("eta_s"), event.get("data_wait")
    eval_loss = event.get("eval_loss")
    text = (
        f"step {step}/{total} ({100 * step // max(total, 1)}%) "
        f"loss {'-' if loss is None else f'{loss:.4f}'} "
        f"{'' if eval_loss is None else f'eval_loss {eval_loss:.4f} '}"
        f"{event['samples_per_s']:.1f} samples/s "
        f"ETA {'?' if eta is None else format_eta(eta)}"
    )
    if wait is not None:
        text += f" data wait {100 * wait:.0f}%"
    return text + (f"; saved {event['saved']}" if event.get("saved") else "")


def render_event(event: dict[str, Any]) -> str:
    """One line for any event: a progress line, or ``[rank<r>] LEVEL message``."""
    if event.get("event") == "progress":
        return render_progress(event)
    rank = event.get("rank", 0)
    return f"{f'[rank{rank}] ' if rank else ''}{event['level']} {event['message']}"


def events_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / C.PROGRESS_EVENTS


class EventChannel(logging.Handler):
    """Appends events to ``progress.jsonl``: :meth:`emit_event` for progress (main rank), and, as
    a logging handler on every rank, each warning and error record. One ``write`` per line on a
    file opened for appending, so lines of several ranks never interleave."""

    def __init__(self, output_dir: str | Path, rank: int) -> None:
        super().__init__(level=logging.WARNING)
        self.rank = rank
        self.path = events_path(output_dir)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit_event(self, event: dict[str, Any]) -> None:
        line = json.dumps({**event, "time": time.time()}) + "\n"
        os.write(self._fd, line.encode())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad log call must not break training
            message = str(record.msg)
        self.emit_event(
            {"event": "log", "level": record.levelname, "rank": self.rank, "message": message}
        )

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        super().close()


@contextlib.contextmanager
def event_channel(output_dir: Path, env: DistEnv) -> Iterator[EventChannel]:
    """Every rank's warnings and errors, and the main rank's progress, as events in
    progress.jsonl (what the pipeline's train job shows), for the whole run."""
    from lerobot_pipe.distributed.runtime import barrier  # torch: only a run opens the channel

    if env.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
    barrier()  # the folder exists before any rank opens the file
    channel = EventChannel(output_dir, env.rank)
    root = logging.getLogger()
    root.addHandler(channel)
    try:
        yield channel
    finally:
        root.removeHandler(channel)
        channel.close()


class EventFollower:
    """New events of a ``progress.jsonl`` that the trainer appends to (it may not exist yet);
    starts at the file's end, so a resumed run's train job shows only its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = path.stat().st_size if path.exists() else 0
        self._partial = b""

    def events(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        out = []
        for line in complete:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # not ours: skipped, never fatal
                continue
        return out


class ProgressReporter:
    """Call :meth:`update` after every loop step (with the loss sum and count since the last
    logged step, and the checkpoint it saved, if any) and :meth:`set_loss` with the loss of every
    logged step (the mean over all ranks) and its data-wait share. Between logged steps a line
    shows the main process's own running mean."""

    def __init__(
        self,
        enabled: bool,
        start_step: int,
        total_steps: int,
        samples_per_step: int,
        channel: EventChannel | None = None,
        stream: TextIO | None = None,
    ) -> None:
        stream = stream or sys.stderr
        self.enabled = enabled
        self.start_step = start_step
        self.total = total_steps
        self.samples_per_step = samples_per_step
        self.channel = channel
        self.loss: float | None = None
        self.data_wait: float | None = None
        self.eval_loss: float | None = None
        self.bar = None
        if enabled and stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_steps,
                initial=start_step,
                desc="train",
                unit="step",
                mininterval=1.0,
                file=stream,
                dynamic_ncols=True,
            )
        now = time.monotonic()
        self._started = now
        self._last_time, self._last_step = now, start_step

    def set_loss(self, loss: float, data_wait: float | None = None) -> None:
        """The logged step's loss and share of step time waiting for data (0-1)."""
        self.loss = loss
        self.data_wait = data_wait
        if self.bar is not None:
            postfix = {"loss": f"{loss:.4f}"}
            if self.eval_loss is not None:
                postfix["eval_loss"] = f"{self.eval_loss:.4f}"
            if data_wait is not None:
                postfix["data_wait"] = f"{100 * data_wait:.0f}%"
            self.bar.set_postfix(postfix, refresh=False)

    def set_eval_loss(self, eval_loss: float) -> None:
        """The latest held-out loss (the same on every rank), shown from the next line on."""
        self.eval_loss = eval_loss

    def update(self, step: int, running: torch.Tensor, saved: Path | None = None) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
        now = time.monotonic()
        if now - self._last_time >= PROGRESS_INTERVAL_S or step == self.total or saved:
            loss_sum, count = running.tolist()  # a device sync, once a line
            self._emit(step, now, loss_sum / count if count else self.loss, saved)

    def _emit(self, step: int, now: float, loss: float | None, saved: Path | None) -> None:
        window = now - self._last_time
        done = step - self.start_step
        event = {
            "event": "progress",
            "step": step,
            "total": self.total,
            "loss": loss,
            "samples_per_s": (step - self._last_step) * self.samples_per_step / window
            if window
            else 0.0,
            "eta_s": (self.total - step) * (now - self._started) / done if done else None,
            "data_wait": self.data_wait,
            "eval_loss": self.eval_loss,
            "saved": str(saved) if saved else None,
        }
        if self.channel is not None:
            self.channel.emit_event(event)
        if self.bar is None:
            log.info("%s", render_progress(event))
        self._last_time, self._last_step = now, step

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
