"""Bytes a pipeline resume reads from the checkpoint it resumes from, summed over every process.

    .venv/bin/python bench/bench_resume_reads.py [--repo PATH] [--keep]

In a fresh temporary copy of the workflow (Snakefile, workflow/, config/, envs/ of ``--repo``,
default: this repository, whose package is imported through PYTHONPATH), the embedded default
run trains to step 20 (one checkpoint), then the same pipeline reruns with ``train.steps: 40``
under ``strace -ff``: the validate job, the train job (lerobot-pipe launch-train), torchrun and
both training ranks. Every read(), pread64(), readv(), preadv() and preadv2() of a file inside
the resumed step folder is summed (strace -y names each descriptor's file), and every mmap() of
such a file counts its mapped length (safetensors maps its files; /proc/<pid>/io's rchar does not
see those reads, read_bytes misses the page cache). The sum is compared with the bytes the
checkpoint's manifest (training_step.json's "files") lists: hashing each file once in total and
loading it once more is 2x at most. Target <= 2.2x.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"
PARTS = ("Snakefile", "workflow", "config", "envs")
TARGET = 2.2
RUN = "default"
# syscall(fd</path>, ...) = result   (strace -ff -y -s 0: one file per thread)
_CALL = re.compile(
    r"^(?P<call>read|pread64|readv|preadv|preadv2|mmap)\((?P<args>.*)\)\s+=\s+"
    r"(?P<ret>-?\d+|0x[0-9a-f]+)"
)
_FD = re.compile(r"\d+<(?P<path>[^>]*)>")


def env_for(repo: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(repo)
    env["OMP_NUM_THREADS"] = "1"
    return env


def snakemake(work: Path, env: dict, steps: int, strace_out: Path | None = None) -> float:
    override = work / f"steps{steps}.yaml"
    override.write_text(yaml.safe_dump({"train": {"steps": steps, "save_freq": 20}}))
    target = f"results/{RUN}/final_checkpoint.json"
    cmd = ["snakemake", "--cores", "2", target, "--configfile", "config/config.yaml", str(override)]
    if strace_out is not None:
        cmd = [
            "strace", "-ff", "-qq", "-y", "-s", "0", "-e", "signal=none",
            "-e", "trace=read,pread64,readv,preadv,preadv2,mmap", "-o", str(strace_out), *cmd,
        ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(
            f"snakemake failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return time.perf_counter() - start


def bytes_read(trace: Path, step_dir: Path) -> dict[str, dict[str, int]]:
    """{file relative to step_dir: {"read": bytes, "mmap": bytes}} from strace's logs, one per
    thread (``-ff``: a thread's calls are never split into unfinished / resumed lines)."""
    prefix = str(step_dir.resolve()) + "/"
    found: dict[str, dict[str, int]] = defaultdict(lambda: {"read": 0, "mmap": 0})
    for log_file in trace.parent.glob(f"{trace.name}.*"):
        _add_reads(log_file, prefix, found)
    return dict(found)


def _add_reads(log_file: Path, prefix: str, found: dict) -> None:
    with open(log_file, errors="replace") as f:
        for line in f:
            match = _CALL.match(line)
            if not match or prefix not in line:
                continue
            fd = _FD.search(match["args"])
            if fd is None or not fd["path"].startswith(prefix):
                continue
            rel = fd["path"][len(prefix) :]
            if match["call"] == "mmap":
                found[rel]["mmap"] += int(match["args"].split(",")[1])
            elif not match["ret"].startswith("-"):
                found[rel]["read"] += int(match["ret"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if shutil.which("strace") is None:
        sys.exit("strace is needed: apt-get install strace")
    repo = args.repo.resolve()
    env = env_for(repo)
    work = Path(tempfile.mkdtemp(prefix="bench-resume-reads-"))
    try:
        for part in PARTS:
            src = repo / part
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, work / part)
        first = snakemake(work, env, 20)
        step_dir = work / f"results/{RUN}/train/checkpoints/000020"
        manifest = json.loads((step_dir / "training_state/training_step.json").read_text())
        listed = sum(int(e["size"]) for e in manifest["files"].values())
        (work / "strace").mkdir()
        trace = work / "strace" / "trace"
        second = snakemake(work, env, 40, trace)
        found = bytes_read(trace, step_dir)
        reads = sum(v["read"] for v in found.values())
        mapped = sum(v["mmap"] for v in found.values())
        print(
            f"repository: {repo} ({subprocess.run(['git', '-C', str(repo), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()})"
        )
        print(
            f"first run to step 20: {first:.0f} s; resume to step 40 under strace: {second:.0f} s"
        )
        print(f"manifest of {step_dir.name}: {len(manifest['files'])} files, {listed / 1e6:.1f} MB")
        print(f"{'file':58s} {'listed MB':>9s} {'read MB':>9s} {'mmap MB':>9s}")
        for rel in sorted(set(manifest["files"]) | set(found)):
            size = int(manifest["files"].get(rel, {}).get("size", 0))
            got = found.get(rel, {"read": 0, "mmap": 0})
            print(
                f"{rel[:58]:58s} {size / 1e6:9.2f} {got['read'] / 1e6:9.2f} {got['mmap'] / 1e6:9.2f}"
            )
        ratio = (reads + mapped) / listed
        print(
            f"read()/pread(): {reads / 1e6:.1f} MB ({reads / listed:.2f}x), mmap: "
            f"{mapped / 1e6:.1f} MB ({mapped / listed:.2f}x); total {ratio:.2f}x the manifest "
            f"(target <= {TARGET}x): {'PASS' if ratio <= TARGET else 'FAIL'}"
        )
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
