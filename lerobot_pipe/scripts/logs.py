"""Logging of every console script: lerobot_pipe's INFO on the main rank, warnings and errors
(other libraries' too) on every rank, on stderr; and the one-line error report
``<command>: error: <what went wrong and what to do>``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

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


def run_reported(
    command: str,
    what: str,
    call: Callable[[], Any],
    *,
    expected: tuple[type[Exception], ...] = (),
    expected_status: int = 2,
    interrupted: str = "interrupted",
) -> tuple[int, Any]:
    """``(0, call())``, or the exit status after one line on the console: ``expected_status``
    for an ``expected`` error (its message says what to do), 130 for Ctrl-C, 1 for anything
    else (``<what> failed: ...``; the traceback only in the debug log, never on the console)."""
    try:
        return 0, call()
    except expected as e:
        report_error(command, e)
        return expected_status, None
    except KeyboardInterrupt:
        report_error(command, interrupted)
        return 130, None
    except Exception as e:
        _log.debug("%s failed", what, exc_info=True)
        report_error(command, f"{what} failed: {type(e).__name__}: {e}")
        return 1, None
