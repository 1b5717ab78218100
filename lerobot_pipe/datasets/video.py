"""LeRobot's camera videos: encode them as LeRobot does, check their headers, decode frames.

Decoding goes through torchcodec (LeRobot's default) or PyAV. A reader is one open file used by
one thread: it returns the frames at given frame indices (any order, repeats allowed) as uint8
``(n, 3, H, W)`` in that order, together with their presentation times, so that the caller can
check them against the times it asked for. Each distinct frame is decoded once, in file order,
decoding forward between nearby frames instead of seeking. Readers are cheap to keep open and
expensive to reopen, hence ``ReaderCache``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

log = logging.getLogger(__name__)

VIDEO_BACKENDS = ("torchcodec", "pyav")
DEFAULT_VIDEO_BACKEND = "torchcodec"


@dataclass(frozen=True)
class VideoEncoding:
    """Encoder settings; the defaults are LeRobot's (its RGBEncoderConfig)."""

    vcodec: str = "libsvtav1"
    pix_fmt: str = "yuv420p"
    g: int = 2
    crf: int = 30
    preset: int = 12
    fast_decode: int = 0

    def codec_options(self) -> dict[str, str]:
        options = {"g": str(self.g), "crf": str(self.crf), "preset": str(self.preset)}
        if self.vcodec == "libsvtav1":
            options["svtav1-params"] = f"fast-decode={self.fast_decode}"
        return options

    def info(self, height: int, width: int, fps: int) -> dict[str, Any]:
        """The ``info`` block of a video feature in meta/info.json, keys as LeRobot writes them."""
        return {
            "video.height": height,
            "video.width": width,
            "video.codec": "av1" if self.vcodec in ("libsvtav1", "libaom-av1") else self.vcodec,
            "video.pix_fmt": self.pix_fmt,
            "video.fps": fps,
            "video.channels": 3,
            "has_audio": False,
            "video.g": self.g,
            "video.crf": self.crf,
            "video.preset": self.preset,
            "video.fast_decode": self.fast_decode,
            "video.video_backend": "pyav",
            "video.extra_options": {},
            "is_depth_map": False,
        }


LEROBOT_ENCODING = VideoEncoding()


class VideoError(ValueError):
    """A video file is missing, unreadable or does not hold the frames asked for."""


def encode_episode(
    frames: np.ndarray, path: Path, fps: int, encoding: VideoEncoding = LEROBOT_ENCODING
) -> None:
    """Encode one episode's RGB uint8 ``(n, H, W, 3)`` frames into its own mp4 at ``fps``, as
    LeRobot's recorder does before appending the episode to the camera's video file."""
    import av

    # SVT-AV1 prints its whole configuration at info level unless told otherwise.
    os.environ.setdefault("SVT_LOG", "1")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _own_scheduling(), av.open(str(path), "w") as container:
        stream = container.add_stream(encoding.vcodec, rate=fps, options=encoding.codec_options())
        stream.pix_fmt = encoding.pix_fmt
        stream.height, stream.width = frames.shape[1:3]
        for image in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


@contextlib.contextmanager
def _own_scheduling() -> Iterator[None]:
    """Keep the calling thread's CPU scheduling policy across an encode.

    SVT-AV1, run as root, switches the thread that opens the encoder to SCHED_FIFO priority 99.
    Every process that thread then starts (torchrun, trainers, test subprocesses) inherits it,
    and a busy real-time process starves everything else of its CPU: restore the policy."""
    if not hasattr(os, "sched_getscheduler"):
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if (os.sched_getscheduler(0), os.sched_getparam(0)) != (policy, param):
            os.sched_setscheduler(0, policy, param)


class VideoWriter:
    """One camera video file of a dataset: episodes (each encoded on its own by
    ``encode_episode``) appended one after the other without re-encoding, like LeRobot's
    concatenation; the index goes to the front of the file (faststart) at ``close``."""

    def __init__(self, path: Path) -> None:
        import av

        self.path = path
        self.num_frames = 0
        self.size_mb = 0.0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(path), "w", options={"movflags": "faststart"})
        self._stream: Any = None
        self._end = 0  # presentation time of the next frame, in the stream's time base
        self._time_s = 0.0

    def append(self, episode: Path) -> tuple[float, float]:
        """Append the episode video ``episode``; returns its (from, to) time span in the file."""
        import av

        start_s = self._time_s
        with av.open(str(episode)) as source:
            stream = source.streams.video[0]
            if self._stream is None:
                self._stream = self._container.add_stream_from_template(
                    template=stream, opaque=True
                )
                self._stream.time_base = stream.time_base
            shift = self._end
            for packet in source.demux(stream):
                if packet.dts is None:  # the demuxer's end-of-stream marker
                    continue
                self._end = max(self._end, shift + packet.pts + packet.duration)
                packet.pts += shift
                packet.dts += shift
                packet.stream = self._stream
                self._container.mux(packet)
                self.num_frames += 1
                self.size_mb += packet.size / 1e6
            # The episode's duration as LeRobot reads it (its get_video_duration_in_s).
            if stream.duration is not None:
                duration = float(stream.duration * stream.time_base)
            else:
                duration = source.duration / av.time_base
        self._time_s = start_s + duration
        return start_s, self._time_s

    def close(self) -> None:
        self._container.close()


@dataclass(frozen=True)
class VideoHeader:
    """What a video file's header says about its first video stream."""

    num_frames: int
    fps: float
    duration_s: float
    height: int
    width: int
    codec: str


def probe_video(path: Path, source: Any = None) -> VideoHeader:
    """Read ``path``'s header (no decoding); VideoError naming the file if that fails. ``source``
    (a readable, seekable file object) is read instead of the local file when given."""
    import av

    if source is None and not path.is_file():
        raise VideoError(f"{path}: video file not found")
    try:
        with av.open(source if source is not None else str(path)) as container:
            if not container.streams.video:
                raise VideoError(f"{path}: the file holds no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.base_rate or Fraction(0)
            if stream.duration is not None and stream.time_base is not None:
                duration = float(stream.duration * stream.time_base)
            else:
                duration = (container.duration or 0) / av.time_base
            return VideoHeader(
                num_frames=int(stream.frames),
                fps=float(rate),
                duration_s=duration,
                height=int(stream.codec_context.height),
                width=int(stream.codec_context.width),
                codec=str(stream.codec_context.name),
            )
    except av.FFmpegError as exc:
        raise VideoError(f"{path}: not a readable video file ({exc})") from exc


class Reader(Protocol):
    """One open video file, used from one thread."""

    num_frames: int

    def frames_at(self, indices: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """uint8 ``(n, 3, H, W)`` frames at ``indices`` (in that order), and their times (s)."""
        ...

    def close(self) -> None: ...


class _ShortReads:
    """A file object as torchcodec should read it: torchcodec's reader calls ``read`` until the
    demuxer's buffer (32-64 KiB) is full or a read returns nothing, where FFmpeg's own readers
    take a short read as it is. A short read of ``f`` (a
    :class:`~lerobot_pipe.datasets.remote_files.BlockFile` at the end of the bytes it means to
    read) therefore ends the loop: the read after it, at the same position, returns nothing
    once; FFmpeg asks again when it needs the bytes."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self._stopped_at: int | None = None

    def read(self, size: int = -1) -> bytes:
        pos = self._f.tell()
        if self._stopped_at == pos:
            self._stopped_at = None
            return b""
        data = self._f.read(size)
        self._stopped_at = pos + len(data) if data and 0 <= len(data) < size else None
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self._stopped_at = None
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()


class TorchCodecReader:
    """torchcodec's VideoDecoder, as LeRobot opens it (approximate seek mode, one thread)."""

    def __init__(self, path: Path | Any) -> None:
        from torchcodec.decoders import VideoDecoder

        # A path or a file object (its short reads ending torchcodec's read loop).
        source = str(path) if isinstance(path, Path) else _ShortReads(path)
        self._decoder = VideoDecoder(source, seek_mode="approximate", num_ffmpeg_threads=1)
        metadata = self._decoder.metadata
        self.num_frames = int(metadata.num_frames or 0)

    def frames_at(self, indices: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        # torchcodec sorts the indices and decodes each distinct frame once. Its NCHW frames
        # are a permuted view of the NHWC ones it decodes (channels-last strides): the batch is
        # made contiguous once, where it is assembled (LeRobotDataset.get_batch).
        batch = self._decoder.get_frames_at(indices=indices.tolist())
        return batch.data, batch.pts_seconds.numpy()

    def close(self) -> None:
        self._decoder = None


class PyAVReader:
    """PyAV with the decoder kept open: it decodes forward through nearby frames instead of
    seeking back to a key frame for each one."""

    def __init__(self, path: Path | Any, fps: float, gop: int) -> None:
        import av

        self._container = av.open(str(path) if isinstance(path, Path) else path)
        self._stream = self._container.streams.video[0]
        self._stream.codec_context.thread_count = 1
        self._time_base = float(self._stream.time_base)
        self._fps = fps
        self.num_frames = int(self._stream.frames)
        # Decoding forward through up to a GOP's worth of frames costs no more than a seek.
        self._forward_s = (gop + 0.5) / fps
        self._frames: Iterator[Any] | None = None
        self._last_s = -np.inf
        # A frame's own to_ndarray(format=...) builds a new colour converter each call (~10x
        # slower at these sizes); one kept per reader is reused.
        self._to_rgb = av.video.reformatter.VideoReformatter()

    def _decode(self) -> Iterator[Any]:
        for packet in self._container.demux(self._stream):
            yield from packet.decode()

    def _seek(self, time_s: float) -> None:
        self._container.seek(
            max(0, int(time_s / self._time_base)),
            backward=True,
            any_frame=False,
            stream=self._stream,
        )
        self._frames = self._decode()
        self._last_s = -np.inf

    def frames_at(self, indices: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        unique, inverse = np.unique(indices, return_inverse=True)
        frames, times = self._decode_sorted(unique)
        if len(unique) == len(indices) and np.array_equal(unique, indices):
            return frames, times
        out = torch.empty((len(indices), *frames.shape[1:]), dtype=torch.uint8)
        np.take(frames.numpy(), inverse, axis=0, out=out.numpy())
        return out, times[inverse]

    def _decode_sorted(self, indices: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        height = self._stream.codec_context.height
        width = self._stream.codec_context.width
        out = torch.empty((len(indices), 3, height, width), dtype=torch.uint8)
        times = np.full(len(indices), np.nan)
        half_frame = 0.5 / self._fps
        for j, index in enumerate(indices.tolist()):
            target = index / self._fps
            if self._frames is None or not 0 < target - self._last_s <= self._forward_s:
                self._seek(target)
            for frame in self._frames:
                if frame.pts is None:
                    continue
                self._last_s = frame.pts * self._time_base
                if self._last_s >= target - half_frame:
                    rgb = self._to_rgb.reformat(frame, format="rgb24")
                    out[j].copy_(torch.from_numpy(rgb.to_ndarray()).permute(2, 0, 1))
                    times[j] = self._last_s
                    break
            else:  # the stream ended first: times[j] stays NaN for the caller to report
                self._frames = None
        return out, times

    def close(self) -> None:
        self._container.close()


def available_backends() -> list[str]:
    """The decoding backends that import here, in VIDEO_BACKENDS order."""
    found = []
    for name in VIDEO_BACKENDS:
        module = "av" if name == "pyav" else "torchcodec"
        if importlib.util.find_spec(module) is None:
            continue
        try:
            if name == "torchcodec":
                # Importing the decoders loads FFmpeg's libraries, which may be missing.
                importlib.import_module("torchcodec.decoders")
            else:
                importlib.import_module("av")
        except Exception as exc:  # a broken install is reported, then skipped
            log.debug("video backend %s does not load: %s", name, exc)
            continue
        found.append(name)
    return found


def resolve_video_backend(requested: str | None) -> str:
    """``requested`` when it loads here, else the other backend (logged); VideoError if none."""
    if requested is not None and requested not in VIDEO_BACKENDS:
        raise VideoError(
            f"video_backend={requested!r} is not supported; choose one of {list(VIDEO_BACKENDS)} "
            "(--dataset.video_backend)"
        )
    wanted = requested or DEFAULT_VIDEO_BACKEND
    found = available_backends()
    if wanted in found:
        log.info("decoding videos with %s", wanted)
        return wanted
    if not found:
        raise VideoError(
            f"no video decoder loads here (tried {list(VIDEO_BACKENDS)}): install PyAV "
            "(`pip install av`) or torchcodec with FFmpeg (`apt-get install ffmpeg`, "
            "`pip install torchcodec`)"
        )
    log.warning(
        "video_backend %r does not load here; decoding videos with %s instead", wanted, found[0]
    )
    return found[0]


class ReaderCache:
    """Open readers, one set per thread (a reader is not thread-safe), at most ``max_open`` per
    thread, least recently used closed first. Readers opened before a fork are not reused in
    the child. ``sources`` maps a video path to a new readable, seekable file object to decode
    instead of the local file (a remote file read by byte ranges), or to None (the local file)."""

    def __init__(
        self,
        backend: str,
        max_open: int = 64,
        sources: Callable[[Path], Any] | None = None,
    ) -> None:
        self.backend = backend
        self.max_open = max_open
        self.sources = sources
        self._local = threading.local()

    def source(self, path: Path) -> Any:
        """A new file object to read ``path`` from, or None to read the local file."""
        return self.sources(path) if self.sources is not None else None

    def _readers(self) -> OrderedDict[Path, Reader]:
        pid = os.getpid()
        if getattr(self._local, "pid", None) != pid:
            self._local.pid = pid
            self._local.readers = OrderedDict()
        return self._local.readers

    def get(self, path: Path, fps: float, gop: int) -> Reader:
        readers = self._readers()
        reader = readers.get(path)
        if reader is not None:
            readers.move_to_end(path)
            return reader
        source = self.source(path)
        source = path if source is None else source
        if self.backend == "torchcodec":
            reader = TorchCodecReader(source)
        else:
            reader = PyAVReader(source, fps, gop)
        readers[path] = reader
        while len(readers) > self.max_open:
            readers.popitem(last=False)[1].close()
        return reader

    def drop(self, path: Path) -> None:
        """Close this thread's reader of ``path`` (after an error left it in an unknown state)."""
        reader = self._readers().pop(path, None)
        if reader is not None:
            reader.close()
