"""The pipeline's train launcher (lerobot-pipe launch-train): it refuses a run folder another
trainer holds before launching anything, and the processes it starts die with the process that
started it, however that one dies, or when it is told to stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch import hold_run_lock_in_another_process, launcher_env

from lerobot_pipe.pipeline.train_job import is_running

# The supervised command: a child that ignores SIGTERM (like a stuck trainer) and a grandchild
# in a session of its own (where torchrun puts its workers) that ignores it too.
CHILD = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen(
    [sys.executable, "-c",
     "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True,
)
print(f"pids {worker.pid}", flush=True)
time.sleep(600)
"""
# The launcher's supervisor around CHILD, with a 1 s grace period before SIGKILL.
SUPERVISOR = f"""
import sys
from pathlib import Path
from lerobot_pipe.pipeline.train_job import Supervisor, Terminal
from lerobot_pipe.training.progress import EventFollower
log_path = Path(sys.argv[1])
with open(log_path, "w") as log_file:
    events = EventFollower(log_path.with_name("progress.jsonl"))
    supervisor = Supervisor(log_file, events, Terminal(sys.stderr), grace_s=1.0)
    sys.exit(supervisor.run([sys.executable, "-c", {CHILD!r}], {{}}))
"""
# What Snakemake is to the launcher: the parent that starts it and may die.
PARENT = f"""
import subprocess, sys
print(subprocess.Popen([sys.executable, "-c", {SUPERVISOR!r}, sys.argv[1]]).pid, flush=True)
import time; time.sleep(600)
"""


def _wait_for(predicate, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, what
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.mark.parametrize("how", ["parent SIGKILLed", "SIGTERM"])
def test_the_supervised_tree_stops_when_the_parent_dies_or_on_a_signal(tmp_path, how):
    log = tmp_path / "train.log"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(log)], stdout=subprocess.PIPE, text=True
    )
    supervisor = int(parent.stdout.readline())
    _wait_for(lambda: "pids" in log.read_text() if log.exists() else False, 60, "no child")
    worker = int(log.read_text().split("pids ")[1].split()[0])
    (child,) = [
        int(p) for p in os.listdir("/proc") if p.isdigit() and _parent_of(int(p)) == supervisor
    ]
    if how == "SIGTERM":
        os.kill(supervisor, signal.SIGTERM)
    else:
        parent.send_signal(signal.SIGKILL)
    seconds = _wait_for(
        lambda: not any(map(is_running, (supervisor, child, worker))), 20, "still running"
    )
    print(f"{how}: supervisor, child and worker gone after {seconds:.2f} s")
    # 1 s of grace for the SIGTERM the child ignores, then SIGKILL to it and to the worker.
    assert seconds < 5
    text = log.read_text()
    reason = "SIGTERM received" if how == "SIGTERM" else f"(pid {parent.pid}) is gone"
    assert "stopping training: " in text and reason in text and "SIGKILL to" in text
    parent.kill()
    parent.wait()


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def test_a_held_run_is_refused_before_anything_is_launched(dataset_root, tmp_path):
    out = tmp_path / "train"
    holder = hold_run_lock_in_another_process(out)
    log = tmp_path / "logs/train.log"
    try:
        proc = subprocess.run(
            [
                str(Path(sys.executable).parent / "lerobot-pipe"),
                "launch-train",
                "--nproc_per_node=2",
                f"--log={log}",
                f"--final_checkpoint={tmp_path / 'final.json'}",
                "--policy.type=act",
                f"--dataset.root={dataset_root}",
                f"--output_dir={out}",
            ],
            env=launcher_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2
    assert f"pid {holder.pid} on host" in proc.stderr and "Traceback" not in proc.stderr
    assert f"pid {holder.pid} on host" in log.read_text()
    assert "torchrun" not in log.read_text()
    assert not (tmp_path / "final.json").exists()


def test_the_jobs_log_links_to_a_history_that_snakemake_never_deletes(tmp_path):
    from lerobot_pipe.pipeline.train_job import link_to_history

    log = tmp_path / "logs/train.log"
    log.parent.mkdir()
    log.write_text("an earlier version's log\n")
    history = link_to_history(log)
    assert history == tmp_path / "logs/train-history.log"
    assert log.is_symlink() and os.readlink(log) == "train-history.log"
    with open(log, "a") as f:
        f.write("attempt 2\n")
    log.unlink()  # what Snakemake does with a job's log before each attempt
    assert link_to_history(log) == history and link_to_history(log) == history
    with open(log, "a") as f:
        f.write("attempt 3\n")
    assert log.read_text() == "an earlier version's log\nattempt 2\nattempt 3\n"
