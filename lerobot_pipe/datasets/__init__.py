"""LeRobot v3.0 datasets: reading (cameras included), writing, a synthetic generator, rank-aware
sampling, prefetching."""

from lerobot_pipe.datasets.lerobot_dataset import FrameRows, LeRobotDataset
from lerobot_pipe.datasets.metadata import DatasetError, resolve_dataset_root
from lerobot_pipe.datasets.prefetch import BatchPrefetcher
from lerobot_pipe.datasets.sampler import GlobalBatchSampler, episode_frames
from lerobot_pipe.datasets.synthetic import write_synthetic_dataset

__all__ = [
    "BatchPrefetcher",
    "DatasetError",
    "FrameRows",
    "GlobalBatchSampler",
    "episode_frames",
    "LeRobotDataset",
    "resolve_dataset_root",
    "write_synthetic_dataset",
]
