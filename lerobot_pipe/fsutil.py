"""File helpers shared by the checkpoints, the converter, the configs and the pipeline's receipts:
atomic JSON writes (fsynced, folder included) and the one JSON reader with errors that name the file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a folder (a folder's fsync makes the renames and creations in it durable)."""
    fd = os.open(Path(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` (its folder created if needed): a temporary
    file, fsynced, renamed into place (the folder fsynced too, so the rename is durable): a reader
    finds the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=4) + "\n")
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent)


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
