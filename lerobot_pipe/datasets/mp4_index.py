"""Where each frame of an mp4 (ISO base media) file's video track lies in the file.

The container's sample tables (``moov/trak/mdia/minf/stbl``: ``stsz`` the sizes, ``stco`` /
``co64`` the chunk offsets, ``stsc`` the samples per chunk) give every sample's byte offset and
size without decoding anything. A streaming dataset uses them to fetch the bytes of the frames
it is about to decode in a few large range requests (read-ahead) instead of the decoder's many
small reads. Only the top-level box headers and the ``moov`` box are read.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

import numpy as np

_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl"}


def _boxes(buf: bytes, start: int, end: int):
    """(type, payload start, box end) of the boxes in ``buf[start:end]``."""
    pos = start
    while pos + 8 <= end:
        size, kind = struct.unpack_from(">I4s", buf, pos)
        head = 8
        if size == 1:
            if pos + 16 > end:
                return
            (size,) = struct.unpack_from(">Q", buf, pos + 8)
            head = 16
        elif size == 0:
            size = end - pos
        if size < head or pos + size > end:
            return
        yield kind, pos + head, pos + size
        pos += size


def _read_moov(f: BinaryIO) -> bytes | None:
    """The ``moov`` box's bytes (header included), found by walking the top-level box headers."""
    size = f.seek(0, 2)
    pos = 0
    while pos + 8 <= size:
        f.seek(pos)
        head = f.read(16)
        if len(head) < 8:
            return None
        length, kind = struct.unpack_from(">I4s", head)
        if length == 1:
            if len(head) < 16:
                return None
            (length,) = struct.unpack_from(">Q", head, 8)
        elif length == 0:
            length = size - pos
        if length < 8:
            return None
        if kind == b"moov":
            f.seek(pos)
            data = f.read(length)
            return data if len(data) == length else None
        pos += length
    return None


def frame_ranges(f: BinaryIO) -> tuple[np.ndarray, np.ndarray] | None:
    """``(offsets, sizes)``: the byte offset and size of each sample of the first video track of
    the mp4 file object ``f``, in decoding order (for LeRobot's AV1 and H.264 without B-frames,
    the frame order). None when the file has no such tables (not an mp4, fragmented, ...)."""
    moov = _read_moov(f)
    if moov is None:
        return None
    for kind, start, end in _boxes(moov, 8, len(moov)):
        if kind != b"trak":
            continue
        found = _video_tables(moov, start, end)
        if found is not None:
            return found
    return None


def _video_tables(buf: bytes, start: int, end: int) -> tuple[np.ndarray, np.ndarray] | None:
    tables: dict[bytes, tuple[int, int]] = {}
    video = False

    def walk(a: int, b: int) -> None:
        nonlocal video
        for kind, s, e in _boxes(buf, a, b):
            if kind in _CONTAINERS:
                walk(s, e)
            elif kind == b"hdlr" and buf[s + 8 : s + 12] == b"vide":
                video = True
            elif kind in (b"stsz", b"stco", b"co64", b"stsc"):
                tables[kind] = (s, e)

    walk(start, end)
    offsets_box = tables.get(b"stco") or tables.get(b"co64")
    if not video or b"stsz" not in tables or b"stsc" not in tables or offsets_box is None:
        return None
    s, _ = tables[b"stsz"]
    uniform, count = struct.unpack_from(">II", buf, s + 4)
    sizes = (
        np.full(count, uniform, np.int64)
        if uniform
        else np.frombuffer(buf, ">u4", count, s + 12).astype(np.int64)
    )
    s, _ = offsets_box
    (n_chunks,) = struct.unpack_from(">I", buf, s + 4)
    width = ">u4" if b"stco" in tables else ">u8"
    chunk_offsets = np.frombuffer(buf, width, n_chunks, s + 8).astype(np.int64)
    s, _ = tables[b"stsc"]
    (n_runs,) = struct.unpack_from(">I", buf, s + 4)
    runs = np.frombuffer(buf, ">u4", 3 * n_runs, s + 8).reshape(n_runs, 3).astype(np.int64)
    if not n_runs or not n_chunks:
        return None
    # Samples per chunk: each run's count from its first chunk (1-based) to the next run's.
    firsts = np.append(runs[:, 0] - 1, n_chunks)
    per_chunk = np.repeat(runs[:, 1], np.diff(firsts).clip(0))[:n_chunks]
    if per_chunk.sum() < count:
        return None
    chunk_of = np.repeat(np.arange(len(per_chunk)), per_chunk)[:count]
    # Offset = the chunk's offset + the sizes of the samples before it in the chunk.
    before = np.cumsum(sizes) - sizes
    chunk_start_sample = np.cumsum(per_chunk) - per_chunk
    offsets = chunk_offsets[chunk_of] + before - before[chunk_start_sample[chunk_of]]
    return offsets, sizes
