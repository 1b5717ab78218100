"""Files of a Hub dataset repository fetched on demand into a bounded local cache.

:class:`HubFileCache` is what a streaming dataset reads through: a file is fetched when a reader
``acquire``s it and stays pinned until the reader ``release``s it; unpinned files are evicted
(least recently used first) when a new one would not fit, so the cache (its folder and the
blocks in memory together) never holds more than ``max_bytes``. Every file comes from one
commit (the revision is resolved to its sha once, at start), in ranges of ``chunk_bytes`` over
HTTP (huggingface_hub's URL, headers and session):

* a dropped connection, a short body, a 429 or a 5xx is retried from the first byte not yet
  written (:func:`~lerobot_pipe.utils.hub_http.with_retries`: ``Retry-After`` honoured,
  exponential backoff otherwise), up to ``retries`` times per range;
* the finished file is checked against the ETag the Hub gives (sha256 for LFS files, the git blob
  sha1 otherwise) before anyone reads it, so no retry can feed a wrong byte to a decoder;
* a 404 (file or revision), a 401 / 403 (missing or revoked token) fails at once with a
  :class:`~lerobot_pipe.datasets.lerobot_dataset.DatasetError` naming the file.

Why not ``hf_hub_download``: its cache keeps every blob (no bound, no eviction), and its retries
do not cover 429 / 5xx in the middle of a file. Video files need not be fetched whole: a
:class:`~lerobot_pipe.datasets.remote_files.BlockFile` is a seekable file object over fixed-size
blocks of a file, each byte fetched once (:meth:`HubFileCache.read_bytes`, a run of missing
blocks in one range request, with the same retries) and kept in memory under the same bound, so
that a decoder reads the container's index and the blocks of the frames it decodes
(docs/streaming.md); :meth:`HubFileCache.read_ahead` fetches a byte range's blocks before a
decoder asks for them. A block at the edge of the bytes a reader means to read (its episodes')
is fetched only in part, the rest left to whoever reads it (another rank). Blocks are checked
for their length, not against an ETag (only whole files can be).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lerobot_pipe.datasets.metadata import DatasetError
from lerobot_pipe.fsutil import atomic_open, write_bytes_atomic
from lerobot_pipe.utils.hub_http import (
    TRANSIENT_STATUSES,
    RetriesExhausted,
    TransientResponse,
    known_secrets,
    redact,
    retry_after_s,
    with_retries,
)

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 8 << 20
_BLOCKS_DIR = ".blocks"  # the names of blocks of files read by range (BlockFile), in memory
DEFAULT_BLOCK_BYTES = 16 << 10
# The most bytes one range request of blocks asks for: a run of missing blocks longer than this
# is fetched in several requests (a reader waiting on its first block waits for one request).
DEFAULT_REQUEST_BYTES = 1 << 20
# Blocks read ahead (HubFileCache.read_ahead) and not read yet take at most this share of the
# cache, so that what is fetched ahead cannot crowd out the blocks in use.
READ_AHEAD_SHARE = 8


def _mib(size: int) -> str:
    return f"{size / 2**20:.3g} MiB"


@dataclass
class _Entry:
    size: int
    pins: int = 0
    data: bytes | None = None  # a block kept in memory (no file in the cache folder)
    ahead: bool = False  # a block read ahead that no reader has read yet
    offset: int = 0  # where in the file ``data`` starts (a block may hold a part of its bytes)


class HubFileCache:
    """Repository files of ``repo_id`` at commit ``revision`` (a sha), cached under ``root``."""

    def __init__(
        self,
        repo_id: str,
        revision: str,
        root: str | Path,
        max_bytes: int,
        *,
        repo_type: str = "dataset",
        endpoint: str | None = None,
        token: str | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        retries: int = 8,
        backoff_s: float = 0.5,
        on_full: Callable[[], bool] | None = None,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.repo_id = repo_id
        self.revision = revision
        self.repo_type = repo_type
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.endpoint = endpoint
        self.token = token
        self._secrets = known_secrets(token)  # looked up once: redacted from retry warnings
        self.chunk_bytes = chunk_bytes
        self.retries = retries
        self.backoff_s = backoff_s
        # Called (without this cache's lock) when pinned files leave no room: the reader unpins
        # some (closes an idle file group) and says whether it did.
        self.on_full = on_full
        self.bytes_fetched = 0  # body bytes received, retries included
        self.peak_bytes = 0  # the most the cache folder held at once
        self.fetches: dict[str, int] = {}  # path -> times fetched
        self.block_fetches: dict[str, int] = {}  # path -> blocks (or parts) of it fetched
        self.range_bytes: dict[str, int] = {}  # path -> bytes of it fetched by block
        self.block_requests = 0  # range requests of blocks (on demand and read-ahead)
        self.read_ahead_bytes = 0  # bytes of blocks fetched by read_ahead
        self.request_bytes = DEFAULT_REQUEST_BYTES
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # LRU order, oldest first
        self._used = 0  # the sizes of the entries (files and blocks), kept as they change
        self._ahead = 0  # the sizes of the blocks read ahead and not read yet
        # A read-ahead's refusal (404, 401, 403) of a file, handed to its next reader.
        self._refused: dict[str, DatasetError] = {}
        self._lock = threading.Condition()
        self._loading: set[str] = set()
        self._sizes: dict[str, int] = {}
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.rglob("*"):  # a previous run's files: not accounted, so removed
            if stale.is_file():
                stale.unlink()

    @property
    def ahead_bytes(self) -> int:
        """Bytes of the blocks read ahead that no reader has read yet."""
        with self._lock:
            return self._ahead

    def local_path(self, path: str) -> Path:
        return self.root / path

    def acquire(self, path: str) -> Path:
        """The local copy of repository file ``path``, fetched if absent; pinned until
        :meth:`release`. Concurrent callers of one path wait for a single fetch."""
        with self._lock:
            while path in self._loading:
                self._lock.wait()
            entry = self._entries.get(path)
            if entry is not None:
                entry.pins += 1
                self._entries.move_to_end(path)
                return self.local_path(path)
            self._loading.add(path)
        try:
            self._fetch(path)
        except BaseException:
            with self._lock:
                self._loading.discard(path)
                self._lock.notify_all()
            raise
        with self._lock:
            self._entries.move_to_end(path)  # reserved (pinned once, for this caller) by _fetch
            self._loading.discard(path)
            self.peak_bytes = max(self.peak_bytes, self._used)
            self._lock.notify_all()
        return self.local_path(path)

    def release(self, path: str) -> None:
        with self._lock:
            entry = self._entries[path]
            if entry.pins < 1:
                raise RuntimeError(f"{path}: released more often than acquired")
            entry.pins -= 1

    def size(self, path: str) -> int:
        """The size of repository file ``path`` (one HEAD request, remembered)."""
        with self._lock:
            known = self._sizes.get(path)
        if known is None:
            head = self._request(path, None, None)
            known = int(head.headers.get("X-Linked-Size") or head.headers["Content-Length"])
            with self._lock:
                self._sizes[path] = known
        return known

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start``..``end`` (inclusive) of repository file ``path``, not cached."""
        body = self._request(path, start, end).content
        with self._lock:
            self.bytes_fetched += len(body)
        return body

    def read_bytes(
        self,
        path: str,
        start: int,
        stop: int,
        block_bytes: int,
        window: tuple[int, int] | None = None,
    ) -> bytes:
        """Bytes ``start``..``stop`` (exclusive) of repository file ``path``, from its blocks of
        ``block_bytes``. Blocks are kept in memory, counted against the bound and evictable as
        soon as they are read, so that readers of the same bytes fetch them once. A missing block
        is fetched whole, or only its part within ``window`` (the reader's bound, holding
        ``start``..``stop``: the bytes it means to read), joined to the parts of it already
        there; each run of consecutive missing ones in one range request (:meth:`_fetch_blocks`);
        blocks another caller is fetching are waited for."""
        needs = _parts(start // block_bytes, (stop - 1) // block_bytes, block_bytes, start, stop)
        got: dict[int, tuple[int, bytes]] = {}
        while len(got) < len(needs):
            with self._lock:
                refused = self._refused.pop(path, None)
                if refused is not None:
                    raise DatasetError(str(refused)) from refused
                claimed, others = self._claim(path, block_bytes, needs, got)
                if not claimed:
                    if others:
                        self._lock.wait()
                    continue
            lo, hi = window if window is not None else (0, self.size(path))
            lo, hi = min(lo, start), min(max(hi, stop), self.size(path))
            fetch = _parts(claimed[0], claimed[-1], block_bytes, lo, hi)
            with self._lock:
                parts = self._missing(path, block_bytes, {i: fetch[i] for i in claimed})
            for i, (offset, data) in self._fetch_blocks(path, block_bytes, parts).items():
                if offset <= needs[i][0] and needs[i][1] <= offset + len(data):
                    got[i] = (offset, data)  # else its other bytes were evicted: fetched again
        return b"".join(
            got[i][1][a - got[i][0] : b - got[i][0]] for i, (a, b) in sorted(needs.items())
        )

    def read_ahead(self, path: str, start: int, end: int, block_bytes: int) -> int:
        """Fetch the missing bytes ``start``..``end`` (inclusive) of ``path``, by block (the
        edge blocks in part), before a reader asks for them (a reader asking meanwhile waits for
        them), in range requests of up to :attr:`request_bytes`; bytes present or being fetched
        are skipped. It stops while the blocks read ahead and not read yet fill
        ``1/READ_AHEAD_SHARE`` of the cache, and drops what would not fit next to the pinned
        files (it never evicts a file in use). The bytes it fetched."""
        end = min(end, self.size(path) - 1)
        first, last = start // block_bytes, end // block_bytes
        per_request = max(1, self.request_bytes // block_bytes)
        size = 0
        # One request's blocks claimed at a time: a reader needing a later block meanwhile
        # fetches it itself rather than wait for the whole range.
        for piece in range(first, last + 1, per_request):
            needs = _parts(piece, min(piece + per_request - 1, last), block_bytes, start, end + 1)
            with self._lock:
                if self._ahead + per_request * block_bytes > self.max_bytes // READ_AHEAD_SHARE:
                    break  # enough read ahead and not read yet
                claimed, _ = self._claim(path, block_bytes, needs, {})
                parts = self._missing(path, block_bytes, {i: needs[i] for i in claimed})
            fetched = self._fetch_blocks(path, block_bytes, parts, optional=True)
            size += sum(parts[i][1] - parts[i][0] for i in fetched)
            if len(fetched) < len(claimed):  # a failed request, or no room
                break
        with self._lock:
            self.read_ahead_bytes += size
        return size

    def hand_over(self, path: str, error: Exception) -> None:
        """A background reader's ``error`` on ``path``: a refusal (404, 401, 403) is raised to the
        next caller of :meth:`read_bytes` of ``path``; anything else is dropped (that caller
        fetches the bytes itself, with the retries)."""
        if getattr(error, "http_status", None) is not None:
            with self._lock:
                self._refused[path] = error

    @staticmethod
    def _block_name(path: str, block_bytes: int, index: int) -> str:
        return f"{_BLOCKS_DIR}/{block_bytes}/{path}/{index}"

    def _claim(
        self,
        path: str,
        block_bytes: int,
        needs: dict[int, tuple[int, int]],
        got: dict[int, tuple[int, bytes]],
    ) -> tuple[list[int], bool]:
        """Under the lock: the blocks of ``path`` whose bytes ``needs`` gives (block -> file
        bytes ``[a, b)`` of it) and not in ``got``: those in memory with these bytes added to
        ``got`` (as ``(offset, data)``), the others marked as being fetched (by the caller) and
        returned in order, and whether some are being fetched by another caller."""
        claimed: list[int] = []
        others = False
        for i, (a, b) in sorted(needs.items()):
            if i in got:
                continue
            name = self._block_name(path, block_bytes, i)
            entry = self._entries.get(name)
            if (
                entry is not None
                and entry.data is not None
                and entry.offset <= a
                and (b <= entry.offset + len(entry.data))
            ):
                got[i] = (entry.offset, entry.data)
                self._entries.move_to_end(name)
                if entry.ahead:
                    entry.ahead = False
                    self._ahead -= entry.size
            elif name in self._loading:
                others = True
            else:
                self._loading.add(name)
                claimed.append(i)
        return claimed, others

    def _missing(
        self, path: str, block_bytes: int, parts: dict[int, tuple[int, int]]
    ) -> dict[int, tuple[int, int]]:
        """Under the lock: the file bytes ``[a, b)`` ``parts`` gives of each block, less those
        of the block in memory, which a block holds as one run: a part apart from it is
        stretched to meet it (the bytes between fetched too, at most a block's), a part on
        both sides of it fetched before it first (then the rest)."""
        out = {}
        for i, (a, b) in parts.items():
            entry = self._entries.get(self._block_name(path, block_bytes, i))
            if entry is not None and entry.data is not None:
                lo, hi = entry.offset, entry.offset + entry.size
                if lo <= a <= hi < b or hi < a:
                    a = hi
                elif a < lo <= b or b < lo:
                    b = lo
            out[i] = (a, b)
        return out

    def _fetch_blocks(
        self,
        path: str,
        block_bytes: int,
        parts: dict[int, tuple[int, int]],
        *,
        optional: bool = False,
    ) -> dict[int, tuple[int, bytes]]:
        """Fetch the file bytes ``[a, b)`` ``parts`` gives of each of its blocks (claimed: marked
        as being fetched, unmarked here whatever happens): each run of consecutive ones in range
        requests of up to :attr:`request_bytes` (each with :meth:`_request`'s retries and length
        check), kept in memory, joined to the block's other bytes there; ``(offset, data)`` of
        each. ``optional`` (read-ahead): a block is dropped rather than evict a pinned file, and
        a failed request ends the fetch without raising: after its retries, a reader fetches the
        bytes again; a refusal (404, 401, 403) is raised to the file's next reader."""
        per_request = max(1, self.request_bytes // block_bytes)
        runs: list[list[int]] = []
        for i in sorted(parts):
            run = runs[-1] if runs else None
            joins = run and i == run[-1] + 1 and parts[run[-1]][1] == parts[i][0]
            if joins and len(run) < per_request:
                run.append(i)
            else:
                runs.append([i])
        got: dict[int, tuple[int, bytes]] = {}
        try:
            for run in runs:
                start, end = parts[run[0]][0], parts[run[-1]][1] - 1
                try:
                    body = self.read_range(path, start, end)
                except DatasetError as exc:
                    if not optional:
                        raise
                    log.warning("%s: reading ahead bytes %d-%d failed: %s", path, start, end, exc)
                    self.hand_over(path, exc)
                    return got
                with self._lock:
                    self.block_requests += 1
                    self.block_fetches[path] = self.block_fetches.get(path, 0) + len(run)
                    self.range_bytes[path] = self.range_bytes.get(path, 0) + len(body)
                for i in run:
                    a, b = parts[i]
                    name = self._block_name(path, block_bytes, i)
                    got[i] = self._keep_block(name, a, body[a - start : b - start], optional)
        finally:
            with self._lock:
                self._loading.difference_update(
                    self._block_name(path, block_bytes, i) for i in parts
                )
                self._lock.notify_all()
        return got

    def _keep_block(self, name: str, offset: int, data: bytes, optional: bool) -> tuple[int, bytes]:
        """Keep bytes ``data`` (from file offset ``offset``) of block ``name``, joined to its
        bytes in memory where they touch; the block's ``(offset, data)`` then."""
        with self._lock:
            old = self._entries.get(name)
            if old is not None and old.data is not None:
                lo, hi = min(offset, old.offset), max(offset + len(data), old.offset + old.size)
                if hi - lo <= len(data) + old.size:  # they touch or overlap: one run of bytes
                    joined = bytearray(hi - lo)
                    joined[old.offset - lo : old.offset - lo + old.size] = old.data
                    joined[offset - lo : offset - lo + len(data)] = data
                    offset, data = lo, bytes(joined)
        if not self._make_room(name, len(data), optional=optional):
            return offset, data
        with self._lock:
            entry = self._entries[name]
            entry.data, entry.offset, entry.pins, entry.ahead = data, offset, 0, optional
            self._ahead += entry.size if optional else 0
            self.peak_bytes = max(self.peak_bytes, self._used)
        return offset, data

    def store(self, name: str, data: bytes) -> Path:
        """Keep ``data`` (made from repository files, e.g. an episode's rows) in the cache as
        ``name``, counted against the bound and pinned once (:meth:`release` it)."""
        self._make_room(name, len(data))
        target = self.local_path(name)
        try:
            # Not durable: the cache's files do not outlive the run (removed at the next start).
            write_bytes_atomic(target, data, durable=False)
        except BaseException:
            with self._lock:
                self._drop(name)
            raise
        with self._lock:
            self.peak_bytes = max(self.peak_bytes, self._used)
        return target

    def _drop(self, name: str) -> None:
        """Under the lock: forget entry ``name`` (its file removed, a block let go)."""
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        self._used -= entry.size
        if entry.ahead:
            self._ahead -= entry.size
        if entry.data is None:
            self.local_path(name).unlink(missing_ok=True)

    def _evict_unpinned(self, size: int) -> int:
        """Evict unpinned entries, oldest first, until ``size`` more bytes fit; the bytes left."""
        if self._used + size <= self.max_bytes:
            return self._used
        victims, freed = [], 0
        for name, entry in self._entries.items():
            if self._used - freed + size <= self.max_bytes:
                break
            if entry.pins == 0:
                victims.append(name)
                freed += entry.size
        for name in victims:
            self._drop(name)
        return self._used

    def _make_room(self, path: str, size: int, *, optional: bool = False) -> bool:
        """Evict unpinned entries (oldest first) until ``size`` more bytes fit, and reserve the
        room by recording ``path``'s size (pinned once). When the pinned files leave no room:
        False if ``optional``, else DatasetError (after the reader's ``on_full`` could not
        free any)."""
        while True:
            with self._lock:
                old = self._entries.pop(path, None)  # rewritten (a reopened group's rows)
                if old is not None:
                    self._used -= old.size
                    self._ahead -= old.size if old.ahead else 0
                used = self._evict_unpinned(size)
                if used + size <= self.max_bytes:
                    # Held as pinned while it downloads, so that no other fetch takes its room.
                    self._entries[path] = _Entry(size=size, pins=1)
                    self._used += size
                    return True
                if optional:
                    return False
                pinned = [n for n, e in self._entries.items() if e.pins]
            # Outside the lock: the reader's callback takes its own lock, then releases files.
            if self.on_full is None or not self.on_full():
                raise DatasetError(
                    f"{self.repo_id}@{self.revision[:12]}: {path} ({_mib(size)}) does not fit the "
                    f"streaming cache of {_mib(self.max_bytes)} next to the {len(pinned)} files "
                    f"in use ({_mib(used)}). Raise --dataset.streaming_cache_mb."
                )

    def _url(self, path: str) -> str:
        from huggingface_hub import hf_hub_url

        return hf_hub_url(
            self.repo_id,
            path,
            repo_type=self.repo_type,
            revision=self.revision,
            endpoint=self.endpoint,
        )

    def _fail(self, path: str, status: int, detail: str) -> DatasetError:
        what = {
            401: "the token was refused (missing, invalid or revoked): check HF_TOKEN",
            403: "access denied: check that HF_TOKEN may read the repository",
            404: "not found in the repository at this commit: the metadata references a "
            "missing file, or the revision is wrong",
        }.get(status, f"HTTP {status}")
        error = DatasetError(
            f"{self.repo_id}@{self.revision[:12]}: {path}: {what} ({detail.strip()[:200]})"
        )
        error.http_status = status  # a refusal, not worth retrying
        return error

    def _request(self, path: str, start: int | None, end: int | None):
        """One GET of bytes ``start``..``end`` (or HEAD when ``start`` is None) with the retries
        of :func:`~lerobot_pipe.utils.hub_http.with_retries`; the response of a success. A body
        shorter than the range asked for is retried like a dropped connection."""
        from huggingface_hub import get_session
        from huggingface_hub.utils import build_hf_headers

        headers = build_hf_headers(token=self.token)
        if start is not None:
            headers["Range"] = f"bytes={start}-{end}"
        method = "GET" if start is not None else "HEAD"

        def request():
            response = get_session().request(
                method, self._url(path), headers=headers, follow_redirects=True
            )
            status = response.status_code
            if status in TRANSIENT_STATUSES:
                raise TransientResponse(f"HTTP {status}", retry_after_s(response.headers))
            if status >= 400:
                raise self._fail(path, status, response.text)
            if start is not None:
                want = end - start + 1
                if status != 206 or len(response.content) != want:
                    raise TransientResponse(
                        f"HTTP {status} with {len(response.content)} of {want} bytes"
                    )
            return response

        reading = f"reading bytes {start}-{end}" if start is not None else "reading the size"
        try:
            return with_retries(
                request,
                what=f"{reading} of {path}",
                retries=self.retries,
                backoff_s=self.backoff_s,
                secrets=self._secrets,
            )
        except RetriesExhausted as exc:
            raise DatasetError(
                f"{self.repo_id}@{self.revision[:12]}: {path}: {reading} failed "
                f"{exc.attempts} times, last: {redact(str(exc.last), self._secrets)}. Check the network (the "
                "run can resume from its last checkpoint)."
            ) from exc

    def _fetch(self, path: str) -> int:
        head = self._request(path, None, None)
        size = int(head.headers.get("X-Linked-Size") or head.headers["Content-Length"])
        etag = (head.headers.get("X-Linked-Etag") or head.headers.get("ETag") or "").strip('"')
        etag = re.sub(r"^W/", "", etag).strip('"')
        self._make_room(path, size)
        digest = hashlib.sha256() if len(etag) == 64 else hashlib.sha1()
        if len(etag) != 64:
            digest.update(f"blob {size}\0".encode())
        try:
            # The ETag is checked before the file takes its name, so no reader sees a wrong byte.
            with atomic_open(self.local_path(path), durable=False) as out:
                for start in range(0, size, self.chunk_bytes):
                    end = min(start + self.chunk_bytes, size) - 1
                    body = self._request(path, start, end).content
                    with self._lock:
                        self.bytes_fetched += len(body)
                    digest.update(body)
                    out.write(body)
                if etag and len(etag) in (40, 64) and digest.hexdigest() != etag:
                    raise DatasetError(
                        f"{self.repo_id}@{self.revision[:12]}: {path}: the fetched bytes do not "
                        f"match the Hub's ETag {etag} (got {digest.hexdigest()}); the file was "
                        "not used."
                    )
        except BaseException:
            with self._lock:
                self._drop(path)
            raise
        with self._lock:
            self.fetches[path] = self.fetches.get(path, 0) + 1
        return size


def _parts(
    first: int, last: int, block_bytes: int, start: int, stop: int
) -> dict[int, tuple[int, int]]:
    """Blocks ``first``..``last`` -> the file bytes ``[a, b)`` of each within ``start``..``stop``."""
    return {
        i: (max(start, i * block_bytes), min(stop, (i + 1) * block_bytes))
        for i in range(first, last + 1)
    }
