"""The pipeline's train job: ``lerobot-pipe launch-train``, which the train rule ``exec``s.

It runs where the job's shell ran, as the direct child of the snakemake process (or, under the
SLURM profile, of the job's own snakemake inside the allocation), and:

1. stops at once, naming the holder, while a trainer holds the run lock of ``--output_dir``;
2. finishes without launching anything when the newest complete checkpoint already reaches
   ``--steps`` (``train.steps``), e.g. after a config change that trains nothing new;
3. starts ``torchrun --standalone`` (inside a SLURM allocation of more than one process:
   ``srun`` + one torchrun per node, c10d rendezvous on the first node) in a process group of
   its own, resuming from the newest complete checkpoint (the one resume resolver,
   :mod:`lerobot_pipe.checkpoint.resume`: sizes here, the trainer hashes the files split across
   its ranks), its output appended to the run's log, every attempt's after a header of its own:
   Snakemake deletes a job's declared log before each attempt, so that log (``--log``) is a link
   to ``<log>-history`` (e.g. ``logs/train-history.log``), which nothing deletes;
4. shows the trainer's progress (step, loss, samples/s, ETA, saved checkpoints), warnings and
   errors on its own stderr (the terminal snakemake runs in), from the trainer's structured
   event channel (``<output_dir>/progress.jsonl``, :mod:`lerobot_pipe.training.progress`),
   while the whole output goes to the log;
5. stops training when snakemake is gone, however it went (SIGKILL included), and when it is
   told to stop (SIGINT from Ctrl-C, SIGTERM, SIGHUP): SIGTERM to torchrun's group, and torchrun
   stops its workers; whatever still runs GRACE_S later (or at a second signal) is SIGKILLed;
6. copies the final checkpoint's training_step.json to the job's output;
7. as one training segment of the pipeline (``--stop_after_step=k``, ``--receipt``): trains up to
   step ``k`` only (the schedule still follows ``--steps``, the run's total, which ``--steps_from``
   reads from validate's resolved config so that the segment's own flags do not change when
   ``steps`` grows), pins each checkpoint it will save with reason ``pending`` before it starts
   (retention keeps them until the pipeline has evaluated them), and writes the segment's
   receipt: a small JSON file outside the checkpoint folders naming checkpoint ``k``, the same
   bytes however often it is written, so that a segment run again with nothing to train does not
   make Snakemake redo the jobs downstream of it.

Why a polling watchdog and not ``PR_SET_PDEATHSIG``: that signal fires when the parent *thread*
that started the process exits, and Snakemake starts jobs from the worker threads of a pool;
nor would it reach torchrun's workers, which torchrun starts in sessions of their own. Once
snakemake is gone this process is re-parented (to init or a subreaper), so ``os.getppid()``
changes: checked every POLL_S seconds, whatever killed snakemake.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from lerobot_pipe.checkpoint import resume
from lerobot_pipe.checkpoint.layout import (
    CheckpointError,
    checkpoints_dir,
    is_complete,
    list_complete_checkpoints,
    read_training_step,
    step_folder_name,
)
from lerobot_pipe.checkpoint.pins import pin
from lerobot_pipe.configs.parser import ConfigError
from lerobot_pipe.fsutil import write_json_atomic
from lerobot_pipe.pipeline.config import with_config_keys
from lerobot_pipe.training.progress import EventFollower, events_path, render_event
from lerobot_pipe.training.run_lock import RunLockError, check_run_lock

log = logging.getLogger(__name__)

POLL_S = 0.2
GRACE_S = 15.0
_TAIL_LINES = 15
_BAR = 20  # characters of the progress bar, when the terminal has room for it


class Terminal:
    """The train job's messages on its stderr: progress redrawn in place on a TTY (one line per
    update elsewhere); a terminal that went away is dropped silently."""

    def __init__(self, stream: TextIO) -> None:
        self.stream: TextIO | None = stream
        self.tty = stream.isatty()
        self._drawn = False

    def _write(self, text: str) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.stream = None

    def line(self, text: str) -> None:
        self._write(("\r\x1b[K" if self._drawn else "") + f"train: {text}\n")
        self._drawn = False

    def show(self, event: dict[str, Any]) -> None:
        """One event of the trainer's channel: a progress update (on a TTY redrawn in place; one
        that saved a checkpoint stays), or a warning or error line."""
        text = render_event(event)
        if event.get("event") != "progress":
            if event.get("level") != "WARNING":
                text = with_config_keys(text)
            self.line(text)
            return
        if not self.tty or event.get("saved"):
            self.line(text)
            return
        # A wrapped line cannot be redrawn in place: the bar gives way first, so the ETA at
        # the end of the text stays visible on a narrow terminal (80 columns).
        width = shutil.get_terminal_size().columns - 1
        room = width - len("train: ") - len(text) - len("|| ")
        bar = ""
        if room >= 5:
            size = min(_BAR, room)
            done = event["step"] * size // max(event["total"], 1)
            bar = f"|{'#' * done}{' ' * (size - done)}| "
        self._write(f"\r\x1b[K{f'train: {bar}{text}'[:width]}")
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self._write("\n")
            self._drawn = False


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (Linux /proc; empty elsewhere)."""
    parents = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(entry.path, "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def is_running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class Supervisor:
    """One launcher command (torchrun, or srun + torchrun) in its own process group, its output
    appended to the log, its events shown on the terminal, tied to this process's parent and to
    the signals this process gets."""

    def __init__(
        self, log_file, follower: EventFollower, terminal: Terminal, grace_s: float = GRACE_S
    ) -> None:
        self.log_file = log_file
        self.grace_s = grace_s
        self.follower = follower
        self.terminal = terminal
        self._stop: list[int] = []

    def say(self, text: str) -> None:
        self.log_file.write(f"lerobot-pipe launch-train: {text}\n")
        self.log_file.flush()
        self.terminal.line(text)

    def pump(self) -> None:
        """Show the trainer's events since the last call."""
        for event in self.follower.events():
            self.terminal.show(event)

    def _on_signal(self, signum: int, frame) -> None:
        self._stop.append(signum)

    def run(self, command: list[str], env: Mapping[str, str]) -> int:
        """Run ``command`` to its end, or until told to stop; its exit status (128 + the signal
        when this process stopped it)."""
        parent = os.getppid()
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self.log_file,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
            while True:
                self.pump()
                returncode = proc.poll()
                if returncode is not None:
                    self.pump()
                    return returncode
                reason = None
                if self._stop:
                    reason = f"{signal.Signals(self._stop[0]).name} received"
                elif os.getppid() != parent:
                    reason = f"the process that started it (pid {parent}) is gone"
                if reason is not None:
                    self.say(f"stopping training: {reason}")
                    self.stop(proc)
                    self.pump()
                    return 128 + (self._stop[0] if self._stop else signal.SIGHUP)
                time.sleep(POLL_S)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def stop(self, proc: subprocess.Popen) -> None:
        """SIGTERM to torchrun's group (torchrun then stops its workers, which sit in sessions
        of their own); SIGKILL to all of them if anything still runs ``grace_s`` later, or as
        soon as another signal comes (a second Ctrl-C)."""
        below = descendants(proc.pid)
        signals_before = len(self._stop)
        _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and len(self._stop) == signals_before:
            if proc.poll() is not None and not any(map(is_running, below)):
                return
            self.pump()
            time.sleep(0.1)
        left = [pid for pid in below if is_running(pid)]
        self.say(f"still running: SIGKILL to {[proc.pid, *left]}")
        for pid in [proc.pid, *left]:
            _signal_group(pid, signal.SIGKILL)
        proc.wait()


def _slurm_nodes(job_id: str) -> tuple[str, str]:
    """The allocation's node list and its first host (outside a job step only SLURM_JOB_ID is
    set, so ask squeue)."""
    try:
        nodes = subprocess.run(
            ["squeue", "--noheader", f"--jobs={job_id}", "--format=%N"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError) as e:
        raise ConfigError(f"cannot list the nodes of SLURM job {job_id}: {e}") from None
    return nodes, hosts[0]


def launch_command(
    train_args: list[str],
    *,
    nproc_per_node: int,
    nnodes: int,
    rdzv_port: int,
    cpus_per_task: int,
    env: Mapping[str, str],
) -> tuple[list[str], str]:
    """The launcher command and a sentence for the log saying how training is launched."""
    # Our trainer under our own name: beside LeRobot, lerobot-train on PATH is LeRobot's.
    pipe = shutil.which("lerobot-pipe")
    if pipe is None:
        raise ConfigError("lerobot-pipe is not on PATH: install lerobot_pipe in this environment")
    job = env.get("SLURM_JOB_ID")
    if job and nproc_per_node * nnodes > 1:
        nodes, head = _slurm_nodes(job)
        command = [
            "srun",
            f"--nodes={nnodes}",
            f"--ntasks={nnodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={nproc_per_node * cpus_per_task}",
            "--kill-on-bad-exit=1",
            "torchrun",
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-id={job}",
            f"--rdzv-endpoint={head}:{rdzv_port}",
            pipe,
            "train",
            *train_args,
        ]
        return (
            command,
            f"SLURM job {job}: srun + torchrun on {nodes}, rendezvous {head}:{rdzv_port}",
        )
    command = ["torchrun", "--standalone", f"--nproc-per-node={nproc_per_node}", pipe, "train"]
    command += train_args
    return command, f"torchrun --standalone on {socket.gethostname()}, {nproc_per_node} process(es)"


def write_final_checkpoint(step_dir: Path, path: Path) -> None:
    """The job's declared output: the final checkpoint's training_step.json (atomically)."""
    write_json_atomic(path, read_training_step(step_dir))


def link_to_history(log_path: Path, history: Path | None = None) -> Path:
    """Make ``log_path`` (the job's log, which Snakemake deletes before each attempt) a relative
    link to the run's whole log, which it never deletes (``history``, by default
    ``<log>-history``); a log file an earlier version wrote there is moved into the history
    first. Returns the history's path."""
    if history is None:
        history = log_path.with_name(f"{log_path.stem}-history{log_path.suffix}")
    target = os.path.relpath(history, log_path.parent)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.is_symlink():
        if log_path.resolve() == history.resolve():
            return history
        log_path.unlink()
    elif log_path.is_file():
        with open(history, "ab") as out:
            out.write(log_path.read_bytes())
        log_path.unlink()
    tmp = log_path.with_name(f".{log_path.name}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, log_path)
    return history


def _shown(path: Path) -> Path:
    """``path`` as the user named it: relative to the working folder when it is inside it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def _tail(path: Path, offset: int) -> list[str]:
    """The last lines this attempt appended to the log (from byte ``offset``)."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").splitlines()[-_TAIL_LINES:]


def _check_unlocked(output_dir: Path, log_path: Path) -> None:
    """RunLockError, also written to the log, when a trainer holds ``output_dir``."""
    try:
        check_run_lock(output_dir)
    except RunLockError as e:
        # Appended: the holder may be writing to this very log.
        with open(log_path, "a") as f:
            f.write(f"lerobot-pipe launch-train: error: {e}\n")
        raise


def _nothing_to_train(
    supervisor: Supervisor, point, end: int, until: str, output_dir: Path
) -> bool:
    """Says where training starts; True when the newest checkpoint already reaches ``end``
    (``until`` names the flag that set it)."""
    if point is None:
        supervisor.say(f"no complete checkpoint in {output_dir}: training starts fresh")
        return False
    supervisor.say(f"resuming from {_shown(point.step_dir)} (step {point.step})")
    if point.step < end:
        return False
    supervisor.say(
        f"checkpoint step {point.step} already reaches {until}: nothing to train, "
        "torchrun not started"
    )
    return True


def save_steps(start: int, end: int, save_freq: int) -> list[int]:
    """The steps a launch from ``start`` to ``end`` saves: every ``save_freq``-th, and ``end``."""
    steps = [s for s in range(start + 1, end + 1) if save_freq > 0 and s % save_freq == 0]
    return steps if end in steps else [*steps, end]


def write_receipt(output_dir: Path, end: int, total_steps: int, path: Path) -> None:
    """A segment's receipt: the checkpoint of step ``end`` (its training_step.json record), or
    ``null`` when retention already deleted it. No time in it: the same bytes every time."""
    step_dir = checkpoints_dir(output_dir) / step_folder_name(end, total_steps)
    record = read_training_step(step_dir) if is_complete(step_dir) else None
    write_json_atomic(
        path,
        {"segment_end": end, "checkpoint": _shown(step_dir).as_posix(), "training_step": record},
    )


def _newest_checkpoint(output_dir: Path) -> Path:
    complete = list_complete_checkpoints(output_dir)
    if not complete:
        raise CheckpointError(
            f"training finished but {checkpoints_dir(output_dir)} holds no complete "
            "checkpoint (--save_checkpoint=false?)"
        )
    return complete[-1]


def launch_train(
    train_args: list[str],
    *,
    log_path: Path,
    final_checkpoint: Path | None = None,
    nproc_per_node: int = 1,
    nnodes: int = 1,
    rdzv_port: int = 29500,
    cpus_per_task: int = 1,
    env: Mapping[str, str] = os.environ,
    terminal: Terminal | None = None,
    history: Path | None = None,
    steps_from: Path | None = None,
    receipt: Path | None = None,
    pin_pending: bool = False,
) -> int:
    """Train as the pipeline's train job does (see the module docstring); the exit status."""
    # preflight registers every --policy.type and --env.type before parsing
    from lerobot_pipe.training.loop import last_step_of_launch
    from lerobot_pipe.training.preflight import parse_train_config

    terminal = terminal or Terminal(sys.stderr)
    if steps_from is not None:
        # The run's total from validate's resolved config: not among the segment's own flags.
        steps = json.loads(Path(steps_from).read_text())["steps"]
        train_args = [*train_args, f"--steps={steps}"]
    cfg, _ = parse_train_config(train_args)
    if not cfg.output_dir:
        raise ConfigError("launch-train needs --output_dir")
    output_dir = Path(cfg.output_dir)
    end = last_step_of_launch(cfg)
    until = f"--steps={end} (train.steps)" if end == cfg.steps else f"--stop_after_step={end}"
    link_to_history(log_path, history)
    if history is not None:
        # The run's log under its usual name too (the train job's own log, once it runs).
        link_to_history(history.with_name(history.name.replace("-history", "")), history)
    _check_unlocked(output_dir, log_path)
    point = resume.locate(output_dir)
    # Appended: a resumed run's log follows the earlier attempts' (each starts with a header).
    with open(log_path, "a") as log_file:
        log_file.write(
            f"\n===== lerobot-pipe launch-train, {datetime.now().isoformat(timespec='seconds')}, "
            f"host {socket.gethostname()} =====\n"
        )
        log_file.flush()
        attempt_start = log_file.tell()
        supervisor = Supervisor(log_file, EventFollower(events_path(output_dir)), terminal)
        try:
            if _nothing_to_train(supervisor, point, end, until, output_dir):
                if final_checkpoint is not None:
                    write_final_checkpoint(point.step_dir, final_checkpoint)
                if receipt is not None:
                    write_receipt(output_dir, end, cfg.steps, receipt)
                return 0
            if pin_pending and cfg.save_checkpoint:
                start = point.step if point is not None else 0
                pending = save_steps(start, end, cfg.save_freq)
                for step in pending:
                    pin(output_dir, step_folder_name(step, cfg.steps), "pending")
                supervisor.say(
                    f"steps {start + 1}-{end}; checkpoints {', '.join(map(str, pending))} pinned "
                    "until evaluated (retention keeps them meanwhile)"
                )
            resume_flag = ["--resume=true"] if point is not None else []
            command, how = launch_command(
                [*resume_flag, *train_args],
                nproc_per_node=nproc_per_node,
                nnodes=nnodes,
                rdzv_port=rdzv_port,
                cpus_per_task=cpus_per_task,
                env=env,
            )
            supervisor.say(f"{how}; the whole log: {log_path}")
            returncode = supervisor.run(command, env)
            if 0 < returncode < 128 or returncode < 0:
                tail = _tail(log_path, attempt_start)  # before the next line joins the log
                supervisor.say(f"training failed (exit status {returncode}); the log ends:")
                for line in tail:
                    terminal.line(f"  {line}")
            if returncode != 0:
                return returncode
            latest = _newest_checkpoint(output_dir)
            if final_checkpoint is not None:
                write_final_checkpoint(latest, final_checkpoint)
            if receipt is not None:
                write_receipt(output_dir, end, cfg.steps, receipt)
            supervisor.say(f"finished; the newest checkpoint is {latest}")
            return 0
        finally:
            terminal.close()
