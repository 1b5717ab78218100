"""A LeRobot v3.0 dataset read from the Hub as training consumes it (``--dataset.streaming=true``).

The metadata (``meta/``: info, stats, tasks, episodes) is fetched first, at the commit the
revision points to when the run starts (:mod:`~lerobot_pipe.datasets.hub_revision`; the sha is
saved in every checkpoint, so a resume reads the same bytes). It gives the dataset its features,
statistics and episode bounds without any data file. A sample is then built where the
map-style path builds it: :meth:`StreamingLeRobotDataset.get_batch` groups the requested rows by
file group (the episodes that live in the same data and video files), opens each group as a
map-style :class:`LeRobotDataset` of those episodes over a view folder whose files are links
into a :class:`HubFileCache` (fetched when first needed, pinned while the group is open,
evicted after; video files are not fetched whole but decoded from a :class:`~.remote_files.BlockFile`, the
cached byte-range blocks the decoder reads), and asks it for the rows. Windows and padding
masks at episode edges, camera decoding and its checks, ``task`` strings and image transforms are
therefore the map-style code's, and row positions are the map-style dataset's: position ``i``
here is the sample ``LeRobotDataset(...)[i]`` over the same episodes. Which rows are read when is
the sampler's business (:mod:`lerobot_pipe.datasets.stream_sampler`).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from lerobot_pipe.configs.train import ImageTransformsConfig
from lerobot_pipe.constants import DATASET_VIDEO_PATH
from lerobot_pipe.datasets.hub_files import DEFAULT_BLOCK_BYTES, HubFileCache
from lerobot_pipe.datasets.hub_revision import fetch_metadata, resolve_revision
from lerobot_pipe.datasets.lerobot_dataset import (
    DEFAULT_GOP,
    DEFAULT_TOLERANCE_S,
    FrameRows,
    LeRobotDataset,
)
from lerobot_pipe.datasets.metadata import (
    DatasetError,
    episode_first_tasks,
    read_episodes,
    read_metadata,
)
from lerobot_pipe.datasets.mp4_index import frame_ranges
from lerobot_pipe.datasets.prefetch import BackgroundCalls
from lerobot_pipe.datasets.remote_files import BlockFile, ByteRanges, RemoteFile, parquet_metadata
from lerobot_pipe.datasets.transforms import ImageTransforms

log = logging.getLogger(__name__)

DEFAULT_CACHE_MB = 2048  # --dataset.streaming_cache_mb's default
# File groups (the episodes that live in the same data and video files) kept open, their
# decoders and their files pinned, after their last read: at least those a shuffle buffer spans,
# or the stream reopens them batch after batch. Idle groups are also closed, oldest first, when
# the cache needs their files' room.
DEFAULT_OPEN_GROUPS = 64
_FILES_DIR = "files"
_ROWS_DIR = ".rows"  # in the file cache: each open group's rows of its data file
_VIEWS_DIR = "views"
_META_DIR = "meta"
# Episodes whose read-ahead was asked for recently: not asked for again while they are here.
_READ_AHEAD_MEMORY = 1024


def check_same_revision(revision: str, repo_id: str, group=None) -> None:
    """Collective: fail on every rank, naming the shas, unless every rank of ``group`` (the
    default process group when None; nothing to check without one) opened ``repo_id`` at the
    commit ``revision``. Each rank resolves the revision on its own before the process group
    exists, so a commit pushed in between would otherwise have the ranks read different bytes."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    shas: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(shas, revision, group=group)
    if len(set(shas)) > 1:
        by_sha: dict[str, list[int]] = {}
        for rank, sha in enumerate(shas):
            by_sha.setdefault(sha, []).append(rank)
        seen = "; ".join(f"ranks {ranks} at {sha}" for sha, ranks in by_sha.items())
        raise DatasetError(
            f"streaming dataset {repo_id}: the ranks resolved the revision to different commits "
            f"({seen}): a commit was pushed while the run started. Rerun, or pin the commit with "
            f"--dataset.revision={shas[0]}."
        )


class StreamingLeRobotDataset(FrameRows):
    """The dataset ``repo_id`` on the Hub, with the map-style dataset's row positions and samples.

    ``cache_dir`` holds the metadata, the fetched files (at most ``cache_mb`` MiB of them) and
    the per-episode view folders; it is emptied of a previous run's files at start.
    ``revision`` is a branch, tag or commit; :attr:`revision` is the commit sha it resolved to.
    With ``video_ranges`` (the default) the decoders read each video file through a
    :class:`BlockFile` (its index and the ``block_bytes`` blocks of the frames decoded, fetched
    once into the cache); without, each video file is fetched whole when first needed. With
    ``read_ahead`` (the default; only with ``video_ranges``), the first batch that reads an
    episode has a background thread fetch the bytes of all its frames of every camera (located
    in the container's sample tables, :func:`frame_ranges`) in a few large range requests, so
    that its decoders find the blocks in memory instead of fetching them read by read.
    The other arguments are :class:`LeRobotDataset`'s.
    """

    def __init__(
        self,
        repo_id: str,
        cache_dir: str | Path,
        *,
        revision: str | None = None,
        cache_mb: float = DEFAULT_CACHE_MB,
        delta_timestamps: dict[str, list[float]] | None = None,
        episodes: list[int] | None = None,
        video_backend: str | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        image_transforms: ImageTransformsConfig | None = None,
        use_imagenet_stats: bool = True,
        repo_type: str = "dataset",
        endpoint: str | None = None,
        token: str | None = None,
        open_groups: int = DEFAULT_OPEN_GROUPS,
        video_ranges: bool = True,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        read_ahead: bool = True,
    ) -> None:
        self.repo_id = repo_id
        self.video_ranges = video_ranges
        self.block_bytes = block_bytes
        self.cache_dir = Path(cache_dir)
        self.revision = resolve_revision(
            repo_id, revision, repo_type=repo_type, endpoint=endpoint, token=token
        )
        meta_root = self.cache_dir / _META_DIR / self.revision
        self.root = fetch_metadata(
            repo_id, self.revision, meta_root, repo_type=repo_type, endpoint=endpoint, token=token
        )
        self.files = HubFileCache(
            repo_id,
            self.revision,
            self.cache_dir / _FILES_DIR,
            int(cache_mb * 2**20),
            repo_type=repo_type,
            endpoint=endpoint,
            token=token,
            on_full=self._close_oldest_idle,
        )
        self.tolerance_s = tolerance_s
        read_metadata(self, use_imagenet_stats)
        self.episodes = episodes
        self.delta_timestamps = delta_timestamps or {}
        self.video_backend = video_backend
        self.image_transforms_config = image_transforms or ImageTransformsConfig()
        self.image_transforms = ImageTransforms(self.image_transforms_config)
        self.use_imagenet_stats = use_imagenet_stats
        self._read_episode_table()
        self._open: OrderedDict[int, tuple[LeRobotDataset, list[str]]] = OrderedDict()
        self._in_use: dict[int, int] = {}
        self._open_limit = max(1, open_groups)
        self._lock = threading.Condition(threading.RLock())
        self._opening: set[int] = set()  # groups being opened (outside the lock)
        self._parquet_meta: dict[str, pq.FileMetaData] = {}
        self._read_ahead = BackgroundCalls() if video_ranges and read_ahead else None
        self._read_ahead_asked: OrderedDict[int, None] = OrderedDict()
        self._frame_ranges: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
        # Per video file, the bytes this rank reads (its decoders' bound): the container's parts
        # and the frames of the episodes asked for (get_batch, read-ahead).
        self._ranges: dict[str, ByteRanges] = {}
        self._spanned: set[int] = set()  # episode positions whose frames are in the ranges
        self._index_lock = threading.Lock()
        shutil.rmtree(self.cache_dir / _VIEWS_DIR, ignore_errors=True)

    def _read_episode_table(self) -> None:
        table = read_episodes(self.root, self.episodes)
        where = self.root / "meta/episodes"
        if table is None:
            raise DatasetError(f"{where}: no episodes metadata; the repository is incomplete.")
        needed = ["dataset_from_index", "dataset_to_index", "data/chunk_index", "data/file_index"]
        needed += [
            f"videos/{k}/{c}" for k in self.video_keys for c in ("chunk_index", "file_index")
        ]
        missing = [c for c in needed if c not in table]
        if missing:
            raise DatasetError(f"{where}: columns {missing} are missing; the metadata is corrupt.")
        if self.episodes is not None:
            absent = sorted(set(self.episodes) - set(table["episode_index"].tolist()))
            if absent:
                raise DatasetError(
                    f"{self.repo_id}: episodes {absent} are not in the dataset "
                    f"({self.info.get('total_episodes', '?')} episodes)."
                )
        order = np.argsort(table["dataset_from_index"], kind="stable")
        self._table = {name: values[order] for name, values in table.items()}
        lengths = (self._table["dataset_to_index"] - self._table["dataset_from_index"]).astype(
            np.int64
        )
        ends = np.cumsum(lengths)
        starts = ends - lengths
        self._episode_bounds = (starts, ends)
        self.num_episodes = len(starts)
        self.num_frames = int(ends[-1]) if len(ends) else 0
        self._episode_ids = self._table["episode_index"].astype(np.int64)
        self._row_episode = np.repeat(self._episode_ids, lengths)
        self._row_task = np.repeat(self._first_task_index(), lengths)
        # Episodes that live in the same files open as one map-style dataset (one decoder per
        # file, each batch's frames of a file decoded in one call, as the map-style path does).
        keys = [tuple(self._files_at(pos)) for pos in range(self.num_episodes)]
        self._groups = list(dict.fromkeys(keys))
        group_of = {key: g for g, key in enumerate(self._groups)}
        self._episode_group = np.asarray([group_of[k] for k in keys], np.int64)
        # Each episode's first row within its group's dataset (which sorts rows by index, the
        # order of the episodes here too).
        self._group_offset = np.zeros(self.num_episodes, np.int64)
        for g in range(len(self._groups)):
            members = np.flatnonzero(self._episode_group == g)
            self._group_offset[members] = np.cumsum(lengths[members]) - lengths[members]

    def _first_task_index(self) -> np.ndarray:
        """Each episode's first task (meta/episodes ``tasks``) as a task index: the per-row
        ``task_index`` the held-out split groups by, known before any data file is read."""
        if self.tasks is None:
            return np.zeros(self.num_episodes, np.int64)
        by_name = {task: i for i, task in enumerate(self.tasks)}
        firsts = episode_first_tasks(self.root, self._episode_ids.tolist())
        return np.asarray([by_name.get(firsts.get(e, ""), 0) for e in self._episode_ids], np.int64)

    # ------------------------------------------------------------------ the map-style surface

    def _row_column(self, name: str) -> np.ndarray:
        return {"episode_index": self._row_episode, "task_index": self._row_task}[name]

    def prepare_cameras(
        self, batch: dict[str, torch.Tensor], sample_keys: np.ndarray | None = None
    ) -> dict[str, torch.Tensor]:
        """The map-style finishing step (uint8 -> float32, image transforms)."""
        return LeRobotDataset.prepare_cameras(self, batch, sample_keys)  # type: ignore[arg-type]

    def get_batch(
        self,
        indices: np.ndarray | list[int],
        *,
        sample_keys: np.ndarray | None = None,
        raw_cameras: bool = False,
        pin_memory: bool = False,
    ) -> dict[str, Any]:
        """:meth:`LeRobotDataset.get_batch` of the same rows: each file group's rows from its
        map-style dataset, put back in the requested order."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or not idx.size:
            raise IndexError(f"indices must be a non-empty 1-D array, got shape {list(idx.shape)}")
        if idx.min() < 0 or idx.max() >= self.num_frames:
            raise IndexError(
                f"indices must lie in [0, {self.num_frames}), got [{idx.min()}, {idx.max()}]"
            )
        starts, _ = self._episode_bounds
        position = np.searchsorted(starts, idx, side="right") - 1
        local = idx - starts[position] + self._group_offset[position]
        group = self._episode_group[position]
        if self.video_ranges:  # the decoders' bound, before they read
            self._span_episodes(np.unique(position).tolist())
        if self._read_ahead is not None:
            self._ask_read_ahead(np.unique(position).tolist())
        parts: list[tuple[np.ndarray, dict[str, Any]]] = []
        for g in np.unique(group).tolist():
            where = np.flatnonzero(group == g)
            dataset = self._acquire(g)
            try:
                part = dataset.get_batch(local[where], raw_cameras=True)
            finally:
                self._release(g)
            parts.append((where, part))
        batch = _merge(parts, len(idx))
        if pin_memory:
            batch = {
                k: v.pin_memory() if isinstance(v, torch.Tensor) and k in self.camera_keys else v
                for k, v in batch.items()
            }
        if not raw_cameras:
            batch = self.prepare_cameras(batch, sample_keys)
        return batch

    # ------------------------------------------------------------------ episodes through the cache

    def episode_files(self, episode: int) -> list[str]:
        """Repository paths of the data and video files episode ``episode`` lives in."""
        hits = np.flatnonzero(self._episode_ids == episode)
        if not len(hits):
            raise DatasetError(f"{self.repo_id}: episode {episode} is not in this dataset")
        return self._files_at(int(hits[0]))

    def _files_at(self, pos: int) -> list[str]:
        data_path = self.info["data_path"]
        files = [
            data_path.format(
                chunk_index=int(self._table["data/chunk_index"][pos]),
                file_index=int(self._table["data/file_index"][pos]),
            )
        ]
        template = self.info.get("video_path") or DATASET_VIDEO_PATH
        for key in self.video_keys:
            files.append(
                template.format(
                    video_key=key,
                    chunk_index=int(self._table[f"videos/{key}/chunk_index"][pos]),
                    file_index=int(self._table[f"videos/{key}/file_index"][pos]),
                )
            )
        return files

    def _acquire(self, group: int) -> LeRobotDataset:
        """The open dataset of file group ``group``, in use until :meth:`_release`. A group is
        opened (its files fetched) outside the lock, once: workers needing other, open groups
        go on meanwhile, and a second worker needing the same group waits for the first."""
        with self._lock:
            while group in self._opening:
                self._lock.wait()
            if group in self._open:
                self._in_use[group] = self._in_use.get(group, 0) + 1
                self._open.move_to_end(group)
                return self._open[group][0]
            self._opening.add(group)
            self._close_idle(room=1)  # its files may need the room of an idle group's
        try:
            opened = self._open_group(group)
        except BaseException:
            with self._lock:
                self._opening.discard(group)
                self._lock.notify_all()
            raise
        with self._lock:
            self._open[group] = opened
            self._in_use[group] = self._in_use.get(group, 0) + 1
            self._opening.discard(group)
            self._lock.notify_all()
            self._close_idle()
            return opened[0]

    def _release(self, group: int) -> None:
        with self._lock:
            self._in_use[group] -= 1
            if not self._in_use[group]:
                del self._in_use[group]
            self._close_idle()

    def _close_idle(self, room: int = 0) -> None:
        """Close the least recently used file groups beyond the open limit (less ``room``), not
        those in use."""
        for group in list(self._open):
            if len(self._open) <= self._open_limit - room:
                break
            if group not in self._in_use:
                self._close_group(group)

    def _close_oldest_idle(self) -> bool:
        """Close the least recently used idle file group (the cache needs room); False if none."""
        with self._lock:
            for group in self._open:
                if group not in self._in_use:
                    self._close_group(group)
                    return True
            return False

    def _open_group(self, group: int) -> tuple[LeRobotDataset, list[str]]:
        paths = list(self._groups[group])
        episodes = self._episode_ids[self._episode_group == group].tolist()
        view = self.cache_dir / _VIEWS_DIR / f"group-{group}"
        shutil.rmtree(view, ignore_errors=True)
        (view / "meta").parent.mkdir(parents=True, exist_ok=True)
        os.symlink(self.root / "meta", view / "meta", target_is_directory=True)
        acquired: list[str] = []
        try:
            rows, name = self._episode_rows(group, paths[0], episodes)
            acquired.append(name)
            (view / paths[0]).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(rows, view / paths[0])
            for path in paths[1:] if not self.video_ranges else []:
                local = self.files.acquire(path)
                acquired.append(path)
                (view / path).parent.mkdir(parents=True, exist_ok=True)
                os.symlink(local, view / path)
            dataset = LeRobotDataset(
                view,
                delta_timestamps=self.delta_timestamps or None,
                episodes=episodes,
                video_backend=self.video_backend,
                tolerance_s=self.tolerance_s,
                image_transforms=self.image_transforms_config,
                use_imagenet_stats=self.use_imagenet_stats,
                video_sources=self._block_file if self.video_ranges else None,
            )
        except BaseException:
            for path in acquired:
                self.files.release(path)
            shutil.rmtree(view, ignore_errors=True)
            raise
        return dataset, acquired

    def read_ahead_rows(self, rows: np.ndarray) -> None:
        """Rows the stream will ask for next, in reading order (the sampler's
        :meth:`~lerobot_pipe.datasets.stream_sampler.StreamSampler.rows_ahead`, handed over by
        the prefetcher): their episodes' frames are read ahead, the soonest needed first."""
        if self._read_ahead is None or not len(rows):
            return
        starts, _ = self._episode_bounds
        position = np.searchsorted(starts, np.asarray(rows, np.int64), side="right") - 1
        unique, first = np.unique(position, return_index=True)
        self._ask_read_ahead(unique[np.argsort(first)].tolist())

    def _ask_read_ahead(self, positions: list[int]) -> None:
        """Have the background thread fetch the frames of the episodes at ``positions`` not
        asked for recently."""
        with self._lock:
            new = [p for p in positions if p not in self._read_ahead_asked]
            for p in positions:
                self._read_ahead_asked[p] = None
                self._read_ahead_asked.move_to_end(p)
            while len(self._read_ahead_asked) > _READ_AHEAD_MEMORY:
                self._read_ahead_asked.popitem(last=False)
        for pos in new:
            self._read_ahead.submit(lambda pos=pos: self._read_episode_ahead(pos))

    def _read_episode_ahead(self, pos: int) -> None:
        """Fetch the bytes of the frames of the episode at position ``pos`` in each of its
        video files (in the background thread)."""
        for key, path in zip(self.video_keys, self._files_at(pos)[1:], strict=True):
            try:
                span = self._episode_span(pos, key, path)
                if span is not None:
                    self.files.read_ahead(path, span[0], span[1] - 1, self.block_bytes)
            except DatasetError as exc:
                log.warning("%s: reading ahead failed: %s", path, exc)
                self.files.hand_over(path, exc)

    def _span_episodes(self, positions: list[int]) -> None:
        """Add the frames of the episodes at ``positions`` to their video files' ranges."""
        for pos in positions:
            if pos not in self._spanned:
                for key, path in zip(self.video_keys, self._files_at(pos)[1:], strict=True):
                    self._episode_span(pos, key, path)
                self._spanned.add(pos)

    def _episode_span(self, pos: int, key: str, path: str) -> tuple[int, int] | None:
        """Bytes ``[start, end)`` of the frames of the episode at position ``pos`` in video file
        ``path`` (of camera ``key``), added to the file's ranges; None without sample tables."""
        index = self._index(path)
        column = f"videos/{key}/from_timestamp"
        if index is None or column not in self._table:
            return None
        offsets, sizes = index
        starts, ends = self._episode_bounds
        first = int(round(float(self._table[column][pos]) * self.fps))
        last = min(first + int(ends[pos] - starts[pos]), len(offsets))
        if first >= last:
            return None
        span = int(offsets[first:last].min()), int((offsets[first:last] + sizes[first:last]).max())
        self._ranges[path].add(*span)
        return span

    def _index(self, path: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The byte offsets and sizes of the frames of video file ``path`` (its sample tables,
        read once). The first time, the file's ranges start with what every decoder of it reads:
        the container's parts (before the first frame, after the last), its first frame (the
        demuxer's probe reads it) and its last ``video.g`` frames (the opening check decodes
        the last one, from its key frame)."""
        with self._index_lock:
            if path not in self._frame_ranges:
                f = BlockFile(self.files, path, self.block_bytes, exact=True)
                f.read(64)  # the first box (ftyp) and the next one's header in one request
                index = frame_ranges(f)
                if index is not None:
                    offsets, sizes = index
                    gop = max(
                        int((self.features[k].get("info") or {}).get("video.g") or DEFAULT_GOP)
                        for k in self.video_keys
                    )
                    ranges = ByteRanges()
                    ranges.add(0, int(offsets[0] + sizes[0]))
                    ranges.add(int(offsets[-gop:].min()), self.files.size(path))
                    self._ranges[path] = ranges
                self._frame_ranges[path] = index
            return self._frame_ranges[path]

    def _block_file(self, local: Path) -> BlockFile:
        """The file object a decoder reads view file ``local`` (a video file) from, bounded by
        the file's ranges."""
        path = local.relative_to(self.cache_dir / _VIEWS_DIR).as_posix().split("/", 1)[1]
        self._index(path)
        return BlockFile(self.files, path, self.block_bytes, self._ranges.get(path))

    def _episode_rows(self, group: int, path: str, episodes: list[int]) -> tuple[Path, str]:
        """The rows of ``episodes`` of data file ``path``, read over HTTP ranges (the footer and
        the row groups whose ``episode_index`` statistics may hold them: LeRobot's writer makes a
        row group per episode) into a parquet file of their own in the cache; its local path and
        cache name."""
        with self._lock:
            meta = self._parquet_meta.get(path)
        if meta is None:  # the footer is read once per file (it lists every row group)
            meta = parquet_metadata(self.files, path)
            with self._lock:
                self._parquet_meta[path] = meta
        source = pq.ParquetFile(RemoteFile(self.files, path), metadata=meta)
        column = next(
            (j for j in range(meta.num_columns) if meta.schema.column(j).path == "episode_index"),
            None,
        )
        if column is None:
            raise DatasetError(f"{self.repo_id}: {path}: no episode_index column")
        wanted = np.asarray(episodes)
        row_groups = []
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(column).statistics
            if (
                stats is None
                or not stats.has_min_max
                or ((wanted >= stats.min) & (wanted <= stats.max)).any()
            ):
                row_groups.append(i)
        table = source.read_row_groups(row_groups)
        table = table.filter(
            pc.is_in(table["episode_index"], pa.array(episodes, table["episode_index"].type))
        )
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        name = f"{_ROWS_DIR}/group-{group}/{path}"
        return self.files.store(name, sink.getvalue().to_pybytes()), name

    def _close_group(self, group: int) -> None:
        _, paths = self._open.pop(group)
        for path in paths:
            self.files.release(path)
        shutil.rmtree(self.cache_dir / _VIEWS_DIR / f"group-{group}", ignore_errors=True)

    def wait_read_ahead(self, timeout_s: float = 60.0) -> None:
        """Return once every read-ahead asked for so far has ended."""
        if self._read_ahead is not None:
            self._read_ahead.drain(timeout_s)

    def close(self) -> None:
        """Stop the read-ahead and close every open file group (their files become evictable)."""
        if self._read_ahead is not None:
            self._read_ahead.close()
        with self._lock:
            for group in list(self._open):
                self._close_group(group)


def _merge(parts: list[tuple[np.ndarray, dict[str, Any]]], size: int) -> dict[str, Any]:
    """Batches of disjoint row subsets (``where`` positions in the whole batch) as one batch."""
    if len(parts) == 1:
        return parts[0][1]
    order = np.argsort(np.concatenate([where for where, _ in parts]), kind="stable")
    out: dict[str, Any] = {}
    for key, first in parts[0][1].items():
        if isinstance(first, torch.Tensor):
            joined = torch.cat([part[key] for _, part in parts])
            out[key] = joined[torch.from_numpy(order)].contiguous()
        else:
            joined_list = [item for _, part in parts for item in part[key]]
            out[key] = [joined_list[i] for i in order.tolist()]
    assert all(len(v) == size for v in out.values())
    return out
