"""Where a LeRobot v3.0 dataset is (a local folder, or downloaded from the Hub) and what its
``meta/`` says: info, features, stats, tasks and the episodes' files, read the same way by the
map-style and the streaming dataset (:func:`read_metadata`)."""

from __future__ import annotations

import glob
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_pipe.constants import (
    DATASET_CODEBASE_VERSION,
    DATASET_EPISODES_GLOB,
    DATASET_INFO,
    DATASET_STATS,
    DATASET_TASKS,
    DATASET_VIDEO_PATH,
)
from lerobot_pipe.datasets.cameras import CameraError, frame_shape
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
DOWNLOAD_PATTERNS = ["meta/**", "data/**", "*.md", "*.json"]
# What --dataset.use_imagenet_stats puts in place of the camera mean/std (LeRobot's values).
IMAGENET_STATS = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


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
    table = read_episodes(root, episodes)
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


def episode_first_tasks(root: Path, episodes: Sequence[int]) -> dict[int, str]:
    """Each episode's first task string (``meta/episodes``' ``tasks`` column; "" when empty)."""
    tasks: dict[int, str] = {}
    wanted = set(episodes)
    for path in sorted(Path(root).glob(DATASET_EPISODES_GLOB)):
        table = pq.read_table(path, columns=["episode_index", "tasks"])
        for episode, names in zip(
            table["episode_index"].to_pylist(), table["tasks"].to_pylist(), strict=True
        ):
            if episode in wanted:
                tasks[episode] = names[0] if names else ""
    return tasks


def read_episodes(root: Path, episodes: list[int] | None) -> dict[str, np.ndarray] | None:
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
    # Only the statistics present are checked here: which ones must exist depends on the policy
    # (its inputs and outputs, their normalization modes), so the normalizer asks for them
    # (training/data.py: make_processors), as LeRobot's does; e.g. next.done may have none.
    for key in data_keys:
        shape = tuple(features[key]["shape"])
        for name in REQUIRED_STATS:
            if name in stats.get(key, {}) and stats[key][name].shape != shape:
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


def episode_files(root: Path, info: dict[str, Any], episodes: list[int] | None) -> list[Path]:
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
