"""Rank-aware, sample-exact batch order over an infinite stream of per-epoch permutations."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def episode_frames(
    episode_from: np.ndarray,
    episode_to: np.ndarray,
    drop_n_first_frames: int = 0,
    drop_n_last_frames: int = 0,
) -> np.ndarray:
    """The dataset positions of every episode's frames ``[from, to)`` without its first
    ``drop_n_first_frames`` and last ``drop_n_last_frames`` (LeRobot's EpisodeAwareSampler rule:
    an episode left with no frame is skipped with a warning; ValueError when none remains)."""
    if drop_n_first_frames < 0 or drop_n_last_frames < 0:
        raise ValueError(
            f"drop_n_first_frames ({drop_n_first_frames}) and drop_n_last_frames "
            f"({drop_n_last_frames}) must be >= 0"
        )
    starts = np.asarray(episode_from, dtype=np.int64) + drop_n_first_frames
    stops = np.asarray(episode_to, dtype=np.int64) - drop_n_last_frames
    empty = np.flatnonzero(stops <= starts)
    if len(empty) == len(starts):
        raise ValueError(
            f"no frame is left to sample: every episode has at most {drop_n_first_frames} + "
            f"{drop_n_last_frames} frames (drop_n_first_frames + drop_n_last_frames); lower them "
            "or record longer episodes"
        )
    if len(empty):
        log.warning(
            "%d of %d episodes have no frame left after dropping their first %d and last %d; "
            "they are never sampled",
            len(empty),
            len(starts),
            drop_n_first_frames,
            drop_n_last_frames,
        )
    keep = stops > starts
    return np.concatenate([np.arange(a, b) for a, b in zip(starts[keep], stops[keep], strict=True)])


class GlobalBatchSampler:
    """The sampler's order is a pure function of (seed, epoch).

    The dataset is an infinite stream made of per-epoch permutations
    (``np.random.default_rng([seed, epoch]).permutation(n)``) of the ``n`` positions it draws
    from: every one of ``range(num_samples)``, or only ``indices`` (e.g. :func:`episode_frames`
    without each episode's last frames). Position is counted in GLOBAL samples consumed. Each
    step consumes one global batch of ``batch_size * dp_world_size`` consecutive stream
    positions; dp rank ``r`` takes the contiguous slice ``[r * batch_size, (r + 1) * batch_size)``
    of it. Runs with the same global batch therefore see exactly the same samples per step
    however many ranks split it, and resuming from ``start_sample`` is sample-exact. Batches may
    straddle an epoch boundary.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        dp_rank: int,
        dp_world_size: int,
        seed: int,
        start_sample: int = 0,
        *,
        indices: np.ndarray | None = None,
    ) -> None:
        if num_samples < 1 or batch_size < 1 or dp_world_size < 1:
            raise ValueError(
                f"num_samples ({num_samples}), batch_size ({batch_size}) and dp_world_size "
                f"({dp_world_size}) must all be at least 1."
            )
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank {dp_rank} must lie in [0, dp_world_size={dp_world_size}).")
        if start_sample < 0:
            raise ValueError(f"start_sample must be >= 0, got {start_sample}.")
        if indices is not None:
            indices = np.asarray(indices, dtype=np.int64)
            if indices.ndim != 1 or not len(indices):
                raise ValueError("indices must be a non-empty 1-D array of dataset positions.")
            if indices.min() < 0 or indices.max() >= num_samples:
                raise ValueError(
                    f"indices must lie in [0, num_samples={num_samples}), got "
                    f"[{indices.min()}, {indices.max()}]."
                )
        self.indices = indices
        # How many positions each epoch permutes.
        self.num_drawable = num_samples if indices is None else len(indices)
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.seed = seed
        self.global_batch_size = batch_size * dp_world_size
        self.samples_consumed = start_sample
        self._perms: dict[int, np.ndarray] = {}

    @property
    def epoch(self) -> int:
        """Epoch of the next sample to be consumed."""
        return self.samples_consumed // self.num_drawable

    @property
    def epochs_consumed(self) -> float:
        """Samples consumed, in epochs of the positions drawn from."""
        return self.samples_consumed / self.num_drawable

    def _permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            # Keep the current epoch and the next: a step touches at most those two.
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_drawable)
            if self.indices is not None:
                perm = self.indices[perm]
            self._perms[epoch] = perm
        return perm

    def _stream(self, start: int, stop: int) -> np.ndarray:
        """Dataset indices at stream positions ``[start, stop)``."""
        parts = []
        while start < stop:
            epoch, offset = divmod(start, self.num_drawable)
            take = min(stop - start, self.num_drawable - offset)
            parts.append(self._permutation(epoch)[offset : offset + take])
            start += take
        return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()

    def next_positions(self) -> np.ndarray:
        """Stream positions of this rank's next batch (what ``next_indices`` will return the
        dataset indices of); they identify each sample draw, e.g. to seed its augmentation."""
        start = self.samples_consumed + self.dp_rank * self.batch_size
        return np.arange(start, start + self.batch_size, dtype=np.int64)

    def next_indices(self) -> np.ndarray:
        """This rank's dataset indices for the next step; advances by one global batch."""
        start = self.samples_consumed + self.dp_rank * self.batch_size
        indices = self._stream(start, start + self.batch_size)
        self.samples_consumed += self.global_batch_size
        return indices

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position; resume with ``start_sample=state["samples_consumed"]``."""
        return {
            "samples_consumed": self.samples_consumed,
            "epoch": self.epoch,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "num_drawable": self.num_drawable,
            "batch_size": self.batch_size,
            "dp_world_size": self.dp_world_size,
            "global_batch_size": self.global_batch_size,
        }
