"""The run lock: one trainer per output folder.

The main process of a training run locks ``<output_dir>/run.lock`` (``flock(LOCK_EX)``) before
anything is written into the folder and holds it for its whole life. The kernel releases the
lock when that process exits, however it exits (SIGKILL and OOM kills included), so it never
goes stale the way a PID file does. The file stays; while locked it records the holder (host,
pid, start time, command, SLURM job), which is what a second trainer's error names.

Why ``flock`` and not POSIX (``fcntl``) record locks: a POSIX lock belongs to the process and
is dropped as soon as the process closes *any* descriptor of the file (reading the holder's
record would release it); a flock belongs to the open file description. On Linux, flock on NFS
is sent to the server as a whole-file byte-range lock, so it holds across NFS clients, and
Lustre honours it across nodes when mounted with ``flock``. docs/run-lock.md says what holds
where; :func:`mount_warning` names the mounts where it does not.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from lerobot_pipe import constants as C

if TYPE_CHECKING:
    from lerobot_pipe.distributed.runtime import DistEnv

log = logging.getLogger(__name__)

# flock errors of file systems without lock support (Lustre mounted noflock, some FUSE and
# network file systems): the run goes on without the lock, with a warning.
_UNSUPPORTED = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}
# The holder writes its record right after taking the lock; a reader that finds the lock held
# but the record still empty waits this long for it.
_RECORD_WAIT_S = 2.0


class RunLockError(RuntimeError):
    """Another trainer holds the output folder (or its lock file cannot be opened). The message
    names the holder and what to do."""


def lock_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / C.RUN_LOCK


class RunLock:
    """The held run lock of one output folder; :meth:`release` (or process exit) frees it."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        # An empty record means "free"; a trainer killed before this line leaves its record,
        # which the next holder overwrites.
        os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the last descriptor releases the flock
        self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder_record(output_dir: Path) -> dict:
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "output_dir": str(output_dir),
    }
    if os.environ.get("SLURM_JOB_ID"):
        record["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
    return record


def read_holder(path: Path) -> dict | None:
    """The record of the process holding ``path`` (None when empty or unreadable)."""
    deadline = time.monotonic() + _RECORD_WAIT_S
    while True:
        try:
            text = path.read_text()
        except OSError:
            return None
        if text.strip():
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                record = None
            return record if isinstance(record, dict) else None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def describe_holder(path: Path, record: dict | None) -> str:
    """'--output_dir=X is in use by ...; ... then run again', on one line."""
    output_dir = path.parent
    if record is None:
        return (
            f"--output_dir={output_dir} is in use: another process holds its run lock {path} "
            "(it has not recorded itself yet); wait for it to finish or stop it, then run again"
        )
    host, pid = record.get("host", "?"), record.get("pid", "?")
    who = f"pid {pid} on host {host}, started {record.get('started', '?')}"
    job = record.get("slurm_job_id")
    if job:
        who += f", SLURM job {job}"
    if job:
        stop = f"scancel {job}"
    else:
        stop = f"kill {pid}" if host == socket.gethostname() else f"kill {pid} on {host}"
    return (
        f"--output_dir={output_dir} is in use by another trainer ({who}; its command is in {path}); "
        f"wait for it to finish or stop it ({stop}), then run again"
    )


def _try_flock(fd: int) -> bool:
    """True when this descriptor now holds the lock, False when someone else does; raises
    OSError for file systems without lock support."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _open(path: Path, create: bool) -> int:
    # Read-write even to probe: NFS maps flock(LOCK_EX) onto a write lock, which needs it.
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    try:
        return os.open(path, flags, 0o644)
    except OSError as e:
        raise RunLockError(f"cannot open the run lock {path}: {e.strerror}") from None


def acquire_run_lock(output_dir: str | Path) -> RunLock:
    """Create ``output_dir`` if needed and take its run lock for this process; raise
    :class:`RunLockError` naming the holder when another process has it.

    On a file system that cannot lock (or whose locks are local to one node) a warning says so;
    where flock fails outright the run goes on unlocked.
    """
    output_dir = Path(output_dir)
    path = lock_path(output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunLockError(f"cannot create --output_dir={output_dir}: {e.strerror}") from None
    warning = mount_warning(output_dir)
    if warning:
        log.warning("%s", warning)
    fd = _open(path, create=True)
    try:
        held = _try_flock(fd)
    except OSError as e:
        os.close(fd)
        if e.errno not in _UNSUPPORTED:
            raise RunLockError(f"cannot lock {path}: {e.strerror}") from None
        log.warning(
            "cannot lock %s (%s): this file system does not support file locks, so nothing stops "
            "a second trainer on %s; see docs/run-lock.md",
            path,
            e.strerror,
            output_dir,
        )
        return RunLock(path, None)
    if not held:
        os.close(fd)
        raise RunLockError(describe_holder(path, read_holder(path)))
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(_holder_record(output_dir)) + "\n").encode(), 0)
    return RunLock(path, fd)


@contextlib.contextmanager
def hold_run_lock(output_dir: Path, env: DistEnv) -> Iterator[None]:
    """The main process takes the output folder's run lock before any rank writes into it and
    holds it until training ends; the other ranks wait for the outcome (a collective), so none
    writes unless it is held, and all stop with the holder's name when it is not."""
    from lerobot_pipe.distributed.runtime import broadcast_from_main  # torch: only a run holds it

    lock: RunLock | None = None
    error: str | None = None
    if env.is_main:
        try:
            lock = acquire_run_lock(output_dir)
        except RunLockError as e:
            error = str(e)
    error = broadcast_from_main(error)
    if error is not None:
        raise RunLockError(error)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def check_run_lock(output_dir: str | Path) -> None:
    """Raise :class:`RunLockError` naming the holder when a process holds ``output_dir``'s run
    lock; write nothing (a missing folder or lock file is simply free)."""
    path = lock_path(output_dir)
    if not path.is_file():
        return
    fd = _open(path, create=False)
    try:
        held_by_us = _try_flock(fd)
    except OSError:
        return  # no lock support: acquire_run_lock warns when a trainer starts
    finally:
        os.close(fd)  # releases the probe's lock at once
    if not held_by_us:
        raise RunLockError(describe_holder(path, read_holder(path)))


# --------------------------------------------------------------------------- file systems


def _unescape_mount_field(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount_of(path: str | Path, mounts_text: str | None = None) -> tuple[str, str, set[str]] | None:
    """(mount point, file system type, options) of the mount holding ``path``, from
    /proc/self/mounts (None where there is none, e.g. not Linux)."""
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    target = os.path.realpath(path)
    best = None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point = _unescape_mount_field(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[2], set(fields[3].split(",")))
    return best


def mount_warning(path: str | Path, mounts_text: str | None = None) -> str | None:
    """Why the run lock of a folder on this mount may not stop a trainer on another node (or at
    all); None where it holds (local file systems, NFS with server-side locks, Lustre with
    ``flock``, CephFS, ...)."""
    found = mount_of(path, mounts_text)
    if found is None:
        return None
    point, fstype, options = found
    where = f"{path} is on {fstype} ({point})"
    local_only = "its locks are local to this node: a trainer on another node does not see them"
    if fstype in ("nfs", "nfs4"):
        if "nolock" in options or {"local_lock=flock", "local_lock=all"} & options:
            return (
                f"{where} mounted with local locking (nolock / local_lock=flock|all): {local_only}"
            )
        return None
    if fstype == "lustre":
        if "flock" in options:
            return None
        if "localflock" in options:
            return f"{where} mounted with localflock: {local_only}"
        return (
            f"{where} mounted without the flock option: its locks fail (noflock) or may not be "
            "coherent across nodes; ask for a mount with -o flock"
        )
    if fstype.startswith("fuse.") or fstype == "fuse":
        return f"{where}, a FUSE file system: {local_only} (or, with some, it has none at all)"
    if fstype == "beegfs":
        return (
            f"{where}: BeeGFS keeps flock local to a node unless its clients set "
            "tuneUseGlobalFileLocks=true; check that before running trainers from several nodes"
        )
    return None
