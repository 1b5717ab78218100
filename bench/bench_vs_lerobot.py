"""Per-step time, start-up and peak memory of LeRobot 0.6.1's own ``lerobot-train`` vs ours, side by
side on the same torch build, data and flags: what a user who switches trainers feels.

    make lerobot-venv bench-venv                  # LeRobot 0.6.1; ours on LeRobot's torch 2.11.0
    .venv-bench/bin/python bench/bench_vs_lerobot.py [--reps 2] [--steps 40] [--warmup 10]
    .venv-bench/bin/python bench/bench_vs_lerobot.py --only act-2cam --workers 0 --procs 1
    .venv-bench/bin/python bench/bench_vs_lerobot.py --dry-run   # the commands, no training

Both trainers are started as a user starts them: LeRobot's ``lerobot-train`` from its venv
(``.venv-lerobot``, ``LEROBOT_UPSTREAM_PYTHON``) and, for DDP on 2 processes, ``accelerate launch
--multi_gpu --num_processes=2`` as its docs say; ours from ``.venv-bench`` (``--ours-python``:
lerobot_pipe installed beside torch==2.11.0, LeRobot's wheel) and ``torchrun --standalone
--nproc-per-node=2``. Same synthetic AV1 dataset (``lerobot-pipe make-dataset``, 10 episodes x 100
frames, 96x96 cameras ``top``/``wrist``; no camera for state-only), same flags (below), the same
video backend (torchcodec, both venvs hold the build that pairs with torch 2.11), ``--log_freq=1``
and no checkpoint.

Per-step time: each trainer logs every step; this script stamps each step's log line as it
arrives and takes the median gap between consecutive lines after ``--warmup`` steps (steady state,
measured the same way for both, whatever each trainer reports about itself). Start-up: from the
command to the line of step 1 (imports, dataset, model, launcher, and step 1 itself). Peak memory:
the largest VmHWM (peak RSS) among the trainer's rank processes, polled from /proc while it runs,
and in brackets their largest anonymous RSS seen (what the trainer allocated: VmHWM also counts
the shared libraries' pages, which differ with the page cache between two venvs); LeRobot's DataLoader worker processes (``--num_workers=2``) are extra processes, reported apart
(ours loads in threads of the rank process). Each configuration runs ``--reps`` times, LeRobot and
ours alternating (which goes first rotates); medians are reported, ratio = ours / LeRobot.

Configurations (``--only`` picks by name, or by policy: ``--only smolvla``, ``--only pi0,pi05``):
ACT state-only, ACT with one and with two cameras, Diffusion Policy with two cameras, SmolVLA
small (one camera, the dataset written with 4 task strings), pi0 and pi0.5 on the dummy geometry
(``pi0-dummy``, ``pi05-dummy``: that dataset; ``--policy.paligemma_variant=dummy
--policy.action_expert_variant=dummy --policy.image_resolution=[56,56]``, LeRobot's defaults
otherwise; LeRobot 0.6.1 cannot build the dummy variant, so its side runs
bench/lerobot_pi_train.py, lerobot-train with tests/policies/lerobot_pi_driver.py's patch, started
as the console script is, and both read the tiny tokenizer of tests/pi_tiny.py from their Hub
cache, offline); each with ``--num_workers`` 0 and 2 (``--workers``), on
one process and DDP on 2 (``--procs``). On CPU: fp32, batch 8, one intra-op thread per process,
the issue-19 ACT (dim_model 256, 4 encoder layers, chunk 20, ResNet-18 from random weights), a
smaller Diffusion U-Net (down_dims 128/256/512) and SmolVLA on a local SmolVLM folder that both
trainers build from (``--policy.vlm_model_name=<folder> --policy.load_vlm_weights=false``: random
fp32 weights, nothing downloaded; the "small" geometry of bench/_common.py: text 576 wide, 4
layers, vision 384 wide, 4 layers, 128x128 frames; SmolVLA's defaults otherwise: chunk 50, the
expert 0.75 as wide, cross-attention every other layer, the VLM frozen). On a CUDA machine (torch
in ``--ours-python`` sees a GPU): LeRobot's default sizes (SmolVLA: SmolVLM2-500M's geometry,
random weights, 512x512 frames; pi0 / pi0.5 stay dummy), bf16 autocast on both sides;
otherwise the script says what it would run there. SmolVLA needs transformers beside each trainer (``make lerobot-venv
bench-venv``: ``lerobot[smolvla]`` there, ``.[smolvla]`` here); each side has its own release
(LeRobot 0.6.1 pins 5.4-5.5, the bench venv resolves the newest). The machine's load average is printed before and after: on a shared machine
the times are noisy, compare ratios of the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import _common as c  # must come first: pins threads, sets sys.path

REPO = c.REPO
DEFAULT_LEROBOT = REPO / ".venv-lerobot" / "bin" / "python"
DEFAULT_OURS = REPO / ".venv-bench" / "bin" / "python"
DATASET = {"num_episodes": 10, "episode_length": 100, "image_size": 96}
BATCH = 8
SEED = 1000
# The issue-19 ACT: LeRobot's ACT with a smaller transformer, ResNet-18 from random weights.
ACT_CPU = {
    "policy.dim_model": 256,
    "policy.n_encoder_layers": 4,
    "policy.chunk_size": 20,
    "policy.n_action_steps": 20,
}
DIFFUSION_CPU = {"policy.down_dims": "[128,256,512]"}
# SmolVLA: which local SmolVLM geometry (bench/_common.py) on CPU and on CUDA, and the flags that
# fit each (the number of text layers the folder has; frames resized to the vision tower's size).
SMOLVLA_VLM = {False: "small", True: "smolvlm2-500m"}
SMOLVLA_CPU = {"policy.num_vlm_layers": 4, "policy.resize_imgs_with_padding": "[128,128]"}
SMOLVLA_TASKS = 4  # task strings of its dataset (episode e gets task e % 4)
# pi0 / pi0.5 on the dummy geometry (openpi's dummy Gemma for both stacks, the tiny SigLIP of
# tests/pi_tiny.py), LeRobot's defaults otherwise; the 96x96 camera resized to 56x56 (patch 14:
# 16 image tokens) by each side's own resize-with-pad. LeRobot 0.6.1 cannot build "dummy": its
# side runs bench/lerobot_pi_train.py (lerobot-train with tests/policies/lerobot_pi_driver.py's
# patch) in place of the console script.
PI_POLICIES = ("pi0", "pi05")
PI_DUMMY = {
    "policy.paligemma_variant": "dummy",
    "policy.action_expert_variant": "dummy",
    "policy.image_resolution": "[56,56]",
}
LEROBOT_PI_TRAIN = REPO / "bench" / "lerobot_pi_train.py"
# ours: "step 12/40 loss 0.41 ..."; LeRobot: "step:12 smpl:96 ep:0 epch:0.10 loss:0.410 ..."
STEP_LINE = {
    "ours": re.compile(r"\bstep (\d+)/\d+ loss "),
    "lerobot": re.compile(r"\bstep:(\d+) smpl:"),
}


@dataclass(frozen=True)
class Config:
    policy: str  # act | diffusion | smolvla | pi0 | pi05
    cameras: tuple[str, ...]
    workers: int
    procs: int

    @property
    def model(self) -> str:
        if self.policy == "smolvla":
            return "smolvla-small"
        if self.policy in PI_POLICIES:
            return f"{self.policy}-dummy"
        cams = {0: "state-only", 1: "1cam", 2: "2cam"}[len(self.cameras)]
        return f"{self.policy}-{cams}"

    @property
    def dataset(self) -> tuple[tuple[str, ...], int]:
        """(cameras, task strings) of the dataset it trains on."""
        language = self.policy == "smolvla" or self.policy in PI_POLICIES
        return self.cameras, SMOLVLA_TASKS if language else 1

    @property
    def name(self) -> str:
        return (
            f"{self.model} nw={self.workers} {'1 proc' if self.procs == 1 else f'DDP {self.procs}'}"
        )


@dataclass
class Run:
    step_s: float  # median gap between step lines after the warm-up
    cpu_s: float  # median CPU time (user + system, every process of the run) per step, same steps
    startup_s: float  # command to the step-1 line
    rank_peak_mb: float
    loader_peak_mb: float  # LeRobot's DataLoader worker processes; 0 when none
    rank_anon_mb: float  # the largest RssAnon seen in a rank (polled): memory it allocated
    steps_seen: int
    log: str = field(repr=False, default="")


class Failed(RuntimeError):
    pass


def model_configs(only: list[str] | None) -> list[tuple[str, tuple[str, ...]]]:
    models = [
        ("act", ()),
        ("act", ("top",)),
        ("act", ("top", "wrist")),
        ("diffusion", ("top", "wrist")),
        ("smolvla", ("top",)),
        ("pi0", ("top",)),
        ("pi05", ("top",)),
    ]
    if only:  # "--only pi0 pi05" or "--only pi0,pi05"
        picked = {name for item in only for name in item.split(",") if name}
        models = [m for m in models if {m[0], Config(m[0], m[1], 0, 1).model} & picked]
    return models


def flags(
    cfg: Config, root: Path, out: Path, steps: int, cuda: bool, vlm: Path | None = None
) -> list[str]:
    """The training flags, identical for both trainers (LeRobot's names); ``vlm``: SmolVLA's
    local SmolVLM folder."""
    f: dict[str, object] = {
        "dataset.repo_id": "bench/synthetic",
        "dataset.root": root,
        "dataset.video_backend": "torchcodec",
        "policy.type": cfg.policy,
        "policy.device": "cuda" if cuda else "cpu",
        "policy.push_to_hub": False,
        "output_dir": out,
        "job_name": "bench",
        "batch_size": BATCH,
        "steps": steps,
        "log_freq": 1,
        "save_checkpoint": False,
        "num_workers": cfg.workers,
        "seed": SEED,
        "wandb.enable": False,
    }
    if cfg.policy == "smolvla":
        f.update({"policy.vlm_model_name": vlm, "policy.load_vlm_weights": False})
        if not cuda:
            f.update(SMOLVLA_CPU)
    elif cfg.policy in PI_POLICIES:
        f.update(PI_DUMMY)
    else:  # the ResNet-18 from random weights (no ImageNet download)
        f["policy.pretrained_backbone_weights"] = None
        if not cuda:
            f.update(ACT_CPU if cfg.policy == "act" else DIFFUSION_CPU)
    out_flags = []
    for key, value in f.items():
        if value is None:
            value = "null"
        elif isinstance(value, bool):
            value = str(value).lower()
        out_flags.append(f"--{key}={value}")
    return out_flags


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(
    trainer: str, python: Path, cfg: Config, train_flags: list[str], cuda: bool
) -> list[str]:
    bin_dir = python.parent
    script = str(bin_dir / "lerobot-train")
    if trainer == "lerobot":
        if cfg.policy in PI_POLICIES:  # lerobot-train with the dummy variant patched in
            script = str(LEROBOT_PI_TRAIN)
        if cfg.procs == 1 and not cuda:
            return [str(python), script, *train_flags]
        # accelerate launch, as LeRobot's docs start it (bf16 on a GPU through its launcher).
        launch = [str(bin_dir / "accelerate"), "launch", f"--num_processes={cfg.procs}"]
        launch += ["--num_machines=1", "--dynamo_backend=no"]
        launch += ["--mixed_precision=bf16" if cuda else "--mixed_precision=no"]
        if cfg.procs > 1:
            launch += ["--multi_gpu", f"--main_process_port={free_port()}"]
        return [*launch, script, *train_flags]
    precision = ["--accelerator.mixed_precision=bf16"] if cuda else []
    if cfg.procs == 1:
        return [script, *train_flags, *precision]
    launch = [str(bin_dir / "torchrun"), "--standalone", f"--nproc-per-node={cfg.procs}"]
    return [*launch, script, *train_flags, *precision]


def trainer_env(trainer: str, home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "ACCELERATE_")
        )
    }
    if trainer == "ours":  # this checkout (the venv's editable install may be another one)
        env["PYTHONPATH"] = str(REPO)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HOME=str(home / f"hf-{trainer}"),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        WANDB_MODE="disabled",
    )
    return env


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _status_kb(pid: int, *keys: str) -> list[int]:
    """The kB figures of /proc/<pid>/status lines ``keys`` (0 for a process gone)."""
    found = dict.fromkeys(keys, 0)
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in found:
                    found[key] = int(line.split()[1])
    except OSError:
        pass
    return list(found.values())


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (those that still run)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total * _TICK_S


def _is_rank(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"\0LOCAL_RANK=" in b"\0" + f.read()
    except OSError:
        return False


class MemoryPoll(threading.Thread):
    """Peak RSS (VmHWM) of a process tree, polled: ranks (LOCAL_RANK set, or the root when none
    is) and the processes they started (DataLoader workers). Beside it the largest anonymous RSS
    seen (RssAnon, every 0.25 s): VmHWM also counts the pages of shared libraries mapped in,
    which depend on the page cache (the same torch build read 275 MB of its files into one venv's
    process and 421 MB into the other's, with the same 281 MB anonymous)."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.stop = threading.Event()
        self.peak: dict[int, int] = {}
        self.anon: dict[int, int] = {}
        self.role: dict[int, str] = {}

    def run(self) -> None:
        while not self.stop.wait(0.25):
            self.sample()

    def sample(self) -> None:
        kids = _children()
        todo, seen = [self.root], []
        while todo:
            pid = todo.pop()
            seen.append(pid)
            todo.extend(kids.get(pid, []))
        for pid in seen:
            if pid not in self.role:
                self.role[pid] = "rank" if _is_rank(pid) else "other"
            hwm, anon = _status_kb(pid, "VmHWM", "RssAnon")
            self.peak[pid] = max(self.peak.get(pid, 0), hwm)
            self.anon[pid] = max(self.anon.get(pid, 0), anon)
        # A rank's descendants are its loader processes (forked: they inherit LOCAL_RANK too).
        ranks = {p for p in seen if self.role[p] == "rank"}
        for pid in seen:
            if pid in ranks and self._parent(pid, kids) in ranks:
                self.role[pid] = "loader"

    @staticmethod
    def _parent(pid: int, kids: dict[int, list[int]]) -> int | None:
        for ppid, children in kids.items():
            if pid in children:
                return ppid
        return None

    def result(self) -> tuple[float, float, float]:
        """(largest rank peak, largest loader peak, largest rank anonymous RSS) in MB."""
        ranks = [p for p in self.peak if self.role.get(p) == "rank"]
        if not ranks:  # one plain process: the root is the rank, its children loaders
            ranks = [self.root]
            loaders = [p for p in self.peak if p != self.root]
        else:
            loaders = [p for p in self.peak if self.role.get(p) == "loader"]
        loader_kb = max((self.peak[p] for p in loaders), default=0)
        rank_kb = max(self.peak.get(p, 0) for p in ranks)
        return rank_kb / 1024, loader_kb / 1024, max(self.anon.get(p, 0) for p in ranks) / 1024


def run_once(
    trainer: str,
    cmd: list[str],
    env: dict,
    warmup: int,
    timeout_s: float,
    log_path: Path,
    *,
    steps: int,
    exit_grace_s: float = 120.0,
) -> Run:
    """One run of ``cmd``: its step stamps, CPU and memory. A trainer that logged all its
    ``steps`` and does not exit within ``exit_grace_s`` after (LeRobot's DDP launch with loader
    workers has hung at exit) is killed and its steps kept, the hang printed."""
    pattern = STEP_LINE[trainer]
    t0 = time.perf_counter()
    # Its own session: the whole tree (launcher, ranks, loader workers) is killed on any exit.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    poll = MemoryPoll(proc.pid)
    poll.start()
    stamps: dict[int, float] = {}
    cpu: dict[int, float] = {}
    log: list[str] = []

    def read() -> None:
        buf = b""
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(65536):
            now = time.perf_counter()
            buf += chunk
            *lines, buf = re.split(rb"[\r\n]", buf)
            for raw in lines:
                line = raw.decode(errors="replace")
                log.append(line)
                m = pattern.search(line)
                if m and int(m.group(1)) not in stamps:
                    stamps[int(m.group(1))] = now - t0
                    # The tree seen so far (poll.peak holds the root too once polled: once each).
                    cpu[int(m.group(1))] = _cpu_s(list({proc.pid, *poll.peak}))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = None
        while rc is None:
            try:
                rc = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                now = time.perf_counter() - t0
                if steps in stamps and now - stamps[steps] > exit_grace_s:
                    print(
                        f"  {trainer}: logged its {steps} steps but had not exited "
                        f"{exit_grace_s:.0f} s later: killed, its steps kept",
                        flush=True,
                    )
                    rc = 0
                elif now > timeout_s:
                    rc = "timeout"
    finally:
        # Leftovers of a finished run, or all of it: the launcher's group, and every descendant
        # seen (torch's launcher starts each rank in a session of its own).
        poll.stop.set()
        poll.join()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        marker = f"HF_HOME={env['HF_HOME']}".encode()
        for pid in list(poll.peak):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):  # still ours (not a reused pid)
                    os.kill(pid, signal.SIGKILL)
        proc.wait()
    reader.join(5)
    text = "\n".join(log)
    log_path.write_text(f"{shlex.join(cmd)}\nexit {rc}\n{text}\n")
    if rc != 0:
        raise Failed(f"{trainer} exited {rc}: {shlex.join(cmd)}\n" + "\n".join(log[-30:]))
    steps = sorted(stamps)
    steady = [s for s in steps if s > warmup and s - 1 in stamps]
    if 1 not in stamps or not steady:
        raise Failed(f"{trainer}: no step log lines after step {warmup} in:\n" + text[-3000:])
    gaps = [stamps[s] - stamps[s - 1] for s in steady]
    cpu_gaps = [cpu[s] - cpu[s - 1] for s in steady]
    rank_mb, loader_mb, anon_mb = poll.result()
    return Run(
        statistics.median(gaps),
        statistics.median(cpu_gaps),
        stamps[1],
        rank_mb,
        loader_mb,
        anon_mb,
        len(steps),
        text,
    )


def make_datasets(
    python: Path, base: Path, needed: set[tuple[tuple[str, ...], int]]
) -> dict[tuple[tuple[str, ...], int], Path]:
    """The synthetic datasets of ``needed`` (Config.dataset), written by ``lerobot-pipe
    make-dataset``."""
    roots = {}
    for cams, tasks in sorted(needed):
        name = f"dataset-{'-'.join(cams) or 'state'}" + (f"-{tasks}tasks" if tasks > 1 else "")
        root = base / name
        args = [f"--{k}={v}" for k, v in DATASET.items()]
        if cams:
            args.append(f"--cameras={','.join(cams)}")
        if tasks > 1:
            args.append(f"--num_tasks={tasks}")
        cmd = [str(python.parent / "lerobot-pipe"), "make-dataset", f"--root={root}", *args]
        subprocess.run(cmd, check=True, capture_output=True, env=trainer_env("ours", base))
        roots[cams, tasks] = root
    return roots


def smolvla_folder(pythons: dict[str, Path], base: Path, cuda: bool) -> Path:
    """The local SmolVLM folder both trainers build SmolVLA from; refuses, saying what to
    install, where either side lacks transformers."""
    code = "import transformers, num2words"
    for trainer, python in pythons.items():
        if subprocess.run([str(python), "-c", code], capture_output=True).returncode:
            extra = "lerobot[smolvla]==0.6.1" if trainer == "lerobot" else "-e .[smolvla]"
            sys.exit(
                f"smolvla: {python} lacks transformers or num2words: pip install '{extra}' "
                f"there (make {'lerobot-venv' if trainer == 'lerobot' else 'bench-venv'})"
            )
    return c.write_smolvlm(base / f"smolvlm-{SMOLVLA_VLM[cuda]}", SMOLVLA_VLM[cuda])


def pi_tokenizer(base: Path) -> None:
    """The tiny PaliGemma-like tokenizer (tests/pi_tiny.py) in each trainer's Hub cache
    (``trainer_env``'s HF_HOME, offline) under the name both pi processors load,
    ``google/paligemma-3b-pt-224``."""
    try:
        import pytest  # noqa: F401
    except ImportError:  # pi_tiny uses pytest only in a context manager not called here
        sys.modules["pytest"] = types.ModuleType("pytest")
    from pi_tiny import build_paligemma_tokenizer

    for trainer in ("lerobot", "ours"):
        build_paligemma_tokenizer(Path(trainer_env(trainer, base)["HF_HOME"]))


def versions(python: Path) -> str:
    code = "import torch, sys; print(torch.__version__, torch.cuda.is_available(), sys.version.split()[0])"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def fmt_mb(run_list: list[Run]) -> str:
    rank = c.median([r.rank_peak_mb for r in run_list])
    loader = c.median([r.loader_peak_mb for r in run_list])
    anon = c.median([r.rank_anon_mb for r in run_list])
    return f"{rank:.0f} [{anon:.0f}]" + (f" (+{loader:.0f}/loader)" if loader else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--lerobot-python",
        type=Path,
        default=Path(os.environ.get("LEROBOT_UPSTREAM_PYTHON", DEFAULT_LEROBOT)),
    )
    ap.add_argument("--ours-python", type=Path, default=DEFAULT_OURS)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of the per-step median")
    ap.add_argument(
        "--only",
        nargs="+",
        help="act-state-only act-1cam act-2cam diffusion-2cam smolvla-small pi0-dummy "
        "pi05-dummy, or a policy (act, diffusion, smolvla, pi0, pi05)",
    )
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, train nothing")
    ap.add_argument("--json", type=Path, help="write every run's numbers here")
    args = ap.parse_args()
    # A SIGTERM (timeout, kill) unwinds like Ctrl-C, so the running trainer's tree is killed.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if args.steps <= args.warmup + 1:
        ap.error("--steps must exceed --warmup + 1")
    pythons = {"lerobot": args.lerobot_python, "ours": args.ours_python}
    for trainer, python in pythons.items():
        if not python.is_file():
            hint = "make lerobot-venv" if trainer == "lerobot" else "make bench-venv"
            sys.exit(f"{trainer}: {python} not found ({hint})")
    found = {t: versions(p) for t, p in pythons.items()}
    torch_of = {t: v.split()[0] for t, v in found.items()}
    cuda = found["ours"].split()[1] == "True"
    if torch_of["lerobot"] != torch_of["ours"]:
        print(f"WARNING: different torch builds: {torch_of} (make bench-venv installs LeRobot's)")
    configs = [
        Config(policy, cams, w, p)
        for policy, cams in model_configs(args.only)
        for p in args.procs
        for w in args.workers
    ]
    tmp = c.bench_tmp("vs_lerobot")
    print(
        f"LeRobot 0.6.1 ({args.lerobot_python}; torch, cuda, python: {found['lerobot']}) vs "
        f"lerobot_pipe ({args.ours_python}; {found['ours']}); device {'cuda, bf16, LeRobot default sizes' if cuda else 'cpu, fp32'}; "
        f"batch {BATCH}/process; {args.steps} steps, per-step median after step {args.warmup}; "
        f"{args.reps} reps; {os.cpu_count()} CPUs; {c.machine_load()}"
    )
    if not cuda:
        gpu = Config("act", ("top", "wrist"), 2, 2)
        gpu_flags = flags(gpu, Path("<dataset>"), Path("<out>"), args.steps, cuda=True)
        print(
            "No CUDA here. On a GPU machine it would run LeRobot's default sizes (ACT dim_model "
            "512, chunk 100; Diffusion down_dims 512/1024/2048; SmolVLA on SmolVLM2-500M's "
            "geometry, random weights) in bf16, e.g. "
            f"{gpu.name}:\n  LeRobot: "
            + shlex.join(command("lerobot", pythons["lerobot"], gpu, gpu_flags, True))
            + "\n  ours:    "
            + shlex.join(command("ours", pythons["ours"], gpu, gpu_flags, True))
        )
    if args.dry_run:
        for cfg in configs:
            f = flags(cfg, Path("<dataset>"), Path("<out>"), args.steps, cuda, Path("<vlm>"))
            print(f"\n{cfg.name}:")
            for trainer, python in pythons.items():
                print(f"  {trainer:8} " + shlex.join(command(trainer, python, cfg, f, cuda)))
        return
    roots = make_datasets(pythons["ours"], tmp, {cfg.dataset for cfg in configs})
    vlm = (
        smolvla_folder(pythons, tmp, cuda) if any(g.policy == "smolvla" for g in configs) else None
    )
    if any(g.policy in PI_POLICIES for g in configs):
        pi_tokenizer(tmp)
    results: dict[str, dict[str, list[Run]]] = {}
    for i, cfg in enumerate(configs):
        results[cfg.name] = {"lerobot": [], "ours": []}
        for rep in range(args.reps):
            order = ["lerobot", "ours"] if (i + rep) % 2 == 0 else ["ours", "lerobot"]
            for trainer in order:
                out = tmp / f"out-{trainer}-{i}-{rep}"
                f = flags(cfg, roots[cfg.dataset], out, args.steps, cuda, vlm)
                cmd = command(trainer, pythons[trainer], cfg, f, cuda)
                env = trainer_env(trainer, tmp)
                log_path = tmp / f"{out.name}.log"
                run = run_once(
                    trainer, cmd, env, args.warmup, args.timeout, log_path, steps=args.steps
                )
                results[cfg.name][trainer].append(run)
                print(
                    f"  {cfg.name:28} {trainer:8} rep {rep}: {1e3 * run.step_s:7.1f} ms/step "
                    f"({1e3 * run.cpu_s:.0f} ms CPU), "
                    f"start-up {run.startup_s:5.1f} s, peak {run.rank_peak_mb:.0f} MB "
                    f"[anon {run.rank_anon_mb:.0f}]"
                    + (f" (+{run.loader_peak_mb:.0f} MB/loader)" if run.loader_peak_mb else "")
                    + f"; {c.machine_load()}",
                    flush=True,
                )

    print(
        "\n| configuration | LeRobot ms/step (CPU ms) | ours ms/step (CPU ms) | ratio (CPU) "
        "| start-up s LeRobot / ours | peak MB/process [anon] LeRobot | ours |\n|---|---|---|---|---|---|---|"
    )
    ratios, cpu_ratios = [], []
    for name, by in results.items():
        wall = {t: c.median([r.step_s for r in runs]) for t, runs in by.items()}
        cpu = {t: c.median([r.cpu_s for r in runs]) for t, runs in by.items()}
        startup = {t: c.median([r.startup_s for r in runs]) for t, runs in by.items()}
        ratios.append(wall["ours"] / wall["lerobot"])
        cpu_ratios.append(cpu["ours"] / cpu["lerobot"])
        print(
            f"| {name} | {1e3 * wall['lerobot']:.0f} ({1e3 * cpu['lerobot']:.0f}) "
            f"| {1e3 * wall['ours']:.0f} ({1e3 * cpu['ours']:.0f}) "
            f"| {ratios[-1]:.2f} ({cpu_ratios[-1]:.2f}) "
            f"| {startup['lerobot']:.1f} / {startup['ours']:.1f} "
            f"| {fmt_mb(by['lerobot'])} | {fmt_mb(by['ours'])} |"
        )
    print(
        f"\nratio ours / LeRobot per-step time: median {c.median(ratios):.2f}, worst "
        f"{max(ratios):.2f} (CPU time: median {c.median(cpu_ratios):.2f}, worst "
        f"{max(cpu_ratios):.2f}); target <= 0.9 everywhere: {c.verdict(max(ratios) <= 0.9)}; "
        f"{c.machine_load()}"
    )
    if args.json:
        dump = {
            name: {
                t: [{k: v for k, v in vars(r).items() if k != "log"} for r in runs]
                for t, runs in by.items()
            }
            for name, by in results.items()
        }
        args.json.write_text(json.dumps(dump, indent=1))


if __name__ == "__main__":
    main()
