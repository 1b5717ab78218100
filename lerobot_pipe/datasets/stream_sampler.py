"""The order a streaming dataset is read in: whole episodes per rank, a shuffle buffer, resumable.

Epoch ``e`` permutes the episodes (a keyed draw of ``(seed, e)``: ``utils.random``) and deals
them, in that order, to the data-parallel ranks: each episode goes to the rank that has been
given the fewest samples so far, counted over every epoch since the world started, so the ranks'
streams never drift apart by more than one episode and every episode is read by one rank only.
A rank's epoch is its episodes' samples one after another, shuffled within consecutive blocks of
``shuffle_buffer`` samples (also keyed by seed, epoch, rank and block): a shuffle buffer of that
size that needs no memory, since a sample is only a row position until a worker builds it. The
order is a pure function of the position, so any number of loader workers (the prefetcher's
threads: each builds whole batches) yields the same samples in the same order.

Position: like :class:`~lerobot_pipe.datasets.sampler.GlobalBatchSampler`, ``samples_consumed``
counts global samples; every rank takes ``batch_size`` samples a step from its own stream, so a
rank's stream position is ``(samples_consumed - base_sample) / dp_world_size``. A resume on the
same world size continues sample-exactly. A resume on another world size (:meth:`rebase`) deals
what the old ranks had not read of their current epochs (and of any carry of their own) to the
new ranks, again by whole episodes, before fresh epochs start: nothing of an epoch is read twice
or skipped. That carry is the one piece of state the position does not give; it is saved in the
checkpoint with the rest (:meth:`state_dict`).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
import torch

from lerobot_pipe.datasets.transforms import sample_keys
from lerobot_pipe.utils.random import keyed_uniform, stream_id

DEFAULT_SHUFFLE_BUFFER = 1000  # samples; LeRobot's StreamingLeRobotDataset buffer_size default
_ORDER_STREAM = stream_id("streaming.episode_order")
CARRY_EPOCH = -1  # the epoch label of carried samples (read before the fresh epochs)


def _keyed_permutation(seed: int, epoch: int, stream: int, n: int) -> np.ndarray:
    key = torch.from_numpy(sample_keys(seed, np.asarray([epoch], np.int64)).view(np.int64))
    return np.argsort(keyed_uniform(key, stream, n)[0].numpy(), kind="stable")


class StreamSampler:
    """This rank's indices (row positions of the dataset) step after step; the interface of
    :class:`~lerobot_pipe.datasets.sampler.GlobalBatchSampler`, which the prefetcher drives.

    ``episode_bounds``: the dataset's ``[from, to)`` row positions of each episode; ``indices``:
    the positions that may be drawn (None: all), e.g. without held-out episodes or each
    episode's last frames.
    """

    def __init__(
        self,
        episode_bounds: tuple[np.ndarray, np.ndarray],
        batch_size: int,
        dp_rank: int,
        dp_world_size: int,
        seed: int,
        start_sample: int = 0,
        *,
        indices: np.ndarray | None = None,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    ) -> None:
        if batch_size < 1 or dp_world_size < 1 or shuffle_buffer < 1:
            raise ValueError(
                f"batch_size ({batch_size}), dp_world_size ({dp_world_size}) and shuffle_buffer "
                f"({shuffle_buffer}) must all be at least 1."
            )
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank {dp_rank} must lie in [0, dp_world_size={dp_world_size}).")
        starts, ends = (np.asarray(b, np.int64) for b in episode_bounds)
        allowed = None if indices is None else np.unique(np.asarray(indices, np.int64))
        self.units: list[np.ndarray] = []  # each episode's drawable positions, in row order
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            rows = np.arange(a, b, dtype=np.int64)
            if allowed is not None:
                rows = rows[np.isin(rows, allowed)]
            if len(rows):
                self.units.append(rows)
        if not self.units:
            raise ValueError("no episode has a frame to draw")
        self.unit_sizes = np.asarray([len(u) for u in self.units], np.int64)
        self.num_drawable = int(self.unit_sizes.sum())
        self.num_samples = int(ends[-1]) if len(ends) else 0
        self.batch_size = batch_size
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.global_batch_size = batch_size * dp_world_size
        self.samples_consumed = start_sample
        # Where the current world's streams start: the global sample, the first fresh epoch,
        # and each rank's carried samples (with their epochs) read before it.
        self.base_sample = 0
        self.base_epoch = 0
        self.carry: list[np.ndarray] = [np.zeros(0, np.int64) for _ in range(dp_world_size)]
        self._epochs: list[tuple[list[np.ndarray], np.ndarray]] = []  # per epoch: shares, totals

    # ------------------------------------------------------------------ the deal

    def _deal(self, epoch_offset: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Epoch ``base_epoch + epoch_offset``: each rank's sample sequence and the ranks'
        cumulative totals after it (computed once, in epoch order)."""
        while len(self._epochs) <= epoch_offset:
            k = len(self._epochs)
            totals = (
                self._epochs[-1][1].copy()
                if self._epochs
                else np.asarray([len(c) for c in self.carry], np.int64)
            )
            epoch = self.base_epoch + k
            order = _keyed_permutation(self.seed, epoch, _ORDER_STREAM, len(self.units))
            heap = [(int(t), r) for r, t in enumerate(totals)]
            heapq.heapify(heap)
            given: list[list[int]] = [[] for _ in range(self.dp_world_size)]
            for unit in order.tolist():
                total, rank = heapq.heappop(heap)
                given[rank].append(unit)
                heapq.heappush(heap, (total + int(self.unit_sizes[unit]), rank))
            shares = []
            for rank, units in enumerate(given):
                rows = (
                    np.concatenate([self.units[u] for u in units])
                    if units
                    else np.zeros(0, np.int64)
                )
                shares.append(self._buffer_shuffle(rows, epoch, rank))
                totals[rank] += len(rows)
            self._epochs.append((shares, totals))
        return self._epochs[epoch_offset]

    def _buffer_shuffle(self, rows: np.ndarray, epoch: int, rank: int) -> np.ndarray:
        out = rows.copy()
        for block, start in enumerate(range(0, len(rows), self.shuffle_buffer)):
            stop = min(start + self.shuffle_buffer, len(rows))
            stream = stream_id(f"streaming.buffer/{self.dp_world_size}/{rank}/{block}")
            out[start:stop] = rows[start:stop][
                _keyed_permutation(self.seed, epoch, stream, stop - start)
            ]
        return out

    def draws(self, rank: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s stream positions ``[start, stop)``: their row positions and the epoch
        each was dealt in (``CARRY_EPOCH`` for carried samples)."""
        rows, epochs = [], []
        carry = self.carry[rank]
        if start < len(carry):
            take = carry[start : min(stop, len(carry))]
            rows.append(take)
            epochs.append(np.full(len(take), CARRY_EPOCH, np.int64))
        begin = len(carry)
        k = 0
        while begin < stop:
            shares, _ = self._deal(k)
            share = shares[rank]
            end = begin + len(share)
            lo, hi = max(start, begin), min(stop, end)
            if lo < hi:
                rows.append(share[lo - begin : hi - begin])
                epochs.append(np.full(hi - lo, self.base_epoch + k, np.int64))
            begin = end
            k += 1
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(rows), np.concatenate(epochs)

    # ------------------------------------------------------------------ the sampler interface

    def _local(self, samples_consumed: int) -> int:
        done = samples_consumed - self.base_sample
        if done < 0 or done % self.dp_world_size:
            raise ValueError(
                f"samples_consumed {samples_consumed} is not a position of this world "
                f"(base {self.base_sample}, {self.dp_world_size} ranks)"
            )
        return done // self.dp_world_size

    @property
    def epoch(self) -> int:
        """Epoch of this rank's next sample (``CARRY_EPOCH`` while it reads carried samples)."""
        local = self._local(self.samples_consumed)
        return int(self.draws(self.dp_rank, local, local + 1)[1][0])

    @property
    def epochs_consumed(self) -> float:
        return self.samples_consumed / self.num_drawable

    def next_positions(self) -> np.ndarray:
        start = self.samples_consumed + self.dp_rank * self.batch_size
        return np.arange(start, start + self.batch_size, dtype=np.int64)

    def rows_ahead(self, count: int | None = None) -> np.ndarray:
        """The row positions of this rank's next ``count`` samples (default: a shuffle buffer's
        worth) that belong to the epoch of the next one, in reading order, without advancing:
        what a streaming dataset may fetch ahead (not the next epoch's, which another rank
        may read first on another world)."""
        local = self._local(self.samples_consumed)
        rows, epochs = self.draws(self.dp_rank, local, local + (count or self.shuffle_buffer))
        return rows[epochs == epochs[0]] if len(rows) else rows

    def next_indices(self) -> np.ndarray:
        local = self._local(self.samples_consumed)
        rows, _ = self.draws(self.dp_rank, local, local + self.batch_size)
        self.samples_consumed += self.global_batch_size
        return rows

    # ------------------------------------------------------------------ resume

    def remaining(self, epoch: int | None = None) -> list[tuple[int, np.ndarray]]:
        """What the ranks have not read of the epochs they have begun (and of their carry),
        as (epoch, rows of one episode) pieces in reading order: the carry for another world."""
        local = self._local(self.samples_consumed)
        current = [int(self.draws(r, local, local + 1)[1][0]) for r in range(self.dp_world_size)]
        last = max(current) if epoch is None else epoch
        unit_of = np.empty(self.num_samples, np.int64)
        for u, rows in enumerate(self.units):
            unit_of[rows] = u
        pieces: list[tuple[int, np.ndarray]] = []
        for r in range(self.dp_world_size):
            end = len(self.carry[r]) + sum(
                len(self._deal(k)[0][r]) for k in range(last - self.base_epoch + 1)
            )
            rows, epochs = self.draws(r, local, end)
            for e in np.unique(epochs).tolist():
                sel = rows[epochs == e]
                units = unit_of[sel]
                for u in dict.fromkeys(units.tolist()):
                    pieces.append((e, sel[units == u]))
        return pieces

    def rebase(self, saved: dict[str, Any]) -> None:
        """Continue the stream a checkpoint's ``state_dict`` describes, on this sampler's world
        size: the same streams when it is the world that saved; else the old ranks' unread
        samples dealt to these ranks by whole episodes, then fresh epochs."""
        if saved["num_drawable"] != self.num_drawable or saved["seed"] != self.seed:
            raise ValueError(
                f"the checkpoint's stream drew {saved['num_drawable']} samples with seed "
                f"{saved['seed']}, this run {self.num_drawable} with seed {self.seed}: the "
                "dataset, its episodes or the seed changed, so the stream cannot continue"
            )
        old = StreamSampler.__new__(StreamSampler)
        old.__dict__.update(self.__dict__)
        old.dp_world_size = int(saved["dp_world_size"])
        old.batch_size = int(saved["batch_size"])
        old.global_batch_size = old.batch_size * old.dp_world_size
        old.shuffle_buffer = int(saved["shuffle_buffer"])
        old.samples_consumed = int(saved["samples_consumed"])
        old.base_sample = int(saved["base_sample"])
        old.base_epoch = int(saved["base_epoch"])
        old.carry = [np.asarray(c, np.int64) for c in saved["carry"]]
        old._epochs = []
        self.samples_consumed = old.samples_consumed
        if old.dp_world_size == self.dp_world_size and old.shuffle_buffer == self.shuffle_buffer:
            self.base_sample, self.base_epoch, self.carry = (
                old.base_sample,
                old.base_epoch,
                old.carry,
            )
            self._epochs = []
            return
        pieces = old.remaining()
        local = old._local(old.samples_consumed)
        last = max(int(old.draws(r, local, local + 1)[1][0]) for r in range(old.dp_world_size))
        carry: list[list[np.ndarray]] = [[] for _ in range(self.dp_world_size)]
        heap = [(0, r) for r in range(self.dp_world_size)]
        for _, rows in pieces:
            total, rank = heapq.heappop(heap)
            carry[rank].append(rows)
            heapq.heappush(heap, (total + len(rows), rank))
        self.base_sample = old.samples_consumed
        self.base_epoch = max(last, old.base_epoch - 1) + 1
        self.carry = [
            self._buffer_shuffle(np.concatenate(c), CARRY_EPOCH - self.base_epoch, r)
            if c
            else np.zeros(0, np.int64)
            for r, c in enumerate(carry)
        ]
        self._epochs = []

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: the position and what :meth:`rebase` needs to continue it."""
        return {
            "samples_consumed": self.samples_consumed,
            "seed": self.seed,
            "num_drawable": self.num_drawable,
            "batch_size": self.batch_size,
            "dp_world_size": self.dp_world_size,
            "global_batch_size": self.global_batch_size,
            "shuffle_buffer": self.shuffle_buffer,
            "base_sample": self.base_sample,
            "base_epoch": self.base_epoch,
            "carry": [c.tolist() for c in self.carry],
        }


class StreamState:
    """The checkpoint part of a streaming run (torch's ``Stateful``): the dataset's commit sha
    and the sampler's :meth:`StreamSampler.state_dict`. Loading keeps the saved state for the
    sampler the loop builds (:meth:`attach`), which continues it."""

    def __init__(self, revision: str) -> None:
        self.revision = revision
        self.sampler: StreamSampler | None = None
        self.saved: dict[str, Any] | None = None

    def attach(self, sampler: StreamSampler) -> StreamSampler:
        """``sampler`` continued from the loaded state (if any); saved from now on."""
        if self.saved is not None:
            sampler.rebase(self.saved)
        else:
            sampler.base_sample = sampler.samples_consumed  # no saved stream: epoch 0 from here
        self.sampler = sampler
        return sampler

    def state_dict(self) -> dict[str, Any]:
        if self.sampler is None:
            if self.saved is None:
                raise RuntimeError("StreamState has no sampler attached and nothing loaded")
            return self.saved
        return {"revision": self.revision, **self.sampler.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict["revision"] != self.revision:
            raise ValueError(
                f"the checkpoint streamed the dataset at commit {state_dict['revision']}, this "
                f"run opened it at {self.revision}"
            )
        self.saved = dict(state_dict)
