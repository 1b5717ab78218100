"""Write a LeRobot v3.0 dataset episode by episode, in the files and schemas LeRobot writes.

One data file (one row group per episode), one mp4 per video camera with every episode in it,
PNG frames inside the parquet for image cameras, the episodes table with per-episode
statistics, the tasks table, stats.json aggregated as LeRobot aggregates, and info.json.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_pipe.constants import (
    DATASET_CODEBASE_VERSION,
    DATASET_DATA_PATH,
    DATASET_EPISODES_PATH,
    DATASET_INFO,
    DATASET_STATS,
    DATASET_TASKS,
    DATASET_VIDEO_PATH,
)
from lerobot_pipe.datasets import stats as S
from lerobot_pipe.datasets.video import (
    LEROBOT_ENCODING,
    VideoEncoding,
    VideoWriter,
    encode_episode,
)

CHUNKS_SIZE = 1000
DATA_FILES_SIZE_MB = 100
VIDEO_FILES_SIZE_MB = 200
IMAGE_NAMES = ["height", "width", "channels"]
# Columns every v3.0 data file has after the features, in LeRobot's order.
DEFAULT_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


def camera_feature(dtype: str, height: int, width: int) -> dict[str, Any]:
    """A camera's entry in meta/info.json ``features`` (the video ``info`` block is added by the
    writer, which knows the encoding and fps)."""
    return {"dtype": dtype, "shape": [height, width, 3], "names": IMAGE_NAMES}


def _hf_feature(feature: dict[str, Any]) -> dict[str, Any]:
    """The Hugging Face ``datasets`` feature LeRobot declares for a column."""
    if feature["dtype"] == "image":
        return {"_type": "Image"}
    shape = list(feature["shape"])
    value = {"dtype": feature["dtype"], "_type": "Value"}
    if shape == [1]:
        return value
    if len(shape) == 1:
        return {"feature": value, "length": shape[0], "_type": "List"}
    raise ValueError(f"feature shape {shape} is not supported by this writer (only [n])")


def _arrow_column(values: Any, feature: dict[str, Any]) -> pa.Array:
    if feature["dtype"] == "image":
        return pa.array(values, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    dtype = pa.from_numpy_dtype(np.dtype(feature["dtype"]))
    array = np.asarray(values)
    shape = list(feature["shape"])
    if shape == [1]:
        return pa.array(array.reshape(-1), type=dtype)
    flat = pa.array(array.reshape(-1), type=dtype)
    return pa.FixedSizeListArray.from_arrays(flat, shape[0])


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()


class DatasetWriter:
    """Write ``folder`` (created empty) as a LeRobot v3.0 dataset.

    ``features`` are the user features in column order: numeric ones (``{"dtype", "shape",
    "names"}``) and cameras (``camera_feature``). ``add_episode`` takes an episode's numeric
    columns (``(n, *shape)`` arrays) and camera frames (uint8 ``(n, H, W, 3)``); timestamps,
    frame and task indices are filled in as LeRobot's recorder fills them.
    """

    def __init__(
        self,
        folder: Path,
        fps: int,
        features: dict[str, dict[str, Any]],
        robot_type: str | None = None,
        encoding: VideoEncoding = LEROBOT_ENCODING,
        video_files_size_in_mb: float = VIDEO_FILES_SIZE_MB,
    ) -> None:
        self.folder = folder
        self.video_files_size_in_mb = video_files_size_in_mb
        self.fps = fps
        self.robot_type = robot_type
        self.encoding = encoding
        self.features = {key: dict(ft) for key, ft in features.items()} | {
            key: dict(ft) for key, ft in DEFAULT_FEATURES.items()
        }
        self.video_keys = [k for k, ft in self.features.items() if ft["dtype"] == "video"]
        self.column_keys = [k for k, ft in self.features.items() if ft["dtype"] != "video"]
        for key in self.video_keys:
            height, width = self.features[key]["shape"][:2]
            self.features[key]["info"] = encoding.info(height, width, fps)
        # The data file's schema carries the Hugging Face features LeRobot reads it with; the
        # fingerprint (a cache key of the `datasets` library) is derived from the layout.
        hf_features = {key: _hf_feature(self.features[key]) for key in self.column_keys}
        layout = json.dumps([hf_features, fps, robot_type], sort_keys=True).encode()
        metadata = {
            "info": {"features": hf_features},
            "fingerprint": hashlib.sha256(layout).hexdigest()[:16],
        }
        self._schema = pa.schema(
            [(key, _arrow_column([], self.features[key]).type) for key in self.column_keys],
            metadata={"huggingface": json.dumps(metadata)},
        )
        data_path = folder / DATASET_DATA_PATH.format(chunk_index=0, file_index=0)
        data_path.parent.mkdir(parents=True, exist_ok=True)
        self._data = pq.ParquetWriter(data_path, self._schema)
        # Per camera: the open mp4 and its (chunk_index, file_index).
        self._videos = {key: self._video_file(key, 0, 0) for key in self.video_keys}
        self._video_at = dict.fromkeys(self.video_keys, (0, 0))
        self._tasks: dict[str, int] = {}
        self._episodes: list[dict[str, Any]] = []
        self._episode_stats: list[dict[str, S.Stats]] = []
        self.num_frames = 0

    def _video_file(self, key: str, chunk: int, file: int) -> VideoWriter:
        path = DATASET_VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
        return VideoWriter(self.folder / path)

    def _append_video(self, key: str, frames: np.ndarray) -> tuple[float, float]:
        """Encode an episode of camera ``key`` and append it to the camera's current file, or
        to a new one when the episode would bring it to ``video_files_size_in_mb`` (LeRobot's
        rule; files numbered as LeRobot numbers them). Returns its time span in that file."""
        episode = self.folder / f"videos/{key}/.episode.mp4"
        encode_episode(frames, episode, self.fps, self.encoding)
        size_mb = episode.stat().st_size / 1e6
        current = self._videos[key]
        if current.num_frames and current.size_mb + size_mb >= self.video_files_size_in_mb:
            current = self._next_video_file(key)
        span = current.append(episode)
        episode.unlink()
        return span

    def _next_video_file(self, key: str) -> VideoWriter:
        current = self._videos[key]
        current.close()
        chunk, file = self._video_at[key]
        chunk, file = (chunk + 1, 0) if file + 1 == CHUNKS_SIZE else (chunk, file + 1)
        self._video_at[key] = (chunk, file)
        self._videos[key] = self._video_file(key, chunk, file)
        return self._videos[key]

    def add_episode(
        self, columns: dict[str, np.ndarray], task: str, cameras: dict[str, np.ndarray]
    ) -> None:
        episode = len(self._episodes)
        n = len(next(iter(cameras.values()))) if cameras else len(next(iter(columns.values())))
        task_index = self._tasks.setdefault(task, len(self._tasks))
        frame_index = np.arange(n, dtype=np.int64)
        values = dict(columns) | {
            "timestamp": (frame_index / self.fps).astype(np.float32),
            "frame_index": frame_index,
            "episode_index": np.full(n, episode, dtype=np.int64),
            "index": np.arange(self.num_frames, self.num_frames + n, dtype=np.int64),
            "task_index": np.full(n, task_index, dtype=np.int64),
        }
        stats: dict[str, S.Stats] = {}
        for key, ft in self.features.items():
            if ft["dtype"] in ("image", "video"):
                stats[key] = S.image_stats(cameras[key])
            elif key == "timestamp":  # LeRobot's recorder keeps the float64 times for stats
                stats[key] = S.feature_stats(frame_index / self.fps)
            else:
                stats[key] = S.feature_stats(values[key])
        record: dict[str, Any] = {
            "episode_index": episode,
            "tasks": [task],
            "length": n,
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": self.num_frames,
            "dataset_to_index": self.num_frames + n,
        }
        for key in self.video_keys:
            start, end = self._append_video(key, cameras[key])
            chunk, file = self._video_at[key]
            record |= {
                f"videos/{key}/chunk_index": chunk,
                f"videos/{key}/file_index": file,
                f"videos/{key}/from_timestamp": start,
                f"videos/{key}/to_timestamp": end,
            }
        arrays = []
        for key in self.column_keys:
            ft = self.features[key]
            if ft["dtype"] == "image":
                data = [
                    {"bytes": _png(image), "path": f"frame-{i:06d}.png"}
                    for i, image in enumerate(cameras[key])
                ]
            else:
                data = values[key]
            arrays.append(_arrow_column(data, ft))
        self._data.write_table(pa.Table.from_arrays(arrays, schema=self._schema))
        self._episodes.append(record)
        self._episode_stats.append(stats)
        self.num_frames += n

    def finish(self) -> None:
        """Close the files and write the metadata; the dataset is complete afterwards."""
        self._data.close()
        for video in self._videos.values():
            video.close()

        episodes = []
        for record, stats in zip(self._episodes, self._episode_stats, strict=True):
            row = dict(record)
            for key, feature_stats in stats.items():
                for name, value in feature_stats.items():
                    row[f"stats/{key}/{name}"] = np.asarray(value).tolist()
            row |= {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
            episodes.append(row)
        episodes_path = self.folder / DATASET_EPISODES_PATH.format(chunk_index=0, file_index=0)
        episodes_path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(episodes), episodes_path)

        tasks = pd.DataFrame(
            {"task_index": np.arange(len(self._tasks), dtype=np.int64)},
            index=pd.Index(list(self._tasks), dtype=object, name="task"),
        )
        pq.write_table(
            pa.Table.from_pandas(tasks, preserve_index=True), self.folder / DATASET_TASKS
        )

        stats_json = S.to_json(S.aggregate(self._episode_stats))
        (self.folder / DATASET_STATS).write_text(json.dumps(stats_json, indent=4))
        info = {
            "codebase_version": DATASET_CODEBASE_VERSION,
            "fps": self.fps,
            "features": self.features,
            "total_episodes": len(self._episodes),
            "total_frames": self.num_frames,
            "total_tasks": len(self._tasks),
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": DATA_FILES_SIZE_MB,
            "video_files_size_in_mb": self.video_files_size_in_mb,
            "data_path": DATASET_DATA_PATH,
            "video_path": DATASET_VIDEO_PATH if self.video_keys else None,
            "robot_type": self.robot_type,
            "splits": {"train": f"0:{len(self._episodes)}"},
        }
        (self.folder / DATASET_INFO).write_text(json.dumps(info, indent=4))
