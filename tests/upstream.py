"""Released LeRobot, run beside the project: where its Python is, and how tests start it.

LeRobot 0.6.1 needs Python 3.12 and its own torch, so it lives in its own virtual environment
(``make lerobot-venv`` builds ``.venv-lerobot/``). ``LEROBOT_UPSTREAM_PYTHON`` names the Python of
an existing one instead. Tests in our venv never import LeRobot: they start its console scripts
and ``tests/interop/upstream_driver.py`` with that Python, in a clean environment (offline Hub,
one thread per process, no PYTHONPATH of ours). The exception is tests/beside/: there this
project is installed into a copy of LeRobot's venv, and tests run in it import both
(``test_lerobot_policies_here.py``: LeRobot's own policies on our trainer, the only code of ours
that imports LeRobot, ``lerobot_pipe/policies/lerobot_bridge/``).

LeRobot 0.4.4 is run from an overlay, a folder holding lerobot 0.4.4 and the few pure-Python
packages whose 0.6.1 versions it cannot use, put first on that same Python's path
(``make lerobot-venv`` builds ``.venv-lerobot/overlay-0.4.4``; ``LEROBOT_UPSTREAM_044_OVERLAY``
names another).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from lerobot_pipe.pipeline.train_job import descendants

REPO = Path(__file__).resolve().parent.parent
ENV_PYTHON = "LEROBOT_UPSTREAM_PYTHON"
ENV_044_OVERLAY = "LEROBOT_UPSTREAM_044_OVERLAY"
DEFAULT_VENV = REPO / ".venv-lerobot"
DEFAULT_044_OVERLAY = DEFAULT_VENV / "overlay-0.4.4"
UPSTREAM_VERSION = "0.6.1"
INSTALL_HINT = (
    "install Python 3.12 (e.g. `pyenv install 3.12.1`) and run `make lerobot-venv`, or set "
    f"{ENV_PYTHON}=<a venv with lerobot[training,diffusion,peft,smolvla,pi]=={UPSTREAM_VERSION}>/bin/python"
)
# Variables of ours or of a launcher that must not reach LeRobot's processes.
_DROPPED = ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_")


@dataclass(frozen=True)
class Upstream:
    """A LeRobot installation: its Python and the folder of its console scripts."""

    python: Path
    version: str
    overlay: Path | None = None  # prepended to sys.path (LeRobot 0.4.4)

    @property
    def bin(self) -> Path:
        return self.python.parent

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
        env.update(
            HF_HUB_OFFLINE="1",
            HF_HOME=str(home),
            OMP_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false",
        )
        if self.overlay is not None:
            env["PYTHONPATH"] = str(self.overlay)
        env.update(extra)
        return env

    def start(self, args: list[str], *, cwd: Path, log: Path, **env: str) -> Launched:
        """Start ``args`` (argv[0] in the venv's bin/, or absolute) in LeRobot's environment;
        stdout and stderr go to ``log``."""
        exe = args[0] if os.path.isabs(args[0]) else str(self.bin / args[0])
        out = open(log, "w")  # noqa: SIM115 - closed by Launched.wait
        proc = subprocess.Popen(
            [exe, *args[1:]],
            cwd=cwd,
            env=self.env(cwd / ".hf_home", **env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return Launched(proc, out, log)

    def run(self, args: list[str], *, cwd: Path, log: Path, timeout: float, **env: str) -> int:
        return self.start(args, cwd=cwd, log=log, **env).wait(timeout)

    def run_script(
        self, script: Path, *args: object, home: Path, timeout: float, **env: str
    ) -> subprocess.CompletedProcess:
        """Run one of the tests' driver scripts with LeRobot's Python in its environment; a
        non-zero exit fails the calling test with the end of the script's stderr."""
        proc = subprocess.run(
            [str(self.python), str(script), *map(str, args)],
            env=self.env(home, **env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode:
            raise AssertionError(
                f"{Path(script).name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        return proc


@dataclass
class Launched:
    """A started LeRobot process (group) and its log."""

    proc: subprocess.Popen
    out: IO[str]
    log: Path

    def wait(
        self,
        timeout: float,
        finished: Callable[[], bool] | None = None,
        exit_grace: float = 30,
    ) -> int:
        """The exit status; the process group is killed (-9) after ``timeout`` seconds.

        ``finished`` tells from the run's output that it completed. LeRobot 0.6.1's torchrun runs
        on gloo sometimes never exit after completing (both ranks stuck garbage-collecting at
        interpreter shutdown, after "End of training"): a completed run still alive
        ``exit_grace`` seconds later is killed, noted in the log, and counts as success."""
        deadline = time.monotonic() + timeout
        done_at = None
        try:
            while (rc := self.proc.poll()) is None:
                now = time.monotonic()
                if done_at is None and finished is not None and finished():
                    done_at = now
                if now > deadline or (done_at is not None and now - done_at > exit_grace):
                    # torchrun's ranks may run in sessions of their own: kill them by descent.
                    below = descendants(self.proc.pid)
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    for pid in below:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    self.proc.wait()
                    if done_at is not None:
                        self.out.write(
                            f"\n[test] finished, not exited {exit_grace} s later: killed\n"
                        )
                        return 0
                    self.out.write(f"\n[test] killed after {timeout} s\n")
                    return -9
                time.sleep(0.5)
            return rc
        finally:
            self.out.close()

    def tail(self, lines: int = 60) -> str:
        """The end of the log, without torchcodec's library-probing noise."""
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join([ln for ln in text if "torchcodec" not in ln][-lines:])


def _version(python: Path, overlay: Path | None = None) -> str | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    if overlay is not None:
        env["PYTHONPATH"] = str(overlay)
    try:
        proc = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('lerobot'))"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


@functools.cache
def find_upstream() -> tuple[Upstream | None, str]:
    """LeRobot 0.6.1's Python, or None and why not (a skip reason naming what to install).
    Asked once per test session."""
    configured = os.environ.get(ENV_PYTHON)
    python = Path(configured) if configured else DEFAULT_VENV / "bin" / "python"
    if not python.exists():
        where = f"{ENV_PYTHON}={configured}" if configured else f"{python}"
        return (
            None,
            f"LeRobot {UPSTREAM_VERSION} not found ({where} does not exist): {INSTALL_HINT}",
        )
    version = _version(python)
    if version != UPSTREAM_VERSION:
        return None, (
            f"{python} has lerobot {version or 'not installed'}, the interop suite needs "
            f"{UPSTREAM_VERSION}: {INSTALL_HINT}"
        )
    return Upstream(python, version), ""


def find_upstream_044(upstream: Upstream) -> tuple[Upstream | None, str]:
    """LeRobot 0.4.4 as an overlay on 0.6.1's Python, or None and why not."""
    configured = os.environ.get(ENV_044_OVERLAY)
    overlay = Path(configured) if configured else DEFAULT_044_OVERLAY
    version = _version(upstream.python, overlay) if overlay.is_dir() else None
    if version != "0.4.4":
        return None, (
            f"LeRobot 0.4.4 overlay not found at {overlay}: run `make lerobot-venv` or set "
            f"{ENV_044_OVERLAY}=<folder from `pip install --no-deps --target`>"
        )
    return Upstream(upstream.python, version, overlay), ""
