"""Logging of every console script: lerobot_pipe's INFO on the main rank, warnings and errors
(other libraries' too) on every rank, on stderr; and the one-line error report
``<command>: error: <what went wrong and what to do>``."""

from __future__ import annotations

import logging
import sys

_log = logging.getLogger("lerobot_pipe.scripts")


def setup_logging(rank: int = 0) -> None:
    prefix = f"[rank{rank}] " if rank else ""
    logging.basicConfig(
        level=logging.WARNING,
        format=f"{prefix}%(levelname)s %(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
    # Other libraries' INFO (e.g. every HTTP request of huggingface_hub's client) stays out.
    logging.getLogger("lerobot_pipe").setLevel(logging.INFO if rank == 0 else logging.WARNING)


def report_error(command: str, message: object) -> None:
    """Log why ``command`` failed, on one line."""
    _log.error("%s: error: %s", command, " ".join(str(message).split()))
