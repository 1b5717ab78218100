"""The held-out loss: LeRobot 0.6.1's ``--dataset.eval_split``, ``--max_eval_samples`` and
``--eval_steps``, on every topology.

The split (:func:`split_episodes`, LeRobot's ``make_train_eval_datasets`` rule): the episodes are
grouped by their first task (``meta/episodes``' ``tasks``, in the order of ``--dataset.episodes``
or of their index), and the last ``ceil(n x eval_split)`` of each group are held out; the training
sampler never draws their frames. ``--max_eval_samples`` caps the held-out frames as LeRobot's
loader does: ``max(1, cap // n_tasks)`` first frames of each task (a frame's ``task_index``).
Normalization statistics stay the whole dataset's (``meta/stats.json``), as LeRobot's.

The figure (:func:`heldout_loss`): the mean of the policy's per-sample loss (``forward(batch,
reduction="none")``, LeRobot's convention for it) over every held-out frame, once each, under ``no_grad``, the policy in eval
mode (as LeRobot: no dropout, ACT without its VAE encoder, Diffusion's centre crop) and in the
run's autocast, with the live weights (not the EMA). The frames are split across the
data-parallel ranks in contiguous shares; each rank sums its losses in float64 and one
all-reduce adds the sums and counts, so the figure does not depend on the world size. Every rank
runs the same number of forward calls (a rank whose share has run out runs a one-sample batch of
weight 0): under FSDP2 / HSDP a forward is a collective. A held-out frame draws its randomness
(Diffusion's noise and diffusion step) from a fixed key of its own, :func:`heldout_keys`, so the
figure is the same at every evaluation of the same weights and on any world size.

LeRobot 0.6.1 instead averages the per-batch mean losses of each rank's padded loader, then the
ranks' figures: a mean of means, which depends on the batch size and the world size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from lerobot_pipe import constants as C
from lerobot_pipe.datasets import LeRobotDataset
from lerobot_pipe.datasets.metadata import episode_first_tasks
from lerobot_pipe.datasets.prefetch import to_device
from lerobot_pipe.datasets.transforms import sample_keys

# Held-out keys are sample_keys at stream positions from 2**63 on: a training run would have to
# draw 2**63 samples before one of its keys met a held-out frame's.
HELDOUT_KEY_BASE = np.uint64(2**63)


@dataclass(frozen=True)
class HeldOutSplit:
    """Which episodes train and which are held out, and the held-out frames evaluated."""

    train_episodes: tuple[int, ...]
    eval_episodes: tuple[int, ...]
    num_tasks: int
    num_held_out_frames: int  # every frame of the held-out episodes
    rows: np.ndarray = dataclasses.field(repr=False)  # dataset row positions evaluated

    @property
    def num_samples(self) -> int:
        return len(self.rows)


def split_episodes(
    episodes: Sequence[int], first_task: dict[int, str], eval_split: float
) -> tuple[list[int], list[int], int]:
    """LeRobot 0.6.1's split: ``episodes`` grouped by their first task (groups in order of first
    appearance, episodes in the given order), the last ``ceil(len(group) x eval_split)`` of each
    held out. Returns (train, held out, number of groups); ValueError when no episode trains."""
    groups: dict[str, list[int]] = {}
    for episode in episodes:
        groups.setdefault(first_task.get(episode, ""), []).append(episode)
    train, held_out = [], []
    for group in groups.values():
        n_eval = math.ceil(len(group) * eval_split)
        train.extend(group[: len(group) - n_eval])
        held_out.extend(group[len(group) - n_eval :])
    if not train:
        raise ValueError(
            f"--dataset.eval_split={eval_split} leaves no training episode of {len(episodes)} "
            f"(the last ceil(n x {eval_split}) of each of the {len(groups)} task(s) are held "
            "out); lower it"
        )
    return train, held_out, len(groups)


def cap_samples(rows: np.ndarray, task_index: np.ndarray, max_samples: int) -> np.ndarray:
    """LeRobot 0.6.1's ``--max_eval_samples``: for each task of the held-out frames (by
    ``task_index``, ascending), its first ``max(1, max_samples // n_tasks)`` frames; every frame
    when ``max_samples`` is 0."""
    if max_samples <= 0:
        return rows
    tasks = np.unique(task_index)
    per_task = max(1, max_samples // len(tasks))
    return np.concatenate([rows[task_index == t][:per_task] for t in tasks])


def plan_split(
    dataset: LeRobotDataset, eval_split: float, max_eval_samples: int = 0
) -> HeldOutSplit | None:
    """The run's split of ``dataset`` (None when ``eval_split`` is 0). ValueError when no
    training episode is left."""
    if eval_split == 0:
        return None
    episode_index = dataset.episode_index
    starts, _ = dataset.episode_bounds
    episodes = (
        list(dataset.episodes) if dataset.episodes is not None else episode_index[starts].tolist()
    )
    train, held_out, num_tasks = split_episodes(
        episodes, episode_first_tasks(dataset.root, episodes), eval_split
    )
    rows = np.flatnonzero(np.isin(episode_index, held_out))
    capped = cap_samples(rows, dataset.task_index[rows], max_eval_samples)
    return HeldOutSplit(tuple(train), tuple(held_out), num_tasks, len(rows), capped)


def train_episode_mask(dataset: LeRobotDataset, split: HeldOutSplit | None) -> np.ndarray | None:
    """Per episode of ``dataset`` (in row order), whether the training sampler draws from it."""
    if split is None:
        return None
    starts, _ = dataset.episode_bounds
    return np.isin(dataset.episode_index[starts], split.train_episodes)


def heldout_keys(seed: int, rows: np.ndarray) -> np.ndarray:
    """The fixed per-sample keys (int64) of held-out rows: a pure function of (seed, row)."""
    return sample_keys(seed, HELDOUT_KEY_BASE + rows.astype(np.uint64)).view(np.int64)


def rank_share(rows: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This rank's contiguous share of the held-out rows (sizes differ by at most one)."""
    return np.array_split(rows, world_size)[rank]


def num_forward_calls(num_samples: int, batch_size: int, world_size: int) -> int:
    """The forward calls every rank runs: its largest share in batches."""
    return math.ceil(math.ceil(num_samples / world_size) / batch_size)


def _batch(dataset: LeRobotDataset, rows: np.ndarray, seed: int, device: torch.device) -> dict:
    """The held-out frames ``rows`` as the policy's preprocessor takes them: no image
    augmentation (LeRobot's held-out dataset has none), cameras as float32 in [0, 1]."""
    batch = dataset.get_batch(rows, raw_cameras=True)
    batch[C.SAMPLE_KEY] = torch.from_numpy(heldout_keys(seed, rows))
    batch = to_device(batch, device)  # the task strings stay a list
    for key in dataset.camera_keys:
        if batch[key].dtype == torch.uint8:
            batch[key] = batch[key].to(torch.float32).div_(255.0)
    return batch


def heldout_loss(
    model: nn.Module,
    pre,
    dataset: LeRobotDataset,
    split: HeldOutSplit,
    *,
    batch_size: int,
    seed: int,
    rank: int,
    world_size: int,
    device: torch.device,
    autocast: contextlib.AbstractContextManager | None = None,
) -> float:
    """The mean per-sample loss over the held-out frames (module docstring). ``rank`` and
    ``world_size`` are the data-parallel ones (every process of the run holds a data-parallel
    rank). Collective over the default process group when one exists; ``model`` is left in
    training mode."""
    share = rank_share(split.rows, rank, world_size)
    calls = num_forward_calls(split.num_samples, batch_size, world_size)
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, count
    model.eval()
    try:
        with torch.no_grad():
            for k in range(calls):
                rows = share[k * batch_size : (k + 1) * batch_size]
                weight = 1.0
                if not len(rows):  # this rank's share has run out: a forward of weight 0
                    rows, weight = split.rows[:1], 0.0
                batch = pre(_batch(dataset, rows, seed, device))
                with autocast or contextlib.nullcontext():
                    losses, _ = model(batch, reduction="none")
                totals[0] += losses.detach().double().sum() * weight
                totals[1] += len(rows) * weight
    finally:
        model.train()
    if dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return (totals[0] / totals[1]).item()


def describe(split: HeldOutSplit) -> str:
    """The banner's line."""
    return (
        f"Held out: {len(split.eval_episodes)} of "
        f"{len(split.train_episodes) + len(split.eval_episodes)} episodes "
        f"({split.num_tasks} task(s)), {split.num_samples} frames evaluated"
    )
