"""Overlap batch loading with compute by preparing the next batches in a background thread."""

from __future__ import annotations

import copy
import queue
import threading

import numpy as np
import torch

from lerobot_pipe.datasets.lerobot_dataset import LeRobotDataset
from lerobot_pipe.datasets.sampler import GlobalBatchSampler

_POLL_S = 0.1


class BatchPrefetcher:
    """Yields ``dataset.get_batch(sampler.next_indices())`` step after step.

    With ``num_workers > 0`` a background thread prepares up to ``2 * num_workers``
    batches ahead from a private copy of the sampler; ``next()`` still advances
    ``sampler`` itself, so ``sampler.state_dict()`` always counts the batches handed out
    (not those prepared ahead) and a resume stays sample-exact. ``num_workers == 0`` loads
    inline.
    """

    def __init__(
        self, dataset: LeRobotDataset, sampler: GlobalBatchSampler, num_workers: int
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}.")
        self.dataset = dataset
        self.sampler = sampler
        self.num_workers = num_workers
        self._stop = threading.Event()
        self._queue: queue.Queue[tuple[np.ndarray, dict[str, torch.Tensor]] | Exception]
        self._queue = queue.Queue(maxsize=2 * num_workers)
        self._error: Exception | None = None
        self._thread: threading.Thread | None = None
        if num_workers > 0:
            self._thread = threading.Thread(
                target=self._work, args=(copy.deepcopy(sampler),), daemon=True
            )
            self._thread.start()

    def _work(self, sampler: GlobalBatchSampler) -> None:
        try:
            while not self._stop.is_set():
                indices = sampler.next_indices()
                self._put((indices, self.dataset.get_batch(indices)))
        except Exception as exc:  # handed to the consumer, which re-raises it
            self._put(exc)

    def _put(self, item: tuple[np.ndarray, dict[str, torch.Tensor]] | Exception) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def next(self) -> dict[str, torch.Tensor]:
        """The next batch of this rank."""
        if self._thread is None:
            return self.dataset.get_batch(self.sampler.next_indices())
        if self._stop.is_set():
            raise RuntimeError("BatchPrefetcher.next() called after close().")
        if self._error is None:
            item = self._queue.get()
            if isinstance(item, Exception):
                self._error = item
        if self._error is not None:
            raise RuntimeError("loading a batch in the prefetch thread failed") from self._error
        prepared, batch = item
        if not np.array_equal(prepared, self.sampler.next_indices()):
            raise RuntimeError(
                "BatchPrefetcher's sampler was advanced outside next(); create a new "
                "BatchPrefetcher after moving the sampler."
            )
        return batch

    def close(self) -> None:
        """Stop the background thread; safe to call more than once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> BatchPrefetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
