"""An in-process multi-process launcher for tests: forks ``world_size`` ranks with the same
environment torchrun would give them (real gloo process groups), much cheaper than torchrun.
Also the environment for starting real launchers, and a stand-in trainer holding a run lock."""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing as mp
import os
import pickle
import queue as queue_module
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(
    fn: Callable, rank: int, world_size: int, port: int, env: dict, args: tuple, queue
) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            **env,
        }
    )
    import torch

    torch.set_num_threads(1)
    # On a timeout the parent asks every rank where it stands (see _report_hang).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        # Plain pickle copies tensor data inline; the queue's own reducer would pass shared-memory
        # handles that vanish when this process exits.
        queue.put((rank, "ok", pickle.dumps(fn(*args))))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


# A process that takes an output folder's run lock, says so, and holds it until killed.
_HOLD_RUN_LOCK = (
    "import sys, time\n"
    "from lerobot_pipe.training.run_lock import acquire_run_lock\n"
    "lock = acquire_run_lock(sys.argv[1])\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


def _report_hang(procs: list) -> str:
    """Each live rank's Python stacks (faulthandler, on its stderr) and the CPU scheduling of
    its threads and of every real-time thread on the machine (a SCHED_FIFO process starves
    the ranks on a small machine)."""
    lines = []
    for r, p in enumerate(procs):
        if p.is_alive():
            os.kill(p.pid, signal.SIGUSR1)
            lines.append(f"rank {r} (pid {p.pid}) alive; its stacks follow on stderr")
        else:
            lines.append(f"rank {r} (pid {p.pid}) exited with {p.exitcode}")
    ps = subprocess.run(
        ["ps", "-eLo", "pid,tid,cls,rtprio,pcpu,stat,comm"], capture_output=True, text=True
    ).stdout.splitlines()
    pids = {str(p.pid) for p in procs}
    lines += [
        line
        for line in ps[1:]
        if line.split()[0] in pids or line.split()[2] in ("FF", "RR") and "migration" not in line
    ]
    time.sleep(2)  # let faulthandler write
    return "\n".join(lines)


def hold_run_lock_in_another_process(output_dir: str | os.PathLike) -> subprocess.Popen:
    """A trainer stand-in holding ``output_dir``'s run lock (kill it when done)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_RUN_LOCK, str(output_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def launcher_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher or accelerate variables, for starting a real
    launcher (torchrun, accelerate launch) from a test."""
    launcher = ("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher)}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def run_distributed(
    fn: Callable, world_size: int, *args: Any, env: dict | None = None, timeout: float = 240
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` forked ranks; return the per-rank results (rank order).
    Any rank's exception fails the call with that rank's traceback."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_child, args=(fn, r, world_size, port, env or {}, args, queue), daemon=True
        )
        for r in range(world_size)
    ]
    # The ranks inherit every object of this (long-lived, threaded) pytest process. A garbage
    # collection in a rank that runs the finalizer of an inherited object (whose lock another
    # thread of this process held at the fork) hangs that rank: seen in fully_shard, in the
    # fast tier, after many earlier tests. Frozen objects are never collected in the ranks.
    gc.collect()
    gc.freeze()
    try:
        for p in procs:
            p.start()
    finally:
        gc.unfreeze()
    results: dict[int, Any] = {}
    errors = []
    try:
        for _ in range(world_size):
            try:
                rank, status, value = queue.get(timeout=timeout)
            except queue_module.Empty:
                raise TimeoutError(
                    f"no result from every rank within {timeout:.0f} s\n{_report_hang(procs)}"
                ) from None
            if status == "ok":
                results[rank] = pickle.loads(value)
            else:
                errors.append(f"rank {rank}: {value}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 1)
            if p.is_alive():
                p.kill()
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[r] for r in range(world_size)]
