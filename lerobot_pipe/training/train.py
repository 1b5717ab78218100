"""lerobot-train's run: the planned training (training/preflight.py) on every rank, from the
process group's start to its end. The session (training/session.py) builds what the loop
(training/loop.py) trains."""

from __future__ import annotations

from pathlib import Path

from lerobot_pipe.distributed.runtime import destroy, init_distributed
from lerobot_pipe.training.host_memory import keep_freed_host_memory
from lerobot_pipe.training.loop import run_loop
from lerobot_pipe.training.preflight import TrainingPlan
from lerobot_pipe.training.progress import event_channel
from lerobot_pipe.training.run_lock import hold_run_lock
from lerobot_pipe.training.session import prepare_session


def train(plan: TrainingPlan) -> Path | None:
    """Run the planned training; returns the last checkpoint folder written (None if none).

    Raises :class:`RunLockError` on every rank when another trainer holds the output folder.
    """
    keep_freed_host_memory()  # each step's host tensors reuse the last step's pages
    env = init_distributed()
    try:
        with hold_run_lock(plan.output_dir, env), event_channel(plan.output_dir, env) as channel:
            return run_loop(env, prepare_session(plan, env), channel)
    finally:
        destroy()
