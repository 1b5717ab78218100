"""Read-only, seekable file objects over a :class:`~lerobot_pipe.datasets.hub_files.HubFileCache`'s
repository files, for readers that need only parts of a file: pyarrow reads a parquet file's
footer and the row groups asked for (:class:`RemoteFile`, :func:`parquet_metadata`), a video
decoder the container's index and the blocks of the frames it decodes (:class:`BlockFile`)."""

from __future__ import annotations

import bisect
import io
import threading

from lerobot_pipe.datasets.hub_files import DEFAULT_BLOCK_BYTES, HubFileCache
from lerobot_pipe.datasets.metadata import DatasetError


class _RemoteFileBase(io.RawIOBase):
    """A read-only, seekable file over ``cache``'s repository file ``path``: the position and
    its seeks; subclasses fetch the bytes of ``readinto``."""

    def __init__(self, cache: HubFileCache, path: str) -> None:
        super().__init__()
        self.cache = cache
        self.path = path
        self.size = cache.size(path)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos


class RemoteFile(_RemoteFileBase):
    """A file over HTTP range requests (each read one range, with the cache's retries), for
    readers that fetch only parts of a file: pyarrow reads a parquet file's footer and then only
    the row groups asked for."""

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.size - self._pos)
        if n <= 0:
            return 0
        data = self.cache.read_range(self.path, self._pos, self._pos + n - 1)
        buffer[:n] = data
        self._pos += n
        return n


class ByteRanges:
    """The byte ranges of one file a reader means to read (``[start, end)``, merged where they
    touch): a :class:`BlockFile`'s bound. Thread-safe: ranges are added while decoders read."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._lock = threading.Lock()

    def add(self, start: int, end: int) -> None:
        if start >= end:
            return
        with self._lock:
            i = bisect.bisect_left(self._ends, start)  # the first range ending at or after start
            j = bisect.bisect_right(self._starts, end)  # past the last range starting by end
            if i < j:
                start, end = min(start, self._starts[i]), max(end, self._ends[j - 1])
            self._starts[i:j], self._ends[i:j] = [start], [end]

    def around(self, pos: int) -> tuple[int, int | None, bool]:
        """``(lo, hi, inside)``: the range holding ``pos`` (inside), else the gap between ranges
        holding it (``hi`` None: no range after it)."""
        with self._lock:
            i = bisect.bisect_right(self._starts, pos) - 1
            if i >= 0 and pos < self._ends[i]:
                return self._starts[i], self._ends[i], True
            after = self._starts[i + 1] if i + 1 < len(self._starts) else None
            return (self._ends[i] if i >= 0 else 0), after, False


class BlockFile(_RemoteFileBase):
    """A file over :meth:`HubFileCache.read_bytes` blocks: what a video decoder reads instead of
    a local copy, so that it fetches the container's index and the blocks of the frames it
    decodes, not the whole file. A read's missing blocks are fetched in one request.

    Without ``ranges``, a read fills the buffer whole (up to the end of the file), its missing
    blocks fetched whole. With ``ranges`` (the bytes this reader means to read: the container's
    index and its episodes' frames), a read stops at the end of the range it starts in (a short
    read, which a demuxer's buffered reader takes as such), and the blocks at the range's edges
    are fetched only within it, so that a demuxer filling its 32-64 KiB buffer at the end of an
    episode fetches none of the next episode's bytes (another rank's); a read outside every
    range returns at most the rest of its block (up to the next range), fetched from where it
    starts: the few bytes a demuxer reads past an episode's last frame or before its first.
    ``exact``: a read fetches the bytes it asks for, no more (a reader of a container's boxes)."""

    def __init__(
        self,
        cache: HubFileCache,
        path: str,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        ranges: ByteRanges | None = None,
        exact: bool = False,
    ) -> None:
        super().__init__(cache, path)
        self.block_bytes = block_bytes
        self.ranges = ranges
        self.exact = exact

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self.size - self._pos))
        if not n:
            return 0
        window = (self._pos, self._pos + n) if self.exact else None
        if self.ranges is not None:
            lo, hi, inside = self.ranges.around(self._pos)
            hi = self.size if hi is None else hi
            if not inside:  # the rest of this block, not into the next range
                block = self._pos - self._pos % self.block_bytes
                lo, hi = self._pos, min(hi, block + self.block_bytes)
            n = min(n, hi - self._pos)
            window = (lo, hi)
        data = self.cache.read_bytes(self.path, self._pos, self._pos + n, self.block_bytes, window)
        view[:n] = data
        self._pos += n
        return n


def parquet_metadata(cache: HubFileCache, path: str):
    """The footer (``FileMetaData``) of parquet file ``path``: its last 8 bytes, then the footer
    itself, two range requests. pyarrow's own reader first reads the last 64 KiB whatever the
    footer's size (a whole small file); here it reads from a view of the file that holds only the
    footer and zeros before it, which the footer's parser never looks at."""
    import pyarrow.parquet as pq

    size = cache.size(path)
    tail = cache.read_range(path, max(0, size - 8), size - 1)
    if len(tail) != 8 or tail[4:] != b"PAR1":
        raise DatasetError(f"{cache.repo_id}: {path}: not a parquet file (no PAR1 footer)")
    length = int.from_bytes(tail[:4], "little")
    start = size - 8 - length
    if start < 4:
        raise DatasetError(f"{cache.repo_id}: {path}: footer length {length} exceeds the file")
    footer = cache.read_range(path, start, size - 9) + tail
    view = io.BytesIO(bytes(start) + footer)
    return pq.read_metadata(view)
