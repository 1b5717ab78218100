"""Camera frames of a LeRobot v3.0 dataset: mp4 files located by episode, or PNGs in the parquet.

``read(rows)`` returns the frames of dataset rows as uint8 ``(n, 3, H, W)``, in any memory
layout (torchcodec's frames are a channels-last view; ``get_batch`` makes the batch contiguous).
For videos the requests of a whole batch are grouped by file, one reader call per file (which
decodes each distinct frame once, in file order); when one file serves the whole batch its
decoder's output is returned as it is, with no copy. The decoded times are checked against the
requested ones within ``tolerance_s``. Nothing here holds state that changes what a batch
contains.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lerobot_pipe.datasets.video import Reader, ReaderCache, VideoError, probe_video


class CameraError(ValueError):
    """A camera's frames cannot be read; the message names the file, episode and time."""


def frame_shape(key: str, feature: dict[str, Any], where: Path) -> tuple[int, int, int]:
    """(C, H, W) of a camera feature; meta/info.json stores (H, W, C) with names saying so."""
    shape = list(feature.get("shape") or [])
    names = feature.get("names") or []
    if len(shape) != 3:
        raise CameraError(f"{where}: camera {key!r} has shape {shape}; expected [H, W, 3]")
    if list(names)[:1] == ["channels"]:
        channels, height, width = shape
    else:
        height, width, channels = shape
    if channels != 3:
        raise CameraError(
            f"{where}: camera {key!r} has {channels} channels; only RGB (3) is supported "
            "(depth maps are not)"
        )
    return channels, height, width


class VideoFrames:
    """The frames of one video camera feature.

    ``episodes`` holds the meta/episodes columns of the dataset's episodes (numpy arrays, one
    entry per episode); ``row_episode`` the position in it of each dataset row, and
    ``row_timestamp`` each row's ``timestamp``. At construction every file the rows need is
    checked: it exists, its header reads, its size and length cover its episodes, and its last
    needed frame decodes (a truncated file fails there, before training).
    """

    def __init__(
        self,
        root: Path,
        key: str,
        shape: tuple[int, int, int],
        video_path: str,
        episodes: dict[str, np.ndarray],
        row_episode: np.ndarray,
        row_timestamp: np.ndarray,
        tolerance_s: float,
        readers: ReaderCache,
        gop: int,
    ) -> None:
        self.key = key
        self.shape = shape
        self.tolerance_s = tolerance_s
        self._readers = readers
        self._gop = gop
        self._episode_index = episodes["episode_index"]
        prefix = f"videos/{key}/"
        try:
            chunk = episodes[prefix + "chunk_index"].astype(np.int64)
            file = episodes[prefix + "file_index"].astype(np.int64)
            self._from_s = episodes[prefix + "from_timestamp"].astype(np.float64)
            to_s = episodes[prefix + "to_timestamp"].astype(np.float64)
        except KeyError as exc:
            raise CameraError(
                f"{root / 'meta/episodes'}: column {exc.args[0]!r} is missing, so the video "
                f"frames of camera {key!r} cannot be located. Download the dataset again."
            ) from None
        pairs = sorted(set(zip(chunk.tolist(), file.tolist(), strict=True)))
        lookup = {pair: i for i, pair in enumerate(pairs)}
        self._episode_file = np.array(
            [lookup[pair] for pair in zip(chunk.tolist(), file.tolist(), strict=True)],
            dtype=np.int64,
        )
        self.paths = [
            root / video_path.format(video_key=key, chunk_index=c, file_index=f) for c, f in pairs
        ]
        self._row_episode = row_episode
        self._row_timestamp = row_timestamp.astype(np.float64)
        self.fps = np.zeros(len(pairs))
        self.num_frames = np.zeros(len(pairs), dtype=np.int64)
        for i, path in enumerate(self.paths):
            self._check_file(i, path, to_s)

    def _episodes_in(self, file_id: int) -> list[int]:
        return self._episode_index[self._episode_file == file_id].tolist()

    def _check_file(self, file_id: int, path: Path, to_s: np.ndarray) -> None:
        episodes = self._episodes_in(file_id)
        where = f"video file of camera {self.key!r} for episodes {_short(episodes)}"
        source = self._readers.source(path)
        if source is None and not path.is_file():
            raise CameraError(
                f"{path}: {where} is missing. Download the dataset's videos too (pass "
                "--dataset.repo_id to fetch the files the selected episodes need) or point "
                "--dataset.root at a complete copy."
            )
        try:
            header = probe_video(path, source)
        except VideoError as exc:
            raise CameraError(
                f"{exc}; it is the {where}. The file is corrupt: download it again."
            ) from None
        if (header.height, header.width) != self.shape[1:]:
            raise CameraError(
                f"{path}: frames are {header.height}x{header.width}, but meta/info.json declares "
                f"{self.shape[1]}x{self.shape[2]} for camera {self.key!r}"
            )
        if header.fps <= 0 or header.num_frames <= 0:
            raise CameraError(f"{path}: the header gives no frame rate or frame count ({where})")
        self.fps[file_id] = header.fps
        self.num_frames[file_id] = header.num_frames
        mine = self._episode_file == file_id
        last = int(np.argmax(np.where(mine, to_s, -np.inf)))
        end_s = float(to_s[last])
        needed = int(round(end_s * header.fps))
        if needed > header.num_frames or end_s > header.duration_s + self.tolerance_s:
            raise CameraError(
                f"{path}: holds {header.num_frames} frames ({header.duration_s:.3f} s), but "
                f"episode {int(self._episode_index[last])} ends at {end_s:.3f} s in it: the file "
                "is truncated or belongs to another version of the dataset. Download it again."
            )
        # The header of a truncated file may still list every frame: decode the last one.
        _, times = self._frames_at(
            file_id,
            np.array([needed - 1]),
            lambda exc: (
                f"{path}: decoding its last frame (episode {int(self._episode_index[last])}, "
                f"{(needed - 1) / header.fps:.3f} s) failed: {exc}. The file is corrupt or "
                "truncated: download it again."
            ),
        )
        expected = (needed - 1) / header.fps
        if not abs(times[0] - expected) < max(self.tolerance_s, 0.5 / header.fps):
            self._readers.drop(path)
            raise CameraError(
                f"{path}: its last frame (episode {int(self._episode_index[last])}, "
                f"{expected:.3f} s) cannot be decoded: the file is truncated or corrupt. "
                "Download it again."
            )

    def _reader(self, file_id: int) -> Reader:
        return self._readers.get(self.paths[file_id], float(self.fps[file_id]), self._gop)

    def _frames_at(
        self, file_id: int, wanted: np.ndarray, failure: Callable[[Exception], str]
    ) -> tuple[torch.Tensor, np.ndarray]:
        """The decoder's ``frames_at(wanted)`` of one file. A decoder that fails is dropped (it
        may be left in a broken state) and the failure raised as CameraError(failure(exc))."""
        try:
            return self._reader(file_id).frames_at(wanted)
        except Exception as exc:
            self._readers.drop(self.paths[file_id])
            raise CameraError(failure(exc)) from None

    def read(self, rows: np.ndarray) -> torch.Tensor:
        """Decode the frames of dataset ``rows``: uint8 ``(len(rows), 3, H, W)``."""
        episode = self._row_episode[rows]
        file_id = self._episode_file[episode]
        times = self._from_s[episode] + self._row_timestamp[rows]
        files = np.unique(file_id)
        out = None if len(files) == 1 else torch.empty((len(rows), *self.shape), dtype=torch.uint8)
        for f in files.tolist():
            sel = np.flatnonzero(file_id == f)
            frames = self._read_file(f, rows[sel], times[sel], episode[sel])
            if out is None:
                return frames
            # numpy's fancy-index copy is ~20x faster than torch's index_put for uint8 frames.
            out.numpy()[sel] = frames.numpy()
        return out

    def _read_file(
        self, f: int, rows: np.ndarray, times: np.ndarray, episode: np.ndarray
    ) -> torch.Tensor:
        path = self.paths[f]
        wanted = np.rint(times * self.fps[f]).astype(np.int64)
        outside = (wanted < 0) | (wanted >= self.num_frames[f])
        if outside.any():
            j = int(np.flatnonzero(outside)[0])
            raise CameraError(self._missing(path, rows[j], times[j], "beyond its end"))
        frames, decoded = self._frames_at(
            f,
            wanted,
            lambda exc: (
                f"{path}: decoding frames at {_short(np.round(times, 4).tolist())} s "
                f"(episodes {_short(np.unique(self._episode_index[episode]).tolist())}) "
                f"failed: {type(exc).__name__}: {exc}; first request: "
                f"{self._where(rows[0], times[0])}. The file is corrupt: download it again."
            ),
        )
        bad = ~(np.abs(decoded - times) < self.tolerance_s)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            found = (
                "no frame" if np.isnan(decoded[j]) else f"the nearest frame at {decoded[j]:.6f} s"
            )
            raise CameraError(self._missing(path, rows[j], times[j], f"{found} decodes there"))
        if tuple(frames.shape[1:]) != self.shape:
            raise CameraError(
                f"{path}: decoded frames have shape {list(frames.shape[1:])}, meta/info.json "
                f"declares {list(self.shape)} (C, H, W) for camera {self.key!r}"
            )
        return frames

    def _where(self, row: int, time_s: float) -> str:
        episode = int(self._episode_index[self._row_episode[row]])
        return f"episode {episode}, timestamp {self._row_timestamp[row]:.6f} s = {time_s:.6f} s in the file"

    def _missing(self, path: Path, row: int, time_s: float, what: str) -> str:
        return (
            f"{path}: camera {self.key!r} has no frame within tolerance_s={self.tolerance_s} of "
            f"{self._where(row, time_s)} ({what}). The video does not match meta/episodes "
            "(timestamps shifted or frames missing); re-encode or download the dataset again, "
            "or raise --tolerance_s if the recording's timestamps are known to jitter."
        )


class ImageFrames:
    """The frames of one image camera feature: PNG (or JPEG) bytes in the data files."""

    def __init__(self, key: str, shape: tuple[int, int, int], data: pa.Array) -> None:
        self.key = key
        self.shape = shape
        self._data = data

    def read(self, rows: np.ndarray) -> torch.Tensor:
        """The frames of dataset ``rows``: uint8 ``(len(rows), 3, H, W)``."""
        from PIL import Image

        unique, inverse = np.unique(rows, return_inverse=True)
        frames = torch.empty((len(unique), *self.shape), dtype=torch.uint8)
        for j, row in enumerate(unique.tolist()):
            raw = self._data[row].as_py()
            if raw is None:
                raise CameraError(f"camera {self.key!r}: row {row} holds no image bytes")
            with Image.open(io.BytesIO(raw)) as image:
                array = np.array(image.convert("RGB"))
            if array.shape != (self.shape[1], self.shape[2], 3):
                raise CameraError(
                    f"camera {self.key!r}: the image of row {row} is {list(array.shape)} (H, W, C), "
                    f"meta/info.json declares {[self.shape[1], self.shape[2], 3]}"
                )
            frames[j] = torch.from_numpy(array).permute(2, 0, 1)
        if len(unique) == len(rows) and np.array_equal(unique, rows):
            return frames
        return torch.from_numpy(frames.numpy()[inverse])


def _short(values: list, limit: int = 8) -> str:
    text = ", ".join(str(v) for v in values[:limit])
    return f"[{text}{', ...' if len(values) > limit else ''}]"
