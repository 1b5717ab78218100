"""Overlap batch loading with compute: worker threads prepare the next batches in order.

Decoding video is most of a camera batch's cost and the decoders release the GIL, so threads
share one process (no IPC, no copies of decoded frames between processes) and each keeps its own
open decoders. The batches a worker prepares are a pure function of the sampler's position, so
the number of batches handed out is the loader's only state: a resume from the sampler's state
is sample-exact, image augmentations included (they are drawn from each sample's stream
position), however many workers ran before or after.
"""

from __future__ import annotations

import copy
import logging
import os
import queue
import threading
from typing import Any

import numpy as np
import torch

from lerobot_pipe.constants import SAMPLE_KEY
from lerobot_pipe.datasets.lerobot_dataset import LeRobotDataset
from lerobot_pipe.datasets.sampler import GlobalBatchSampler
from lerobot_pipe.datasets.transforms import sample_keys
from lerobot_pipe.utils import faults

log = logging.getLogger(__name__)

_POLL_S = 0.1
Batch = dict[str, Any]  # tensors, and the "task" strings (a list)


def to_device(batch: Batch, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
    """The batch with its tensors on ``device``; other values (the ``task`` strings) as they
    are."""
    return {
        k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }


class BatchPrefetcher:
    """Yields ``dataset.get_batch(sampler.next_indices())`` step after step, each batch with its
    samples' keys (``sample_key``).

    With ``num_workers > 0``, that many threads prepare up to ``prefetch`` batches (default
    ``2 * num_workers``) ahead of the consumer, batch ``k`` from the sampler's position plus
    ``k`` global batches; ``next()`` still advances ``sampler`` itself, so
    ``sampler.state_dict()`` always counts the batches handed out (not those prepared ahead)
    and a resume stays sample-exact. ``num_workers == 0`` loads inline.

    ``device``: where the batch is used. On a CUDA device camera frames travel as uint8 in
    pinned memory, are copied asynchronously and become float32 (and are augmented) on the
    device; otherwise the workers finish them. Tensors of a batch are then on ``device``.
    ``raw_cameras``: hand camera frames out as uint8, as LeRobot's ``return_uint8`` loader does
    (the consumer converts them; not with image transforms, which work on float frames).
    """

    def __init__(
        self,
        dataset: LeRobotDataset,
        sampler: GlobalBatchSampler,
        num_workers: int,
        *,
        device: torch.device | str | None = None,
        prefetch: int | None = None,
        raw_cameras: bool = False,
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}.")
        if prefetch is not None and prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}.")
        self.dataset = dataset
        self.sampler = sampler
        self.num_workers = num_workers
        self.device = torch.device(device) if device is not None else None
        self._cameras = bool(getattr(dataset, "camera_keys", None))
        if raw_cameras and self._cameras and dataset.image_transforms.enabled:
            raise ValueError(
                "raw_cameras=True hands out frames before the image transforms, which are "
                "enabled: leave raw_cameras off (or --dataset.image_transforms.enable=false)."
            )
        # Frames are finished where they are used: on the GPU after a uint8 copy.
        on_gpu = self.device is not None and self.device.type == "cuda"
        self._raw = self._cameras and (raw_cameras or on_gpu)
        self._finish_on_device = self._cameras and on_gpu and not raw_cameras
        self._pin = self._raw and on_gpu
        self._prefetch = prefetch or 2 * num_workers
        self._read_ahead = (
            getattr(dataset, "read_ahead_rows", None) if hasattr(sampler, "rows_ahead") else None
        )
        self._start = sampler.samples_consumed
        self._handed = 0
        self._claimed = 0
        self._ready: dict[int, tuple[np.ndarray, np.ndarray, Batch] | BaseException] = {}
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._closed = False
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._work, args=(copy.deepcopy(sampler),), daemon=True)
            for _ in range(num_workers)
        ]
        for thread in self._threads:
            thread.start()

    def _load(self, sampler: GlobalBatchSampler) -> tuple[np.ndarray, np.ndarray, Batch]:
        """The batch at ``sampler``'s position (advancing it), keys, and indices. The batch
        carries each sample's key as ``sample_key`` (int64), for per-sample randomness."""
        faults.fault_point("data:load_batch")  # a slow loader, for the tests (a no-op unset)
        keys = sample_keys(sampler.seed, sampler.next_positions())
        if self._read_ahead is not None:  # a streaming dataset: the rows it will be asked for
            self._read_ahead(sampler.rows_ahead())
        indices = sampler.next_indices()
        if not self._cameras:
            batch = self.dataset.get_batch(indices)
        else:
            batch = self.dataset.get_batch(
                indices,
                sample_keys=keys,
                raw_cameras=self._raw,
                pin_memory=self._pin,
            )
        batch[SAMPLE_KEY] = torch.from_numpy(keys.view(np.int64))
        return indices, keys, batch

    def _work(self, sampler: GlobalBatchSampler) -> None:
        while True:
            with self._cond:
                while not self._stop.is_set() and self._claimed >= self._handed + self._prefetch:
                    self._cond.wait(_POLL_S)
                if self._stop.is_set():
                    return
                k = self._claimed
                self._claimed += 1
            sampler.samples_consumed = self._start + k * sampler.global_batch_size
            try:
                item: tuple[np.ndarray, np.ndarray, Batch] | BaseException = self._load(sampler)
            except Exception as exc:  # handed to the consumer, which re-raises it
                item = exc
            with self._cond:
                self._ready[k] = item
                self._cond.notify_all()
            if isinstance(item, BaseException):
                return

    def _finish(self, keys: np.ndarray, batch: Batch) -> Batch:
        if self.device is None:
            return batch
        non_blocking = self.device.type == "cuda"
        batch = to_device(batch, self.device, non_blocking=non_blocking)
        if self._finish_on_device:
            batch = self.dataset.prepare_cameras(batch, keys)
        return batch

    def next(self) -> Batch:
        """The next batch of this rank."""
        if not self._threads:
            indices, keys, batch = self._load(self.sampler)
            return self._finish(keys, batch)
        if self._closed:
            raise RuntimeError("BatchPrefetcher.next() called after close().")
        if self._error is None:
            with self._cond:
                while self._handed not in self._ready:
                    self._cond.wait(_POLL_S)
                item = self._ready.pop(self._handed)
                if isinstance(item, BaseException):
                    self._error = item
                    self._stop.set()
                else:
                    self._handed += 1
                self._cond.notify_all()
        if self._error is not None:
            raise RuntimeError("loading a batch in the prefetch thread failed") from self._error
        prepared, keys, batch = item
        if not np.array_equal(prepared, self.sampler.next_indices()):
            raise RuntimeError(
                "BatchPrefetcher's sampler was advanced outside next(); create a new "
                "BatchPrefetcher after moving the sampler."
            )
        return self._finish(keys, batch)

    def close(self) -> None:
        """Stop the worker threads; safe to call more than once."""
        self._closed = True
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> BatchPrefetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class BackgroundCalls:
    """One daemon thread running submitted calls in order (the read-ahead): a call's failure
    is logged, not raised (the reader that needs the bytes fetches them itself, with the
    cache's retries, and fails naming the file). Started on first use in each process."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._start_lock = threading.Lock()

    def submit(self, call) -> None:
        with self._start_lock:
            if self._thread is None or self._pid != os.getpid():
                self._queue = queue.SimpleQueue()
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, args=(self._queue,), daemon=True)
                self._thread.start()
            self._queue.put(call)

    @staticmethod
    def _run(calls: queue.SimpleQueue) -> None:
        while (call := calls.get()) is not None:
            try:
                call()
            except Exception as exc:
                log.warning("streaming read-ahead failed (the reader fetches the bytes): %s", exc)

    def drain(self, timeout_s: float) -> None:
        """Return once the calls submitted so far have run."""
        done = threading.Event()
        with self._start_lock:
            if self._thread is None or self._pid != os.getpid():
                return
            self._queue.put(done.set)
        if not done.wait(timeout_s):
            raise TimeoutError(f"the read-ahead did not finish within {timeout_s} s")

    def close(self) -> None:
        with self._start_lock:
            thread, self._thread = self._thread, None
            if thread is not None and self._pid == os.getpid():
                self._queue.put(None)
                thread.join(timeout=30)
