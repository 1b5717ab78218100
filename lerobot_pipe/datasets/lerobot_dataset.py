"""Reader for LeRobot v3.0 datasets: numeric features and cameras (mp4 videos or PNG images).

Every parquet file is read once at open into contiguous numpy arrays; ``get_batch`` then
gathers a whole batch (including delta-timestamp windows) with numpy fancy indexing, and
decodes its camera frames batch-wise (``cameras.py``) into contiguous uint8 NCHW buffers (the
same layout on every backend and device, see ``_contiguous``). uint8 frames become float32 in
[0, 1] (and are augmented) in ``prepare_cameras``, which runs after the batch is assembled: in
the loader for CPU training, on the GPU after the copy otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lerobot_pipe.configs.train import ImageTransformsConfig
from lerobot_pipe.constants import (
    DATASET_INFO,
    DATASET_TASKS,
    DATASET_VIDEO_PATH,
)
from lerobot_pipe.datasets.cameras import CameraError, ImageFrames, VideoFrames
from lerobot_pipe.datasets.metadata import (
    META_COLUMNS,
    DatasetError,
    episode_files,
    read_episodes,
    read_metadata,
)
from lerobot_pipe.datasets.transforms import ImageTransforms
from lerobot_pipe.datasets.video import ReaderCache, VideoError, resolve_video_backend

# LeRobot's --tolerance_s default: how far (s) a decoded frame's time may sit from the requested
# one, and a delta timestamp from a multiple of 1/fps.
DEFAULT_TOLERANCE_S = 1e-4
# Key frame interval assumed when meta/info.json does not give one (LeRobot's encoder default).
DEFAULT_GOP = 2


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


class FrameRows:
    """What the map-style and the streaming dataset share, and what the samplers, the trainer and
    the held-out loss use: rows by position (``get_batch``), each row's episode and task, each
    episode's row bounds. A subclass sets ``num_frames`` and ``_episode_bounds`` and gives its
    ``episode_index`` / ``task_index`` columns (:meth:`_row_column`)."""

    num_frames: int
    _episode_bounds: tuple[np.ndarray, np.ndarray]

    def _row_column(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def get_batch(self, indices: np.ndarray | Sequence[int], **options: Any) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def episode_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Each episode's ``[from, to)`` row positions (the positions ``get_batch`` takes)."""
        return self._episode_bounds

    @property
    def episode_index(self) -> np.ndarray:
        """Each row's ``episode_index`` (read-only view)."""
        return _read_only(self._row_column("episode_index"))

    @property
    def task_index(self) -> np.ndarray:
        """Each row's ``task_index`` (read-only view)."""
        return _read_only(self._row_column("task_index"))

    def __len__(self) -> int:
        return self.num_frames

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        if not -self.num_frames <= idx < self.num_frames:
            raise IndexError(f"index {idx} out of range for {self.num_frames} frames")
        return {key: value[0] for key, value in self.get_batch([idx % self.num_frames]).items()}


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class LeRobotDataset(FrameRows):
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
        self._load(episode_files(self.root, self.info, episodes))
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
        table = read_episodes(self.root, self.episodes)
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

    def _row_column(self, name: str) -> np.ndarray:
        return self._arrays[name]

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
