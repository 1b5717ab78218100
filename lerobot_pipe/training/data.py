"""The data a run trains on: the dataset opened for the policy (a local or downloaded LeRobot
dataset, or a Hub stream), the positions its sampler draws from, the sampler itself, and the
processors that prepare its batches for the policy."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lerobot_pipe import constants as C
from lerobot_pipe.checkpoint.resume import ResumePoint
from lerobot_pipe.configs.parser import ConfigError, read_json
from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.configs.train import TrainConfig
from lerobot_pipe.configs.types import ACTION, OBS_PREFIX
from lerobot_pipe.datasets import (
    DatasetError,
    GlobalBatchSampler,
    LeRobotDataset,
    episode_frames,
    resolve_dataset_root,
)
from lerobot_pipe.datasets.stream_sampler import StreamSampler
from lerobot_pipe.datasets.streaming import StreamingLeRobotDataset
from lerobot_pipe.policies import lerobot_bridge
from lerobot_pipe.policies.factory import make_pre_post_processors
from lerobot_pipe.processors import (
    MissingStats,
    NormalizerProcessorStep,
    PolicyProcessorPipeline,
    RenameObservationsProcessorStep,
)
from lerobot_pipe.training.heldout import HeldOutSplit, train_episode_mask

if TYPE_CHECKING:
    from lerobot_pipe.training.preflight import TrainingPlan

# What a run trains on: a streamed dataset is read like a local one (not a subclass of it).
TrainingDataset = LeRobotDataset | StreamingLeRobotDataset


def open_dataset(cfg: TrainConfig, point: ResumePoint | None, rank: int) -> TrainingDataset:
    """--dataset.*: the local (or downloaded) dataset, or with --dataset.streaming the Hub
    stream; its windows (delta timestamps) the policy's."""
    if cfg.dataset.streaming:
        return open_streaming_dataset(cfg, point, rank)
    root = resolve_dataset_root(
        cfg.dataset.root, cfg.dataset.repo_id, cfg.dataset.revision, episodes=cfg.dataset.episodes
    )
    return LeRobotDataset(
        root,
        delta_timestamps=delta_timestamps(cfg.policy, root),
        episodes=cfg.dataset.episodes,
        video_backend=cfg.dataset.video_backend,
        tolerance_s=cfg.tolerance_s,
        image_transforms=cfg.dataset.image_transforms,
        use_imagenet_stats=cfg.dataset.use_imagenet_stats,
    )


def open_streaming_dataset(
    cfg: TrainConfig, point: ResumePoint | None, rank: int
) -> StreamingLeRobotDataset:
    """--dataset.streaming=true: the Hub dataset at the commit the run started on (the
    checkpoint's, on resume), cached per rank under --dataset.root or HF_HOME."""
    from huggingface_hub import constants as hub_constants

    saved = point.stream_revision if point is not None else None
    revision = saved if saved is not None else cfg.dataset.revision
    folder = (
        Path(cfg.dataset.root).expanduser()
        if cfg.dataset.root
        else Path(hub_constants.HF_HOME) / "lerobot_pipe_streaming" / cfg.dataset.repo_id
    )
    dataset = StreamingLeRobotDataset(
        cfg.dataset.repo_id,
        folder / f"rank-{rank}",
        revision=revision,
        cache_mb=cfg.dataset.streaming_cache_mb,
        episodes=cfg.dataset.episodes,
        video_backend=cfg.dataset.video_backend,
        tolerance_s=cfg.tolerance_s,
        image_transforms=cfg.dataset.image_transforms,
        use_imagenet_stats=cfg.dataset.use_imagenet_stats,
    )
    dataset.delta_timestamps = delta_timestamps(cfg.policy, dataset.root) or {}
    return dataset


def delta_timestamps(policy: PreTrainedConfig, root: Path) -> dict[str, list[float]] | None:
    """LeRobot's resolve_delta_timestamps: the action window from the policy's
    ``action_delta_indices``, every ``observation.*`` feature's (cameras included) from its
    ``observation_delta_indices``, in seconds at the dataset's fps."""
    info = read_json(root / C.DATASET_INFO, "dataset info")
    fps = info.get("fps")
    if not isinstance(fps, int | float) or fps <= 0:
        raise DatasetError(f"{root / C.DATASET_INFO}: 'fps' must be a positive number, got {fps!r}")
    windows = {}
    for key in info.get("features", {}):
        if key == ACTION:
            indices = policy.action_delta_indices
        elif key.startswith(OBS_PREFIX):
            indices = policy.observation_delta_indices
        else:
            continue
        if indices is not None:
            windows[key] = [i / fps for i in indices]
    return windows or None


def sample_indices(
    policy: PreTrainedConfig, dataset: TrainingDataset, heldout: HeldOutSplit | None = None
) -> np.ndarray | None:
    """The dataset positions the sampler draws from: every frame of the training episodes
    (all but those ``heldout`` holds out), or, for a policy with a ``drop_n_last_frames`` field
    (LeRobot's convention, e.g. Diffusion Policy), each one's frames but its last
    ``drop_n_last_frames``. None means every frame. ConfigError when no frame is left."""
    drop = getattr(policy, "drop_n_last_frames", 0) or 0
    keep = train_episode_mask(dataset, heldout)
    if not drop and keep is None:
        return None
    starts, ends = dataset.episode_bounds
    if keep is not None:
        starts, ends = starts[keep], ends[keep]
    try:
        return episode_frames(starts, ends, drop_n_last_frames=drop)
    except ValueError as e:
        raise ConfigError(f"--policy.drop_n_last_frames={drop} on {dataset.root}: {e}") from None


def make_sampler(
    plan: TrainingPlan, batch_size: int, rank: int, world: int, start_sample: int = 0
) -> GlobalBatchSampler | StreamSampler:
    """The batch order: a global permutation per epoch, or, streaming, whole episodes per rank
    (datasets/stream_sampler.py). Both are pure functions of the position."""
    cfg = plan.cfg
    indices = sample_indices(cfg.policy, plan.dataset, plan.heldout)
    if cfg.dataset.streaming:
        return StreamSampler(
            plan.dataset.episode_bounds,
            batch_size,
            rank,
            world,
            cfg.seed,
            start_sample,
            indices=indices,
            shuffle_buffer=cfg.dataset.streaming_shuffle_buffer,
        )
    return GlobalBatchSampler(
        len(plan.dataset), batch_size, rank, world, cfg.seed, start_sample, indices=indices
    )


def make_processors(
    plan: TrainingPlan, device_type: str
) -> tuple[PolicyProcessorPipeline, PolicyProcessorPipeline]:
    """LeRobot's default pipelines for the policy, on ``device_type``, renaming with
    ``--rename_map``. Statistics: a resumed run's own (saved in its checkpoint), else the
    dataset's (also when fine-tuning with --policy.path, as LeRobot does)."""
    cfg = plan.cfg
    if isinstance(cfg.policy, lerobot_bridge.LeRobotPolicyConfig):
        # LeRobot's pipelines and steps: a resumed run loads its saved pair, as LeRobot does.
        return lerobot_bridge.make_processors(
            cfg.policy,
            dataset_stats=plan.dataset.stats,
            pretrained_path=None
            if plan.resume_from is None
            else plan.resume_from / C.PRETRAINED_MODEL_DIR,
            device=device_type,
            rename_map=cfg.rename_map,
        )
    stats: dict = plan.dataset.stats
    if plan.resume_from is not None:
        saved, _ = make_pre_post_processors(
            cfg.policy, pretrained_path=plan.resume_from / C.PRETRAINED_MODEL_DIR
        )
        stats = saved.step(NormalizerProcessorStep.registry_name).stats
    try:
        pre, post = make_pre_post_processors(
            dataclasses.replace(cfg.policy, device=device_type), dataset_stats=stats
        )
    except MissingStats as e:
        if plan.resume_from is not None:
            raise
        raise DatasetError(
            f"{plan.dataset.root / C.DATASET_STATS}: {e}: the policy normalizes that feature. "
            "Recompute the dataset statistics."
        ) from None
    renames = [i for i, s in enumerate(pre.steps) if isinstance(s, RenameObservationsProcessorStep)]
    if not renames:
        raise ValueError(f"the {cfg.policy.type} preprocessor has no rename step for --rename_map")
    pre.steps[renames[0]] = RenameObservationsProcessorStep(rename_map=cfg.rename_map)
    return pre, post
