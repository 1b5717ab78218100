"""Logging for the console scripts: INFO on the main rank, warnings and errors on every rank."""

from __future__ import annotations

import logging
import sys


def setup_logging(rank: int = 0) -> None:
    prefix = f"[rank{rank}] " if rank else ""
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"{prefix}%(levelname)s %(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
