"""Run the pipeline as users do: `snakemake` as a subprocess in a fresh copy of the workflow."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from lerobot_pipe.constants import (
    CHECKPOINTS_DIR,
    ENV_FAULT_POINT,
    MODEL_SAFETENSORS,
    PINS_DIR,
    PRETRAINED_MODEL_DIR,
    TRAINING_STATE_DIR,
    TRAINING_STEP,
)

REPO = Path(__file__).resolve().parents[2]
WORKFLOW_FILES = ("Snakefile", "workflow", "config", "envs")
VENV_BIN = Path(sys.executable).parent
RUN = "results/default"
TRAIN_DIR = f"{RUN}/train"
# The first line of each job Snakemake prints: "rule validate:", "checkpoint train:", ...
_JOB_HEADER = re.compile(r"^(rule|localrule|checkpoint|localcheckpoint) (\w+):$")


@dataclass
class Result:
    returncode: int
    output: str
    seconds: float

    def jobs(self) -> dict[str, int]:
        """Rule name -> number of jobs Snakemake started (or, in a dry run, would start)."""
        counts: dict[str, int] = {}
        for job in self.planned_jobs():
            counts[job.rule] = counts.get(job.rule, 0) + 1
        return counts

    def planned_jobs(self) -> list[PlannedJob]:
        """The jobs as Snakemake prints them (a dry run with ``-p`` prints every shell command)."""
        lines = self.output.splitlines()
        jobs = []
        for at, line in enumerate(lines):
            header = _JOB_HEADER.match(line)
            if header is None:
                continue
            fields, at = {}, at + 1
            while at < len(lines) and lines[at].startswith("    "):
                key, _, value = lines[at].strip().partition(": ")
                fields[key] = value
                at += 1
            shell = None
            if at < len(lines) and lines[at].startswith("Shell command:"):
                # "Shell command: None", a one-line command, or the lines up to a blank line.
                shell = lines[at].removeprefix("Shell command:").strip()
                body = []
                while not shell and at + 1 < len(lines) and lines[at + 1].strip():
                    at += 1
                    body.append(lines[at].strip())
                shell = None if shell == "None" else shell or "\n".join(body)
            resources = dict(
                item.split("=", 1) for item in fields.pop("resources", "").split(", ") if item
            )
            jobs.append(PlannedJob(header[2], header[1], fields, resources, shell))
        return jobs


@dataclass(frozen=True)
class PlannedJob:
    """One job of a dry run as Snakemake prints it."""

    rule: str
    kind: str  # rule, localrule, checkpoint or localcheckpoint
    fields: dict[str, str]  # input, output, log, jobid, reason, threads, wildcards, ...
    resources: dict[str, str]
    shell: str | None  # None when printed without -p (or a run:/script: job)


class Workspace:
    """A copy of the workflow (a clean clone, as far as Snakemake can tell) in a tmp folder."""

    def __init__(self, root: Path):
        self.root = root
        self.first_result: Result | None = None  # set by the default_run fixture

    @classmethod
    def fresh(cls, root: Path) -> Workspace:
        root.mkdir(parents=True, exist_ok=True)
        for name in WORKFLOW_FILES:
            src = REPO / name
            if src.is_dir():
                shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, root / name)
        return cls(root)

    def clone(self, root: Path) -> Workspace:
        """Everything, pipeline outputs and Snakemake's metadata included (mtimes kept)."""
        shutil.copytree(self.root, root, symlinks=True)
        return Workspace(root)

    def path(self, relative: str) -> Path:
        return self.root / relative

    def write_config(self, name: str, values: dict) -> str:
        (self.root / name).write_text(yaml.safe_dump(values))
        return name

    def snakemake(
        self,
        *args: str,
        env: dict | None = None,
        timeout: float = 600,
        interrupt_when: str | None = None,
        meanwhile: tuple[str, Callable[[], object]] | None = None,
    ) -> Result:
        """Run snakemake here. With interrupt_when, press Ctrl-C (SIGINT to its whole process
        group, as a terminal does) as soon as that file exists. With meanwhile (a file, a call),
        make the call as soon as the file exists, while snakemake goes on."""
        start = time.monotonic()
        with subprocess.Popen(
            [str(VENV_BIN / "snakemake"), *args],
            cwd=self.root,
            env=pipeline_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        ) as proc:
            if interrupt_when is not None:
                while not self.path(interrupt_when).exists() and proc.poll() is None:
                    time.sleep(0.05)
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGINT)
            if meanwhile is not None:
                when, call = meanwhile
                while not self.path(when).exists() and proc.poll() is None:
                    time.sleep(0.05)
                try:
                    call()
                except BaseException:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    raise
            try:
                output, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                raise
        result = Result(proc.returncode, output, time.monotonic() - start)
        print(f"$ snakemake {' '.join(args)}  # {result.seconds:.1f} s, rc {proc.returncode}")
        return result

    def start(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        """snakemake in the background (its output in snakemake.out), to be killed by a test."""
        with open(self.root / "snakemake.out", "w") as out:
            return subprocess.Popen(
                [str(VENV_BIN / "snakemake"), *args],
                cwd=self.root,
                env=pipeline_env(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )

    def trainers(self) -> set[int]:
        """The trainers running in this workspace now: each torchrun, and the parent of every
        trainer rank (``lerobot-train``, or ``lerobot-pipe train`` as the train job starts it;
        its parent: a torchrun, or whatever adopted an orphaned rank). A child of a torchrun or
        of a rank that has not yet replaced itself (fork, then exec: it still shows its
        parent's command line) is part of its parent's trainer, not another one."""
        processes: dict[int, tuple[bool, int]] = {}  # pid -> (a torchrun, its parent)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if Path(os.readlink(entry / "cwd")) != self.root.resolve():
                    continue
                argv = (entry / "cmdline").read_bytes().decode().split("\0")
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
            if _is_trainer(argv):
                processes[int(entry.name)] = (any(a.endswith("torchrun") for a in argv), parent)
        found = set()
        for pid, (is_torchrun, parent) in processes.items():
            # forked by a torchrun or a rank, not yet exec'd (a rank's parent is its torchrun)
            if parent in processes and (is_torchrun or not processes[parent][0]):
                continue
            found.add(pid if is_torchrun else parent)
        return found

    def command(self, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
        """Another of the venv's console scripts here (e.g. lerobot-pipe report), as a user
        types it in the workflow's folder; stdout and stderr together."""
        return subprocess.run(
            [str(VENV_BIN / argv[0]), *argv[1:]],
            cwd=self.root,
            env=pipeline_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
            check=False,
        )

    def run_ok(self, *args: str, **kwargs) -> Result:
        result = self.snakemake(*args, **kwargs)
        assert result.returncode == 0, result.output[-6000:]
        return result

    def converted_steps(self) -> list[str]:
        """Steps with a converted pretrained_model/ holding full weights."""
        return sorted(
            p.parent.parent.name
            for p in self.root.glob(f"{RUN}/converted/*/{PRETRAINED_MODEL_DIR}/{MODEL_SAFETENSORS}")
        )

    def complete_checkpoints(self, run: str = RUN) -> list[str]:
        return sorted(
            p.parent.parent.name
            for p in self.root.glob(
                f"{run}/train/{CHECKPOINTS_DIR}/*/{TRAINING_STATE_DIR}/{TRAINING_STEP}"
            )
            if p.parent.parent.name.isdigit()
        )

    def training_files_mtimes(self, run: str = RUN) -> dict[str, int]:
        """Every file training wrote, for asserting that training did not run again (not the
        pins the evaluate, best and publish jobs write beside the checkpoints)."""
        train_dir = self.path(f"{run}/train")
        return {
            str(p): p.stat().st_mtime_ns
            for p in sorted(train_dir.rglob("*"))
            if p.is_file() and p.relative_to(train_dir).parts[0] != PINS_DIR
        }

    def converted_weights(self, step: str) -> dict:
        from safetensors.torch import load_file

        return load_file(
            self.path(f"{RUN}/converted/{step}/{PRETRAINED_MODEL_DIR}/{MODEL_SAFETENSORS}")
        )

    def final_checkpoint(self) -> dict:
        return json.loads(self.path(f"{RUN}/final_checkpoint.json").read_text())

    def mtimes(self, pattern: str) -> dict[str, int]:
        return {str(p): p.stat().st_mtime_ns for p in sorted(self.root.glob(pattern))}


def pipeline_env(extra: dict | None = None) -> dict:
    """The user's shell: the venv's console scripts on PATH, one thread per training process."""
    env = {key: value for key, value in os.environ.items() if key != ENV_FAULT_POINT}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def _is_trainer(argv: list[str]) -> bool:
    """A process running our trainer: ``lerobot-train ...`` or ``lerobot-pipe train ...``
    (directly or under torchrun)."""
    return any(
        arg.endswith("lerobot-train")
        or (arg.endswith("lerobot-pipe") and argv[i + 1 : i + 2] == ["train"])
        for i, arg in enumerate(argv)
    )
