"""Fault injection for tests: kill (or delay) this process at a named point of the save / training
path.

``LEROBOT_PIPE_FAULT_POINT=<name>[@<step>][:rank<r>]`` SIGKILLs the matching rank (any rank when
no rank is given) the first time it reaches ``<name>`` (at step ``<step>`` when given).
``LEROBOT_PIPE_FAULT_DELAY=<name>[@<step>][:rank<r>]=<seconds>`` sleeps there instead, every
time (a slow disk, a slow rank). ``LEROBOT_PIPE_FAULT_WAIT=<name>[@<step>][:rank<r>]=<path>`` holds
the process there until ``<path>`` exists (another job got somewhere), at most
:data:`WAIT_LIMIT_S` seconds, then goes on. Unset, a call costs a few dictionary lookups.

The step of a point is the training loop's step, except inside a checkpoint save, which may run
in a background thread while the loop moves on: there it is the step being saved
(:func:`saving_step`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

from lerobot_pipe.constants import ENV_FAULT_DELAY, ENV_FAULT_POINT, ENV_FAULT_WAIT

WAIT_LIMIT_S = 600.0

_current_step: int | None = None
_thread = threading.local()


def set_step(step: int) -> None:
    global _current_step
    _current_step = step


@contextlib.contextmanager
def saving_step(step: int) -> Iterator[None]:
    """Fault points reached in this thread inside the block belong to the save of ``step``."""
    previous = getattr(_thread, "step", None)
    _thread.step = step
    try:
        yield
    finally:
        _thread.step = previous


def _matches(spec: str, name: str) -> bool:
    point, _, rank = spec.partition(":rank")
    point, _, step = point.partition("@")
    if point != name:
        return False
    current = getattr(_thread, "step", None)
    current = _current_step if current is None else current
    if step and (current is None or int(step) != current):
        return False
    return not rank or int(rank) == int(os.environ.get("RANK", "0"))


def fault_point(name: str) -> None:
    spec = os.environ.get(ENV_FAULT_POINT)
    if spec and _matches(spec, name):
        os.kill(os.getpid(), signal.SIGKILL)
    delay = os.environ.get(ENV_FAULT_DELAY)
    if delay:
        spec, _, seconds = delay.rpartition("=")
        if _matches(spec, name):
            time.sleep(float(seconds))
    wait = os.environ.get(ENV_FAULT_WAIT)
    if wait:
        spec, _, path = wait.partition("=")
        if _matches(spec, name) and not os.path.exists(path):
            print(f"fault point {name}: holding until {path} exists", file=sys.stderr, flush=True)
            deadline = time.monotonic() + WAIT_LIMIT_S
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.1)
