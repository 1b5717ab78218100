"""File helpers shared by the checkpoints, the converter, the dataset cache, the configs and the
pipeline's receipts: THE atomic write (:func:`atomic_path` and the helpers built on it) and the
one JSON reader with errors that name the file.

An atomic write goes to a temporary file beside the target (hidden, named after it, this
process's pid and a random part: :func:`temporary_path`), is fsynced, and renamed over the target
(``os.replace``), the folder fsynced too so that the rename survives a crash: a reader finds the
old file or the whole new one, never a part. A failed write removes its temporary file; a killed
one leaves it, and :func:`writer_pid` tells whose it was."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TMP_MARKER = ".tmp-"


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a folder (a folder's fsync makes the renames and creations in it durable)."""
    fd = os.open(Path(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(path: str | os.PathLike[str]) -> None:
    """fsync a folder (making the renames in it durable) where the file system allows it: some
    refuse a folder's fsync, and the rename itself is done by then."""
    with contextlib.suppress(OSError):
        fsync_path(path)


def temporary_path(path: str | os.PathLike[str]) -> Path:
    """Where an atomic write of ``path`` writes first: ``.<name>.tmp-<pid>-<random>`` beside it,
    unique to this writer, so that two writers never share one."""
    path = Path(path)
    return path.with_name(f".{path.name}{TMP_MARKER}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def writer_pid(temporary: str | os.PathLike[str]) -> int | None:
    """The pid of the process that wrote a :func:`temporary_path` name, None for another name."""
    name = Path(temporary).name
    if not name.startswith(".") or TMP_MARKER not in name:
        return None
    pid = name.rsplit(TMP_MARKER, 1)[1].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, durable: bool = True) -> Iterator[Path]:
    """The temporary path to write ``path``'s new content to (its folder created if needed); it
    replaces ``path`` when the block ends without an error, and is removed when it raises.
    ``durable``: the file is fsynced before the rename and the folder after it (a cache whose
    files do not outlive the process may skip both)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        yield tmp
        if durable:
            fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_folder(path.parent)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], *, durable: bool = True) -> Iterator[IO[bytes]]:
    """A binary file to write ``path``'s new content into, streaming; see :func:`atomic_path`."""
    with atomic_path(path, durable=durable) as tmp, open(tmp, "wb") as out:
        yield out


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int = 4) -> None:
    """Write ``data`` as indented JSON (a final newline) to ``path`` atomically, durably."""
    write_bytes_atomic(path, (json.dumps(data, indent=indent) + "\n").encode())


def read_json(
    path: str | os.PathLike[str],
    what: str,
    error: type[Exception] = ValueError,
    expect: type[dict] | type[list] = dict,
) -> Any:
    """The JSON object (``expect=list``: array) in ``path``; ``error`` (ValueError by default)
    naming ``what`` and the file when it is missing, unreadable, not JSON or of another kind."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"cannot read {what} {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(
            f"{what} {path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from None
    if not isinstance(data, expect):
        kind = "an object" if expect is dict else "an array"
        raise error(f"{what} {path}: must hold a JSON {kind}")
    return data
