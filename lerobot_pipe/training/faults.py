"""Fault injection for tests: kill this process at a named point of the save / training path.

``LEROBOT_PIPE_FAULT_POINT=<name>[@<step>][:rank<r>]`` SIGKILLs the matching rank (any rank when
no rank is given) the first time it reaches ``<name>`` (at step ``<step>`` when given). Unset, a
call costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

from lerobot_pipe.constants import ENV_FAULT_POINT

_current_step: int | None = None


def set_step(step: int) -> None:
    global _current_step
    _current_step = step


def fault_point(name: str) -> None:
    spec = os.environ.get(ENV_FAULT_POINT)
    if not spec:
        return
    point, _, rank = spec.partition(":rank")
    point, _, step = point.partition("@")
    if point != name:
        return
    if step and (_current_step is None or int(step) != _current_step):
        return
    if rank and int(rank) != int(os.environ.get("RANK", "0")):
        return
    os.kill(os.getpid(), signal.SIGKILL)
