"""Pins: checkpoints that retention (``--checkpoint_keep_last``) must keep whatever their age.

A pin is a small file ``<output_dir>/pins/<step folder>.<reason>`` beside ``checkpoints/``
(never inside a complete checkpoint folder, which is not modified after its rename). Reasons:

- ``best``: the checkpoint the pipeline chose by its evaluation (one at a time: choosing another
  moves the pin), kept so that later training with retention does not delete it;
- ``evaluate`` / ``publish``: the checkpoint a pipeline job is evaluating or publishing now,
  pinned for the job's length (:func:`pinned`);
- ``pending``: a checkpoint a training segment of the pipeline will save (pinned before it
  exists), kept until the pipeline has evaluated it (converted it, when it does not evaluate):
  training never waits for its evaluation, retention skips it meanwhile (and logs so).

:func:`~lerobot_pipe.checkpoint.layout.prune_checkpoints` reads them, as it reads ``last``. A job
killed hard leaves its pin: the checkpoint then stays until the same job runs again (it removes
its pin when it ends) or ``lerobot-pipe unpin`` removes it. Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from lerobot_pipe import constants as C
from lerobot_pipe.fsutil import write_json_atomic

REASONS = ("best", "evaluate", "publish", "pending")


def pins_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / C.PINS_DIR


def _check(step: str, reason: str) -> None:
    if reason not in REASONS:
        raise ValueError(f"pin reason {reason!r}: one of {', '.join(REASONS)}")
    if not step.isdigit():
        raise ValueError(f"pin step {step!r}: a checkpoint step folder name (e.g. 000020)")


def pin(output_dir: str | Path, step: str, reason: str) -> Path:
    """Pin checkpoint ``step`` (its folder name) for ``reason``; the file records who pinned it."""
    _check(step, reason)
    path = pins_dir(output_dir) / f"{step}.{reason}"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        path,
        {
            "step": step,
            "reason": reason,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "time": time.time(),
        },
    )
    return path


def unpin(output_dir: str | Path, step: str, reason: str) -> None:
    _check(step, reason)
    (pins_dir(output_dir) / f"{step}.{reason}").unlink(missing_ok=True)


def move_pin(output_dir: str | Path, reason: str, steps: Iterable[str]) -> None:
    """Pin exactly ``steps`` for ``reason``: new pins first, then the others removed (so at
    every instant each of ``steps`` is pinned)."""
    keep = set(steps)
    for step in keep:
        pin(output_dir, step, reason)
    for step, reasons in pinned_steps(output_dir).items():
        if reason in reasons and step not in keep:
            unpin(output_dir, step, reason)


def pinned_steps(output_dir: str | Path) -> dict[str, set[str]]:
    """Step folder name -> the reasons it is pinned for."""
    root = pins_dir(output_dir)
    found: dict[str, set[str]] = {}
    if root.is_dir():
        for path in root.iterdir():
            step, _, reason = path.name.partition(".")
            if step.isdigit() and reason in REASONS:
                found.setdefault(step, set()).add(reason)
    return found


@contextlib.contextmanager
def pinned(output_dir: str | Path, step: str, reason: str) -> Iterator[Path]:
    """Pinned for the ``with`` block, unpinned after it however it ends."""
    path = pin(output_dir, step, reason)
    try:
        yield path
    finally:
        unpin(output_dir, step, reason)
