"""Reader for LeRobot v3.0 datasets holding numeric (non-camera) features.

Every parquet file is read once at open into contiguous numpy arrays; ``get_batch``
then gathers a whole batch (including delta-timestamp windows) with numpy fancy indexing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lerobot_pipe.constants import (
    DATASET_CODEBASE_VERSION,
    DATASET_EPISODES_GLOB,
    DATASET_INFO,
    DATASET_STATS,
)

# Bookkeeping columns every v3.0 data file carries, with the dtype get_batch returns them in.
META_COLUMNS: dict[str, np.dtype] = {
    "index": np.dtype(np.int64),
    "episode_index": np.dtype(np.int64),
    "frame_index": np.dtype(np.int64),
    "timestamp": np.dtype(np.float32),
    "task_index": np.dtype(np.int64),
}
CAMERA_DTYPES = ("image", "video")
NUMERIC_DTYPES = frozenset(
    {
        "bool",
        "float16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
    }
)
REQUIRED_STATS = ("mean", "std", "min", "max")
# Largest distance (seconds) a delta timestamp may sit from a multiple of 1/fps.
DELTA_TOLERANCE_S = 1e-4
DOWNLOAD_PATTERNS = ["meta/**", "data/**", "*.md", "*.json"]


class DatasetError(ValueError):
    """A dataset on disk (or its location) is unusable; the message names the file and the fix."""


def resolve_dataset_root(
    root: str | Path | None, repo_id: str | None, revision: str | None = None
) -> Path:
    """Return a local folder holding ``meta/info.json``, downloading from the Hub if needed.

    With ``root`` already holding a dataset it is returned as is. Otherwise, when
    ``repo_id`` is set, the dataset's metadata and data files (never videos) are
    downloaded into ``root`` or, without ``root``, into the Hugging Face cache.
    """
    if root is None and repo_id is None:
        raise DatasetError("No dataset given: pass --dataset.root or --dataset.repo_id.")
    if root is not None:
        root = Path(root).expanduser()
        if (root / DATASET_INFO).is_file():
            return root
        if repo_id is None:
            raise DatasetError(
                f"{root / DATASET_INFO}: not found, so {root} is not a LeRobot dataset. "
                "Point --dataset.root at a dataset folder (the one holding meta/ and data/), "
                "or also pass --dataset.repo_id to download it there."
            )
    import huggingface_hub

    where = f"into {root}" if root is not None else "into the Hugging Face cache"
    try:
        downloaded = huggingface_hub.snapshot_download(
            repo_id,
            repo_type="dataset",
            revision=revision,
            local_dir=root,
            allow_patterns=DOWNLOAD_PATTERNS,
        )
    except Exception as exc:
        missing = f"{root} does not hold a dataset (no {DATASET_INFO}) and " if root else ""
        raise DatasetError(
            f"{missing}downloading dataset repo_id={repo_id!r} (revision={revision!r}) {where} "
            f"failed: {type(exc).__name__}: {str(exc).rstrip('.')}. Check the repo_id, your network and "
            "HF_TOKEN, or pass --dataset.root pointing at a local copy."
        ) from exc
    path = Path(downloaded)
    if not (path / DATASET_INFO).is_file():
        raise DatasetError(
            f"{path / DATASET_INFO}: not found after downloading repo_id={repo_id!r} "
            f"(revision={revision!r}); the repository is not a LeRobot v3.0 dataset."
        )
    return path


def _read_info(root: Path) -> dict[str, Any]:
    path = root / DATASET_INFO
    if not path.is_file():
        raise DatasetError(
            f"{path}: not found. --dataset.root must be a LeRobot v3.0 dataset folder "
            "(holding meta/info.json, meta/stats.json and data/)."
        )
    try:
        info = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}. "
            "Fix the file or download the dataset again."
        ) from exc
    if not isinstance(info, dict):
        raise DatasetError(f"{path}: expected a JSON object, found {type(info).__name__}.")
    version = info.get("codebase_version")
    if version != DATASET_CODEBASE_VERSION:
        raise DatasetError(
            f"{path}: codebase_version is {version!r}, only {DATASET_CODEBASE_VERSION!r} is "
            "supported. Convert the dataset with LeRobot's v3.0 conversion script first."
        )
    for key in ("fps", "features"):
        if key not in info:
            raise DatasetError(f"{path}: required key {key!r} is missing.")
    camera_keys = sorted(
        key for key, ft in info["features"].items() if ft.get("dtype") in CAMERA_DTYPES
    )
    if camera_keys:
        raise DatasetError(
            f"{path}: camera features {camera_keys} have dtype image/video; image inputs are "
            "not supported yet. Use a dataset with only numeric features "
            "(observation.state, observation.environment_state, action)."
        )
    return info


def _read_stats(
    root: Path, features: dict[str, dict[str, Any]], data_keys: list[str]
) -> dict[str, dict[str, np.ndarray]]:
    path = root / DATASET_STATS
    if not path.is_file():
        raise DatasetError(
            f"{path}: not found; normalisation needs per-feature statistics. "
            "Recompute them with LeRobot or download the dataset again."
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}."
        ) from exc
    stats = {
        key: {name: np.asarray(value, dtype=np.float32) for name, value in feature_stats.items()}
        for key, feature_stats in raw.items()
    }
    for key in data_keys:
        missing = [name for name in REQUIRED_STATS if name not in stats.get(key, {})]
        if missing:
            raise DatasetError(
                f"{path}: feature {key!r} lacks statistics {missing} (needs {list(REQUIRED_STATS)}). "
                "Recompute the dataset statistics."
            )
        shape = tuple(features[key]["shape"])
        for name in REQUIRED_STATS:
            if stats[key][name].shape != shape:
                raise DatasetError(
                    f"{path}: {key}.{name} has shape {list(stats[key][name].shape)}, "
                    f"but meta/info.json declares shape {list(shape)}."
                )
    return stats


def _episode_files(root: Path, info: dict[str, Any], episodes: list[int] | None) -> list[Path]:
    """Data files to load: those the episodes metadata references, else data/*/*.parquet."""
    meta_files = sorted(root.glob(DATASET_EPISODES_GLOB))
    data_path = info.get("data_path")
    if meta_files and data_path:
        columns = ["episode_index", "data/chunk_index", "data/file_index"]
        refs: set[tuple[int, int]] = set()
        for meta_file in meta_files:
            try:
                table = pq.read_table(meta_file, columns=columns)
            except (pa.ArrowInvalid, KeyError) as exc:
                raise DatasetError(
                    f"{meta_file}: cannot read columns {columns}: {exc}. "
                    "The episodes metadata is corrupt; download the dataset again."
                ) from exc
            eps = table["episode_index"].to_numpy()
            chunks = table["data/chunk_index"].to_numpy()
            files = table["data/file_index"].to_numpy()
            keep = np.ones(len(eps), bool) if episodes is None else np.isin(eps, episodes)
            refs.update(zip(chunks[keep].tolist(), files[keep].tolist(), strict=True))
        paths = [
            root / data_path.format(chunk_index=chunk, file_index=file)
            for chunk, file in sorted(refs)
        ]
        if not paths:
            raise DatasetError(
                f"{root / 'meta/episodes'}: none of episodes {episodes} is listed. "
                "Pass episode indices that exist in the dataset."
            )
    else:
        paths = sorted(root.glob("data/*/*.parquet"))
        if not paths:
            raise DatasetError(
                f"{root / 'data'}: no data files (data/*/*.parquet) found. "
                "Download the dataset's data/ folder too (not only meta/)."
            )
    for path in paths:
        if not path.is_file():
            raise DatasetError(
                f"{path}: data file listed in {root / 'meta/episodes'} is missing. "
                "Download the dataset again (data/ is incomplete)."
            )
    return paths


def _column_to_numpy(
    column: pa.ChunkedArray, shape: tuple[int, ...], dtype: np.dtype, path: Path, key: str
) -> np.ndarray:
    array = column.combine_chunks()
    n = len(array)
    kind = array.type
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if is_list or pa.types.is_fixed_size_list(kind):
        array = array.flatten()
    flat = array.to_numpy(zero_copy_only=False)
    size = int(np.prod(shape))
    if flat.size != n * size:
        raise DatasetError(
            f"{path}: column {key!r} holds {flat.size} values for {n} rows, but "
            f"meta/info.json declares shape {list(shape)} ({n * size} values)."
        )
    return flat.astype(dtype, copy=False).reshape((n, *shape))


class LeRobotDataset:
    """Numeric features of a LeRobot v3.0 dataset, held in memory for vectorised batching.

    ``delta_timestamps`` maps a feature key to offsets in seconds (multiples of 1/fps);
    those keys come back as windows ``(B, len(deltas), *shape)`` clamped to the episode,
    with ``<key>_is_pad`` marking clamped positions. ``episodes`` restricts the dataset to
    those episode indices.
    """

    def __init__(
        self,
        root: str | Path,
        delta_timestamps: dict[str, list[float]] | None = None,
        episodes: list[int] | None = None,
    ) -> None:
        self.root = Path(root)
        self.info = _read_info(self.root)
        self.fps = int(self.info["fps"])
        self.features: dict[str, dict[str, Any]] = self.info["features"]
        self.data_keys = [
            key
            for key, ft in self.features.items()
            if key not in META_COLUMNS and ft.get("dtype") in NUMERIC_DTYPES
        ]
        self.stats = _read_stats(self.root, self.features, self.data_keys)
        self.episodes = episodes
        self._load(_episode_files(self.root, self.info, episodes))
        self.delta_timestamps = delta_timestamps or {}
        self._delta_offsets = self._frame_offsets(self.delta_timestamps)

    def _load(self, paths: list[Path]) -> None:
        columns = {key: self.features[key] for key in self.data_keys}
        columns.update({key: {"shape": []} for key in META_COLUMNS})
        dtypes = dict.fromkeys(self.data_keys, np.dtype(np.float32)) | META_COLUMNS
        parts: dict[str, list[np.ndarray]] = {key: [] for key in columns}
        for path in paths:
            try:
                names = set(pq.read_schema(path).names)
            except (pa.ArrowInvalid, OSError) as exc:
                raise DatasetError(f"{path}: not a readable parquet file: {exc}.") from exc
            missing = sorted((set(self.features) | set(META_COLUMNS)) - names)
            if missing:
                raise DatasetError(
                    f"{path}: columns {missing} are missing from this data file (declared in "
                    "meta/info.json features or required by v3.0). Fix meta/info.json or "
                    "download the dataset again."
                )
            table = pq.read_table(path, columns=list(columns))
            for key, ft in columns.items():
                shape = tuple(ft["shape"])
                parts[key].append(_column_to_numpy(table[key], shape, dtypes[key], path, key))
        arrays = {key: np.concatenate(chunks) for key, chunks in parts.items()}

        if self.episodes is not None:
            keep = np.isin(arrays["episode_index"], self.episodes)
            absent = sorted(set(self.episodes) - set(np.unique(arrays["episode_index"]).tolist()))
            if absent:
                raise DatasetError(
                    f"{self.root}: episodes {absent} are not in the dataset "
                    f"({self.info.get('total_episodes', '?')} episodes)."
                )
            arrays = {key: value[keep] for key, value in arrays.items()}
        order = np.argsort(arrays["index"], kind="stable")
        if not np.array_equal(order, np.arange(len(order))):
            arrays = {key: value[order] for key, value in arrays.items()}
        self._arrays = {key: np.ascontiguousarray(value) for key, value in arrays.items()}

        episode_index = self._arrays["episode_index"]
        starts = np.flatnonzero(np.diff(episode_index, prepend=episode_index[:1] - 1))
        if len(np.unique(episode_index)) != len(starts):
            raise DatasetError(
                f"{self.root / 'data'}: an episode's frames are not contiguous in index order; "
                "the data files are corrupt."
            )
        ends = np.append(starts[1:], len(episode_index))
        lengths = ends - starts
        self.num_frames = len(episode_index)
        self.num_episodes = len(starts)
        # Per-row [from, to) bounds (row positions) of the row's episode.
        self._ep_from = np.repeat(starts, lengths)
        self._ep_to = np.repeat(ends, lengths)

    def _frame_offsets(self, delta_timestamps: dict[str, list[float]]) -> dict[str, np.ndarray]:
        offsets = {}
        for key, deltas in delta_timestamps.items():
            if key not in self._arrays or key in META_COLUMNS:
                raise DatasetError(
                    f"delta_timestamps key {key!r} is not a numeric feature of {self.root}; "
                    f"choose among {self.data_keys}."
                )
            seconds = np.asarray(deltas, dtype=np.float64)
            frames = np.round(seconds * self.fps)
            bad = np.abs(seconds - frames / self.fps) > DELTA_TOLERANCE_S
            if seconds.ndim != 1 or seconds.size == 0 or bad.any():
                raise DatasetError(
                    f"delta_timestamps[{key!r}] = {list(deltas)} must be a non-empty list of "
                    f"multiples of 1/fps = {1 / self.fps:g} s (fps {self.fps} from "
                    f"{self.root / DATASET_INFO}), each within {DELTA_TOLERANCE_S} s."
                )
            offsets[key] = frames.astype(np.int64)
        return offsets

    def __len__(self) -> int:
        return self.num_frames

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        if not -self.num_frames <= idx < self.num_frames:
            raise IndexError(f"index {idx} out of range for {self.num_frames} frames")
        return {key: value[0] for key, value in self.get_batch([idx % self.num_frames]).items()}

    def get_batch(self, indices: np.ndarray | Sequence[int]) -> dict[str, torch.Tensor]:
        """Gather frames ``indices`` (row positions in ``[0, len(self))``) into batched tensors."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1:
            raise IndexError(f"indices must be 1-D, got shape {list(idx.shape)}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_frames):
            raise IndexError(
                f"indices must lie in [0, {self.num_frames}), got [{idx.min()}, {idx.max()}]"
            )
        batch: dict[str, torch.Tensor] = {}
        lo = self._ep_from[idx][:, None]
        hi = self._ep_to[idx][:, None] - 1
        for key, array in self._arrays.items():
            offsets = self._delta_offsets.get(key)
            if offsets is None:
                batch[key] = torch.from_numpy(array[idx])
                continue
            wanted = idx[:, None] + offsets[None, :]
            batch[key] = torch.from_numpy(array[np.clip(wanted, lo, hi)])
            batch[f"{key}_is_pad"] = torch.from_numpy((wanted < lo) | (wanted > hi))
        return batch
