"""Durability helpers shared by the checkpoint writer, the converter and the pipeline's receipts."""

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
    file, fsynced, renamed into place, so a reader finds the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=4) + "\n")
    fsync_path(tmp)
    os.replace(tmp, path)
