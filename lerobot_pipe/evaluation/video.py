"""Eval videos: H.264 (libx264, yuv420p) mp4 through PyAV, as LeRobot 0.6.1's lerobot-eval
writes them. A PyAV build without libx264 falls back to MPEG-4 Part 2 (``mpeg4``, in every
FFmpeg build), and says so in the log."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
CODECS = ("libx264", "mpeg4")


def video_codec() -> str:
    from av.codec import Codec

    for name in CODECS:
        try:
            Codec(name, "w")
        except Exception:  # noqa: BLE001 - av raises UnknownCodecError (or ValueError)
            continue
        if name != CODECS[0]:
            log.warning("PyAV has no libx264 encoder: eval videos are written as %s", name)
        return name
    raise RuntimeError(f"PyAV can encode none of {CODECS}")


def write_video(path: str | Path, frames: np.ndarray, fps: int) -> None:
    """``frames`` (T, H, W, 3) uint8 RGB to an mp4 (odd sides cropped by one pixel)."""
    import av

    height, width = frames.shape[1] - frames.shape[1] % 2, frames.shape[2] - frames.shape[2] % 2
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(video_codec(), rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for frame in frames:
            image = np.ascontiguousarray(frame[:height, :width])
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
