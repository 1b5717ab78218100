"""Reader for LeRobot v3.0 datasets: numeric features and cameras (mp4 videos or PNG images).

Every parquet file is read once at open into contiguous numpy arrays; ``get_batch`` then
gathers a whole batch (including delta-timestamp windows) with numpy fancy indexing, and
decodes its camera frames batch-wise (``cameras.py``) into contiguous uint8 NCHW buffers (the
same layout on every backend and device, see ``_contiguous``). uint8 frames become float32 in
[0, 1] (and are augmented) in ``prepare_cameras``, which runs after the batch is assembled: in
the loader for CPU training, on the GPU after the copy otherwise.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lerobot_pipe.configs.train import ImageTransformsConfig
from lerobot_pipe.constants import (
    DATASET_CODEBASE_VERSION,
    DATASET_EPISODES_GLOB,
    DATASET_INFO,
    DATASET_STATS,
    DATASET_TASKS,
    DATASET_VIDEO_PATH,
)
from lerobot_pipe.datasets.cameras import CameraError, ImageFrames, VideoFrames, frame_shape
from lerobot_pipe.datasets.transforms import ImageTransforms
from lerobot_pipe.datasets.video import ReaderCache, VideoError, resolve_video_backend
from lerobot_pipe.utils.hub_http import redact, with_retries

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
# LeRobot's --tolerance_s default: how far (s) a decoded frame's time may sit from the requested
# one, and a delta timestamp from a multiple of 1/fps.
DEFAULT_TOLERANCE_S = 1e-4
DOWNLOAD_PATTERNS = ["meta/**", "data/**", "*.md", "*.json"]
# What --dataset.use_imagenet_stats puts in place of the camera mean/std (LeRobot's values).
IMAGENET_STATS = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
# Key frame interval assumed when meta/info.json does not give one (LeRobot's encoder default).
DEFAULT_GOP = 2


class DatasetError(ValueError):
    """A dataset on disk (or its location) is unusable; the message names the file and the fix."""


def resolve_dataset_root(
    root: str | Path | None,
    repo_id: str | None,
    revision: str | None = None,
    episodes: list[int] | None = None,
) -> Path:
    """Return a local folder holding ``meta/info.json``, downloading from the Hub if needed.

    With ``root`` already holding a dataset it is returned as is (after fetching, when
    ``repo_id`` is set, the video files it lacks). Otherwise, when ``repo_id`` is set, the
    dataset's metadata and data files are downloaded into ``root`` or, without ``root``, into
    the Hugging Face cache, and then the video files of ``episodes`` (all episodes when None),
    no others. huggingface_hub resumes interrupted downloads and skips files already there.
    """
    if root is None and repo_id is None:
        raise DatasetError("No dataset given: pass --dataset.root or --dataset.repo_id.")
    if root is not None:
        root = Path(root).expanduser()
        if (root / DATASET_INFO).is_file():
            if repo_id is not None:
                missing = [
                    p for p in needed_video_files(root, episodes) if not (root / p).is_file()
                ]
                if missing:
                    _download(repo_id, revision, root, _exact(missing), "video files")
            return root
        if repo_id is None:
            raise DatasetError(
                f"{root / DATASET_INFO}: not found, so {root} is not a LeRobot dataset. "
                "Point --dataset.root at a dataset folder (the one holding meta/ and data/), "
                "or also pass --dataset.repo_id to download it there."
            )
    path = _download(repo_id, revision, root, DOWNLOAD_PATTERNS, "dataset")
    if not (path / DATASET_INFO).is_file():
        raise DatasetError(
            f"{path / DATASET_INFO}: not found after downloading repo_id={repo_id!r} "
            f"(revision={revision!r}); the repository is not a LeRobot v3.0 dataset."
        )
    videos = needed_video_files(path, episodes)
    if videos:
        path = _download(repo_id, revision, root, DOWNLOAD_PATTERNS + _exact(videos), "video files")
    return path


def _download(
    repo_id: str, revision: str | None, root: Path | None, patterns: list[str], what: str
) -> Path:
    import huggingface_hub

    where = f"into {root}" if root is not None else "into the Hugging Face cache"
    try:
        downloaded = with_retries(
            lambda: huggingface_hub.snapshot_download(
                repo_id,
                repo_type="dataset",
                revision=revision,
                local_dir=root,
                allow_patterns=patterns,
            ),
            what=f"downloading {what} of {repo_id}",
        )
    except Exception as exc:
        missing = (
            f"{root} does not hold a dataset (no {DATASET_INFO}) and "
            if root is not None and not (root / DATASET_INFO).is_file()
            else ""
        )
        raise DatasetError(
            f"{missing}downloading {what} of dataset repo_id={repo_id!r} (revision={revision!r}) "
            f"{where} failed: {type(exc).__name__}: {redact(str(exc)).rstrip('.')}. Check the "
            "repo_id, your network and HF_TOKEN, or pass --dataset.root pointing at a local copy."
        ) from exc
    return Path(downloaded)


def needed_video_files(root: Path, episodes: list[int] | None = None) -> list[str]:
    """Paths (relative to ``root``) of the mp4 files the ``episodes`` need, from the metadata."""
    info = _read_info(root)
    video_keys = [k for k, ft in info["features"].items() if ft.get("dtype") == "video"]
    if not video_keys:
        return []
    table = _read_episodes(root, episodes)
    if table is None:
        raise DatasetError(
            f"{root / 'meta/episodes'}: no episodes metadata, so the video files of cameras "
            f"{video_keys} cannot be located. Download the dataset's meta/ folder again."
        )
    template = info.get("video_path") or DATASET_VIDEO_PATH
    paths = set()
    for key in video_keys:
        try:
            pairs = zip(
                table[f"videos/{key}/chunk_index"].tolist(),
                table[f"videos/{key}/file_index"].tolist(),
                strict=True,
            )
        except KeyError as exc:
            raise DatasetError(
                f"{root / 'meta/episodes'}: column {exc.args[0]!r} is missing; the video files "
                f"of camera {key!r} cannot be located. Download the dataset again."
            ) from None
        paths.update(template.format(video_key=key, chunk_index=c, file_index=f) for c, f in pairs)
    return sorted(paths)


def _exact(paths: list[str]) -> list[str]:
    """Download patterns (fnmatch) that match exactly these paths."""
    return [glob.escape(path) for path in paths]


def _read_episodes(root: Path, episodes: list[int] | None) -> dict[str, np.ndarray] | None:
    """meta/episodes columns (scalar ones) of ``episodes``, sorted by episode; None if absent."""
    files = sorted(root.glob(DATASET_EPISODES_GLOB))
    if not files:
        return None
    parts = []
    for path in files:
        try:
            schema = pq.read_schema(path)
            scalar = [f.name for f in schema if not pa.types.is_nested(f.type)]
            parts.append(pq.read_table(path, columns=scalar))
        except (pa.ArrowInvalid, OSError) as exc:
            raise DatasetError(
                f"{path}: not a readable parquet file: {exc}. The episodes metadata is "
                "corrupt; download the dataset again."
            ) from exc
    table = pa.concat_tables(parts, promote_options="default")
    columns = {name: table[name].to_numpy() for name in table.column_names}
    if "episode_index" not in columns:
        raise DatasetError(f"{files[0]}: column 'episode_index' is missing; download it again.")
    keep = np.ones(len(columns["episode_index"]), bool)
    if episodes is not None:
        keep = np.isin(columns["episode_index"], episodes)
    order = np.argsort(columns["episode_index"][keep], kind="stable")
    return {name: values[keep][order] for name, values in columns.items()}


def _read_meta_json(path: Path, if_missing: str) -> dict[str, Any]:
    """A metadata file's JSON object; DatasetError naming the file (and ``if_missing``, what a
    missing one means) otherwise."""
    if not path.is_file():
        raise DatasetError(f"{path}: not found{if_missing}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}. "
            "Fix the file or download the dataset again."
        ) from exc
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: expected a JSON object, found {type(data).__name__}.")
    return data


def _read_info(root: Path) -> dict[str, Any]:
    path = root / DATASET_INFO
    info = _read_meta_json(
        path,
        ". --dataset.root must be a LeRobot v3.0 dataset folder "
        "(holding meta/info.json, meta/stats.json and data/).",
    )
    version = info.get("codebase_version")
    if version != DATASET_CODEBASE_VERSION:
        raise DatasetError(
            f"{path}: codebase_version is {version!r}, only {DATASET_CODEBASE_VERSION!r} is "
            "supported. Convert the dataset with LeRobot's v3.0 conversion script first."
        )
    for key in ("fps", "features"):
        if key not in info:
            raise DatasetError(f"{path}: required key {key!r} is missing.")
    return info


def _read_tasks(root: Path) -> list[str] | None:
    """The task strings by task_index (``meta/tasks.parquet``: the task as the index, column
    ``task_index``); None for a dataset without the file."""
    path = root / DATASET_TASKS
    if not path.is_file():
        return None
    try:
        table = pq.read_table(path).to_pandas()
    except (pa.ArrowInvalid, OSError) as exc:
        raise DatasetError(f"{path}: not a readable parquet file: {exc}.") from exc
    if "task_index" not in table.columns:
        raise DatasetError(f"{path}: no task_index column (columns: {list(table.columns)})")
    tasks = table["task"] if "task" in table.columns else table.index.to_series()
    by_index = dict(zip(table["task_index"].astype(int).tolist(), map(str, tasks), strict=True))
    if sorted(by_index) != list(range(len(by_index))):
        raise DatasetError(f"{path}: task_index values must be 0..{len(by_index) - 1}")
    return [by_index[i] for i in range(len(by_index))]


def _read_stats(
    root: Path,
    features: dict[str, dict[str, Any]],
    data_keys: list[str],
    camera_shapes: dict[str, tuple[int, int, int]],
) -> dict[str, dict[str, np.ndarray]]:
    path = root / DATASET_STATS
    raw = _read_meta_json(
        path,
        "; normalisation needs per-feature statistics. "
        "Recompute them with LeRobot or download the dataset again.",
    )
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
    for key, (channels, _, _) in camera_shapes.items():
        for name in REQUIRED_STATS:
            value = stats.get(key, {}).get(name)
            if value is not None and value.size == channels:
                stats[key][name] = value.reshape(channels, 1, 1)
            elif value is not None:
                raise DatasetError(
                    f"{path}: camera {key}.{name} has shape {list(value.shape)}; per-channel "
                    f"statistics are shaped [{channels}, 1, 1]. Recompute the dataset statistics."
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


def read_metadata(dataset: Any, use_imagenet_stats: bool) -> None:
    """Set what a dataset's ``meta/`` under ``dataset.root`` says on ``dataset``: ``info``,
    ``fps``, ``features``, the ``data_keys`` / ``video_keys`` / ``image_keys`` /
    ``camera_keys``, ``camera_shapes``, ``stats`` (ImageNet's for the cameras when
    ``use_imagenet_stats``, as LeRobot) and ``tasks``. The map-style and the streaming dataset
    read their metadata through this one function."""
    root = Path(dataset.root)
    dataset.info = _read_info(root)
    dataset.fps = int(dataset.info["fps"])
    features: dict[str, dict[str, Any]] = dataset.info["features"]
    dataset.features = features
    dataset.data_keys = [
        key
        for key, ft in features.items()
        if key not in META_COLUMNS and ft.get("dtype") in NUMERIC_DTYPES
    ]
    dataset.video_keys = [k for k, ft in features.items() if ft.get("dtype") == "video"]
    dataset.image_keys = [k for k, ft in features.items() if ft.get("dtype") == "image"]
    dataset.camera_keys = [k for k, ft in features.items() if ft.get("dtype") in CAMERA_DTYPES]
    info_path = root / DATASET_INFO
    try:
        dataset.camera_shapes = {
            key: frame_shape(key, features[key], info_path) for key in dataset.camera_keys
        }
    except CameraError as exc:
        raise DatasetError(str(exc)) from None
    stats = _read_stats(root, features, dataset.data_keys, dataset.camera_shapes)
    if use_imagenet_stats:
        for key in dataset.camera_keys:
            stats.setdefault(key, {}).update(
                {
                    name: np.asarray(value, dtype=np.float32).reshape(-1, 1, 1)
                    for name, value in IMAGENET_STATS.items()
                }
            )
    dataset.stats = stats
    dataset.tasks = _read_tasks(root)


class LeRobotDataset:
    """A LeRobot v3.0 dataset: numeric features held in memory, camera frames decoded per batch.

    ``delta_timestamps`` maps a feature key (numeric or camera) to offsets in seconds (multiples
    of 1/fps); those keys come back as windows ``(B, len(deltas), ...)`` clamped to the episode,
    with ``<key>_is_pad`` marking clamped positions. ``episodes`` restricts the dataset to those
    episode indices. Cameras come back as contiguous float32 ``(B, [T,] 3, H, W)`` in [0, 1], as
    LeRobot's do. ``video_backend`` (``torchcodec`` or ``pyav``; the other one when it does not
    load here), ``tolerance_s``, ``image_transforms`` and ``use_imagenet_stats`` are LeRobot's
    options of the same names. Every video file the episodes need is checked when the dataset opens.
    ``video_sources`` maps a video file's path to a new file object to decode it from instead
    (see :class:`~lerobot_pipe.datasets.video.ReaderCache`; the streaming dataset's byte ranges).
    """

    def __init__(
        self,
        root: str | Path,
        delta_timestamps: dict[str, list[float]] | None = None,
        episodes: list[int] | None = None,
        *,
        video_backend: str | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        image_transforms: ImageTransformsConfig | None = None,
        use_imagenet_stats: bool = True,
        video_sources: Callable[[Path], Any] | None = None,
    ) -> None:
        self.root = Path(root)
        if not tolerance_s > 0:
            raise DatasetError(f"--tolerance_s={tolerance_s} must be positive")
        self.tolerance_s = tolerance_s
        read_metadata(self, use_imagenet_stats)
        self.episodes = episodes
        self.image_transforms = ImageTransforms(image_transforms or ImageTransformsConfig())
        self._images: dict[str, pa.Array] = {}
        self._load(_episode_files(self.root, self.info, episodes))
        self.delta_timestamps = delta_timestamps or {}
        self._delta_offsets = self._frame_offsets(self.delta_timestamps)
        self.video_backend = None
        self._cameras: dict[str, VideoFrames | ImageFrames] = {
            key: ImageFrames(key, self.camera_shapes[key], self._images.pop(key))
            for key in self.image_keys
        }
        if self.video_keys:
            try:
                self.video_backend = resolve_video_backend(video_backend)
            except VideoError as exc:
                raise DatasetError(str(exc)) from None
            self._readers = ReaderCache(self.video_backend, sources=video_sources)
            self._open_videos()

    def _load(self, paths: list[Path]) -> None:
        columns = {key: self.features[key] for key in self.data_keys}
        columns.update({key: {"shape": []} for key in META_COLUMNS})
        dtypes = dict.fromkeys(self.data_keys, np.dtype(np.float32)) | META_COLUMNS
        parts: dict[str, list[np.ndarray]] = {key: [] for key in columns}
        images: dict[str, list[pa.Array]] = {key: [] for key in self.image_keys}
        parquet_keys = set(self.features) - set(self.video_keys)
        for path in paths:
            try:
                names = set(pq.read_schema(path).names)
            except (pa.ArrowInvalid, OSError) as exc:
                raise DatasetError(f"{path}: not a readable parquet file: {exc}.") from exc
            missing = sorted((parquet_keys | set(META_COLUMNS)) - names)
            if missing:
                raise DatasetError(
                    f"{path}: columns {missing} are missing from this data file (declared in "
                    "meta/info.json features or required by v3.0). Fix meta/info.json or "
                    "download the dataset again."
                )
            table = pq.read_table(path, columns=list(columns) + self.image_keys)
            for key, ft in columns.items():
                shape = tuple(ft["shape"])
                parts[key].append(_column_to_numpy(table[key], shape, dtypes[key], path, key))
            for key in self.image_keys:
                images[key].append(_image_bytes(table[key], path, key))
        arrays = {key: np.concatenate(chunks) for key, chunks in parts.items()}
        image_arrays = {key: pa.concat_arrays(chunks) for key, chunks in images.items()}

        keep = np.ones(len(arrays["index"]), bool)
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
        rows = np.flatnonzero(keep)[order]
        self._images = {key: value.take(pa.array(rows)) for key, value in image_arrays.items()}

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
        self._episode_bounds = (starts, ends)
        # Per-row [from, to) bounds (row positions) of the row's episode.
        self._ep_from = np.repeat(starts, lengths)
        self._ep_to = np.repeat(ends, lengths)

    def _open_videos(self) -> None:
        table = _read_episodes(self.root, self.episodes)
        if table is None:
            raise DatasetError(
                f"{self.root / 'meta/episodes'}: no episodes metadata, so the video files of "
                f"cameras {self.video_keys} cannot be located. Download the dataset's meta/ "
                "folder again."
            )
        row_episode = np.searchsorted(table["episode_index"], self._arrays["episode_index"])
        row_episode = np.minimum(row_episode, len(table["episode_index"]) - 1)
        if not np.array_equal(table["episode_index"][row_episode], self._arrays["episode_index"]):
            raise DatasetError(
                f"{self.root / 'meta/episodes'}: episodes "
                f"{sorted(set(self._arrays['episode_index'].tolist()) - set(table['episode_index'].tolist()))} "
                "of the data files are not listed; the metadata is incomplete. Download it again."
            )
        template = self.info.get("video_path") or DATASET_VIDEO_PATH
        for key in self.video_keys:
            gop = (self.features[key].get("info") or {}).get("video.g") or DEFAULT_GOP
            try:
                self._cameras[key] = VideoFrames(
                    self.root,
                    key,
                    self.camera_shapes[key],
                    template,
                    table,
                    row_episode,
                    self._arrays["timestamp"],
                    self.tolerance_s,
                    self._readers,
                    int(gop),
                )
            except CameraError as exc:
                raise DatasetError(str(exc)) from None

    def _frame_offsets(self, delta_timestamps: dict[str, list[float]]) -> dict[str, np.ndarray]:
        offsets = {}
        for key, deltas in delta_timestamps.items():
            if (key not in self._arrays and key not in self.camera_keys) or key in META_COLUMNS:
                raise DatasetError(
                    f"delta_timestamps key {key!r} is not a numeric or camera feature of "
                    f"{self.root}; choose among {self.data_keys + self.camera_keys}."
                )
            seconds = np.asarray(deltas, dtype=np.float64)
            frames = np.round(seconds * self.fps)
            bad = np.abs(seconds - frames / self.fps) > self.tolerance_s
            if seconds.ndim != 1 or seconds.size == 0 or bad.any():
                raise DatasetError(
                    f"delta_timestamps[{key!r}] = {list(deltas)} must be a non-empty list of "
                    f"multiples of 1/fps = {1 / self.fps:g} s (fps {self.fps} from "
                    f"{self.root / DATASET_INFO}), each within tolerance_s={self.tolerance_s} s."
                )
            offsets[key] = frames.astype(np.int64)
        return offsets

    @property
    def episode_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Each episode's ``[from, to)`` row positions (the positions ``get_batch`` takes)."""
        return self._episode_bounds

    @property
    def episode_index(self) -> np.ndarray:
        """Each row's ``episode_index`` (read-only view)."""
        view = self._arrays["episode_index"].view()
        view.flags.writeable = False
        return view

    @property
    def task_index(self) -> np.ndarray:
        """Each row's ``task_index`` (read-only view)."""
        view = self._arrays["task_index"].view()
        view.flags.writeable = False
        return view

    def __len__(self) -> int:
        return self.num_frames

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        if not -self.num_frames <= idx < self.num_frames:
            raise IndexError(f"index {idx} out of range for {self.num_frames} frames")
        return {key: value[0] for key, value in self.get_batch([idx % self.num_frames]).items()}

    def get_batch(
        self,
        indices: np.ndarray | Sequence[int],
        *,
        sample_keys: np.ndarray | None = None,
        raw_cameras: bool = False,
        pin_memory: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Gather frames ``indices`` (row positions in ``[0, len(self))``) into batched tensors.

        Cameras come back finished (``prepare_cameras``) unless ``raw_cameras``: then as uint8,
        to be finished after a copy to the GPU (4x fewer bytes to move). ``sample_keys`` seed
        the image transforms per sample (see ``prepare_cameras``); ``pin_memory`` allocates the
        camera buffers in page-locked memory for an asynchronous copy to a CUDA device.
        """
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
        for key, camera in self._cameras.items():
            offsets = self._delta_offsets.get(key)
            rows = idx[:, None] if offsets is None else idx[:, None] + offsets[None, :]
            if offsets is not None:
                batch[f"{key}_is_pad"] = torch.from_numpy((rows < lo) | (rows > hi))
            rows = np.clip(rows, lo, hi)
            try:
                frames = camera.read(rows.reshape(-1))
            except CameraError as exc:
                raise DatasetError(str(exc)) from None
            shape = (len(idx),) if offsets is None else (len(idx), len(offsets))
            batch[key] = _contiguous(frames, pin_memory).view(*shape, *self.camera_shapes[key])
        # Each frame's task string, as LeRobot's items carry it (a list, not a tensor).
        task_index = self._arrays["task_index"][idx]
        if self.tasks is not None and idx.size:
            if task_index.min() < 0 or task_index.max() >= len(self.tasks):
                raise DatasetError(
                    f"{self.root / DATASET_TASKS}: holds {len(self.tasks)} tasks, a frame has "
                    f"task_index {int(task_index.max())}"
                )
            batch["task"] = [self.tasks[i] for i in task_index.tolist()]
        if not raw_cameras:
            batch = self.prepare_cameras(batch, sample_keys)
        return batch

    def prepare_cameras(
        self, batch: dict[str, torch.Tensor], sample_keys: np.ndarray | None = None
    ) -> dict[str, torch.Tensor]:
        """uint8 camera frames -> float32 in [0, 1], then the image transforms, on their device.

        Each sample's augmentation is drawn from its ``sample_keys`` entry (the loader passes
        the sample's position in the sampler's stream, so a resumed run repeats it); without
        keys they come from torch's global RNG, which checkpoints restore.
        """
        if not self.camera_keys:
            return batch
        out = dict(batch)
        if self.image_transforms.enabled and sample_keys is None:
            size = len(next(iter(batch.values())))
            sample_keys = torch.randint(0, 2**62, (size,), dtype=torch.int64).numpy()
        for stream, key in enumerate(self.camera_keys):
            frames = batch[key]
            if frames.dtype == torch.uint8:
                frames = frames.to(torch.float32).div_(255.0)
            if self.image_transforms.enabled:
                frames = self.image_transforms(frames, np.asarray(sample_keys), stream)
            out[key] = frames
        return out


def _contiguous(frames: torch.Tensor, pin_memory: bool) -> torch.Tensor:
    """uint8 frames as one contiguous NCHW buffer, page-locked when ``pin_memory``.

    The policy gets camera batches in the layout of its (NCHW) weights, as LeRobot's loader
    hands them, whatever the decoder returned: torchcodec's ``(n, 3, H, W)`` frames are a
    permuted view of the NHWC frames it decodes, and on a CPU the backbone's convolutions run
    12-18 % slower on such channels-last input (ResNet-18 forward + backward at 96x96,
    bench/bench_memory_format.py, which also measures it on CUDA in bf16 when a GPU is lent;
    until then GPUs get the same NCHW). The copy is made here, on uint8 (a quarter of the float
    bytes), fused with the pinning copy when there is one; frames already contiguous (PyAV's,
    PNG images', those of several files gathered into one buffer) are not copied."""
    if frames.is_contiguous() and not pin_memory:
        return frames
    out = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=pin_memory)
    return out.copy_(frames)


def _image_bytes(column: pa.ChunkedArray, path: Path, key: str) -> pa.Array:
    """The encoded bytes of an image column (HF datasets' Image struct ``{bytes, path}``)."""
    array = column.combine_chunks()
    if pa.types.is_struct(array.type) and array.type.get_field_index("bytes") >= 0:
        return array.field("bytes")
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        return array
    raise DatasetError(
        f"{path}: image column {key!r} has type {array.type}; expected the struct "
        "{bytes, path} LeRobot writes (images embedded in the parquet)."
    )
