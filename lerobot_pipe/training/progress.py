"""What a user watching a training run sees: step, loss, throughput and time left.

On a terminal, a tqdm bar. Anywhere else (a log file, the pipeline's launcher) a line from the
``lerobot_pipe.progress`` logger every PROGRESS_INTERVAL_S seconds, at every saved checkpoint and
at the last step; the pipeline's launcher shows those lines on the terminal while the whole log
goes to train.log.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TextIO

import torch

PROGRESS_LOGGER = "lerobot_pipe.progress"
PROGRESS_INTERVAL_S = 5.0

log = logging.getLogger(PROGRESS_LOGGER)


def format_eta(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


class Progress:
    """Call :meth:`update` after every loop step (with the loss sum and count since the last
    logged step, and the checkpoint it saved, if any) and :meth:`set_loss` with the loss of every
    logged step (the mean over all ranks). Between logged steps a line shows the main process's
    own running mean."""

    def __init__(
        self,
        enabled: bool,
        start_step: int,
        total_steps: int,
        samples_per_step: int,
        stream: TextIO | None = None,
    ) -> None:
        stream = stream or sys.stderr
        self.enabled = enabled
        self.start_step = start_step
        self.total = total_steps
        self.samples_per_step = samples_per_step
        self.loss: float | None = None
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

    def set_loss(self, loss: float) -> None:
        self.loss = loss
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def update(self, step: int, running: torch.Tensor, saved: Path | None = None) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            return
        now = time.monotonic()
        if now - self._last_time >= PROGRESS_INTERVAL_S or step == self.total or saved:
            loss_sum, count = running.tolist()  # a device sync, once a line
            self._log_line(step, now, loss_sum / count if count else self.loss, saved)

    def _log_line(self, step: int, now: float, loss: float | None, saved: Path | None) -> None:
        window = now - self._last_time
        samples_per_s = (step - self._last_step) * self.samples_per_step / window if window else 0
        done = step - self.start_step
        elapsed = now - self._started
        eta = format_eta((self.total - step) * elapsed / done) if done else "?"
        log.info(
            "step %d/%d (%d%%) loss %s %.1f samples/s ETA %s%s",
            step,
            self.total,
            100 * step // self.total,
            f"{loss:.4f}" if loss is not None else "-",
            samples_per_s,
            eta,
            f"; saved {saved}" if saved else "",
        )
        self._last_time, self._last_step = now, step

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
