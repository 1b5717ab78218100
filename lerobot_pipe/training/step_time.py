"""Where a loop step's time goes, with LeRobot's names (its main branch, after 0.6.1, PR #4344).

Per loop step, on each rank:

- ``dataloading_s``: waiting for the prefetcher's next batch (the batches of one optimizer update
  are fetched at its first micro-batch); on CUDA this includes the prefetcher's asynchronous
  copy of the batch to the device.
- ``preprocessing_s``: the processor pipeline (normalization, ...) and the copy to the device.
- ``update_s``: the loss normalizers, forward, backward, gradient averaging and clipping, the
  optimizer and scheduler step.
- ``step_s``: the whole step, timed on its own (the three together; saving a checkpoint and
  logging are outside it, as in LeRobot).

Each is averaged over the steps since the last logged step, then reduced across ranks by
**max** (the slowest rank gates every step), and ``samples_per_s`` = batch size x data-parallel
world size / ``step_s``.

Timing is host-side (``time.perf_counter``), with no device synchronization inside the window:
on CUDA kernels run asynchronously, so GPU work not yet finished is charged to the phase where
the host next waits for the device (usually ``update_s``; the split of a window is then
approximate). The device is synchronized once per logged step, at the end of its update, so
the window's ``step_s`` (and ``samples_per_s``) is its true average. On the CPU every phase is
exact. ``dataloading_s`` / ``step_s`` is the share of time spent waiting for data: when it is
large, raise ``--num_workers`` (or decode less: smaller frames, fewer cameras).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

PHASES = ("dataloading_s", "preprocessing_s", "update_s")
KEYS = (*PHASES, "step_s")


class StepTimer:
    """``start()`` at the beginning of a step, ``lap(phase)`` at the end of each phase (the time
    since the previous lap goes to ``phase``), ``stop(sync=...)`` at the end of the step (its
    last stretch goes to ``update_s``); :meth:`reduce` at logged steps (collective)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sums = dict.fromkeys(KEYS, 0.0)
        self._steps = 0
        self._step_start = self._last = 0.0

    def start(self) -> None:
        self._step_start = self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self._sums[phase] += now - self._last
        self._last = now

    def stop(self, sync: bool = False) -> None:
        """End the step; ``sync`` (logged steps only) waits for the device's queued work."""
        if sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.lap("update_s")
        self._sums["step_s"] += self._last - self._step_start
        self._steps += 1

    def reduce(self) -> dict[str, float]:
        """The window's per-step averages, each the max over ranks (collective on every rank),
        and a new window."""
        steps = max(self._steps, 1)
        values = torch.tensor(
            [self._sums[k] / steps for k in KEYS], dtype=torch.float64, device=self.device
        )
        if dist.is_initialized():
            dist.all_reduce(values, op=dist.ReduceOp.MAX)
        self._sums = dict.fromkeys(KEYS, 0.0)
        self._steps = 0
        return dict(zip(KEYS, values.tolist(), strict=True))
