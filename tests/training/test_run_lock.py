"""One trainer per output folder: the run lock, its holder's record, its release when the holder
dies (SIGKILL included), the file systems it warns about, and two real lerobot-train processes
on one --output_dir."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch import hold_run_lock_in_another_process, launcher_env
from tiny import tiny_act_flags

from lerobot_pipe.constants import PROGRESS_EVENTS, RUN_LOCK
from lerobot_pipe.training.run_lock import (
    RunLockError,
    acquire_run_lock,
    check_run_lock,
    mount_of,
    mount_warning,
)


def test_the_holder_is_recorded_and_named(tmp_path):
    out = tmp_path / "run"
    with acquire_run_lock(out) as lock:
        record = json.loads((out / RUN_LOCK).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert record["started"] and record["command"]
        # flock belongs to the open file: a second open in this very process is refused too.
        for attempt in (acquire_run_lock, check_run_lock):
            with pytest.raises(RunLockError) as err:
                attempt(out)
            message = str(err.value)
            assert f"pid {os.getpid()} on host {socket.gethostname()}" in message
            assert f"kill {os.getpid()}" in message and "\n" not in message
        assert lock.path == out / RUN_LOCK
    check_run_lock(out)  # released
    assert (out / RUN_LOCK).read_text() == ""


def test_checking_a_free_folder_writes_nothing(tmp_path):
    check_run_lock(tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()


def test_a_sigkilled_holder_leaves_no_lock(tmp_path):
    out = tmp_path / "run"
    holder = hold_run_lock_in_another_process(out)
    with pytest.raises(RunLockError, match=f"pid {holder.pid} "):
        check_run_lock(out)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    # Its record stays behind, but the kernel released the lock with the process.
    assert json.loads((out / RUN_LOCK).read_text())["pid"] == holder.pid
    check_run_lock(out)
    with acquire_run_lock(out):
        assert json.loads((out / RUN_LOCK).read_text())["pid"] == os.getpid()


def test_the_slurm_job_is_named_with_how_to_cancel_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with acquire_run_lock(tmp_path), pytest.raises(RunLockError) as err:
        check_run_lock(tmp_path)
    assert "SLURM job 4242" in str(err.value) and "scancel 4242" in str(err.value)


MOUNTS = r"""/dev/vda / ext4 rw,relatime 0 0
server:/export /nfs/home nfs4 rw,vers=4.2,local_lock=none 0 0
server:/old /nfs/old nfs rw,vers=3,nolock 0 0
server:/flock /nfs/flock nfs4 rw,local_lock=flock 0 0
mgs@tcp:/fs /lustre/good lustre rw,flock,lazystatfs 0 0
mgs@tcp:/fs /lustre/local lustre rw,localflock 0 0
mgs@tcp:/fs /lustre/none lustre rw,noflock 0 0
me@host:/data /mnt/my\040data fuse.sshfs rw,nosuid 0 0
beegfs_nodev /beegfs beegfs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "warning"),
    [
        ("/home/me/run", None),
        ("/nfs/home/me/run", None),
        ("/nfs/old/run", "local to this node"),
        ("/nfs/flock/run", "local to this node"),
        ("/lustre/good/run", None),
        ("/lustre/local/run", "localflock"),
        ("/lustre/none/run", "without the flock option"),
        ("/mnt/my data/run", "FUSE"),
        ("/beegfs/run", "tuneUseGlobalFileLocks"),
    ],
)
def test_file_systems_whose_locks_do_not_hold_are_named(path, warning):
    found = mount_warning(path, MOUNTS)
    if warning is None:
        assert found is None
    else:
        assert warning in found and path in found


def test_the_deepest_mount_wins():
    assert mount_of("/mnt/my data/x", MOUNTS)[:2] == ("/mnt/my data", "fuse.sshfs")
    assert mount_of("/nfs/homework", MOUNTS)[:2] == ("/", "ext4")


@pytest.mark.slow
def test_a_second_trainer_on_the_folder_fails_at_once_naming_the_first(dataset_root, tmp_path):
    """Two real lerobot-train processes on one --output_dir; then the first is SIGKILLed and
    its leftover lock file does not stop the next run."""
    out = tmp_path / "out"
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "output_dir": out, "batch_size": 4})
    train = [str(Path(sys.executable).parent / "lerobot-train"), *flags]
    first = subprocess.Popen(
        [*train, "--steps=100000", "--save_freq=0", "--log_freq=1000"],
        env=launcher_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / RUN_LOCK).is_file() or str(first.pid) not in (out / RUN_LOCK).read_text():
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        # The first trainer's own progress events keep coming: the second must write nothing.
        before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != PROGRESS_EVENTS}

        start = time.monotonic()
        second = subprocess.run(
            [*train, "--steps=4"], env=launcher_env(), capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 2, second.stderr[-2000:]
        errors = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and "Traceback" not in second.stderr, second.stderr
        assert f"pid {first.pid} on host {socket.gethostname()}" in errors[0]
        assert f"--output_dir={out} is in use" in errors[0]
        assert {p: p.stat().st_mtime_ns for p in before} == before  # nothing written
        print(f"second lerobot-train refused after {time.monotonic() - start:.1f} s")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()

    assert json.loads((out / RUN_LOCK).read_text())["pid"] == first.pid  # its stale record
    third = subprocess.run(
        [*train, "--steps=2", "--save_freq=2"],
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert third.returncode == 0, third.stderr[-3000:]
    assert (out / "checkpoints/000002/training_state/training_step.json").is_file()
