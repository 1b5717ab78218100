"""Durability helper shared by the checkpoint writer and the converter."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a folder (a folder's fsync makes the renames and creations in it durable)."""
    fd = os.open(Path(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
