"""Does the loader overlap with compute? The prefetcher's batches/s and a CPU-bound model's steps/s,
each alone and both at once, with 0, 1 and 2 loader worker threads (and, for comparison, worker
processes as LeRobot's DataLoader runs them).

    .venv/bin/python bench/bench_loader_overlap.py [--config act-1cam] [--workers 0 1 2]
        [--seconds 4] [--rounds 3] [--processes]

Workload (the main thread, as the training loop): ResNet-18 forward + backward (the backbone ACT
builds, random weights, FrozenBatchNorm), batch 8 at 96x96, one intra-op thread. Loader:
``BatchPrefetcher(dataset, GlobalBatchSampler, num_workers)`` on the synthetic AV1 dataset
(torchcodec, float32 cameras as CPU training receives them), drained by a consumer thread as
fast as it hands batches out (``--workers 0``: the consumer loads inline, i.e. one loader thread).
``--processes``: the same batches (``get_batch`` of the same sampler stream) through
``torch.utils.data.DataLoader`` with that many worker processes (fork), as LeRobot loads.

Per worker count, each round runs four phases (workload alone; loader drained alone; both at once;
``train``: the workload taking one batch per step, as the training loop does; the order rotates
per round); medians over rounds. Reported: each side's rate in "both" over its rate alone,
and their sum, **overlap** (work done per unit of wall time, in "alone" units): ~2.0 when the loader
runs on the second core beside the workload, ~1.0 when they serialize (the GIL, or one core);
and ``train``: steps/s taking a batch per step over steps/s alone (1.0: loading costs the step
nothing; below it, the share of the step the loader takes from it). CPU
columns: CPU seconds per wall second of the main thread and of the other threads (and child
processes), from /proc: robust to other jobs on the machine only in part (a contended core
gives each thread less), so compare rows of one run; the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

import _common as c  # must come first: pins threads, sets sys.path

# isort: split
import torch

from lerobot_pipe.datasets import (
    BatchPrefetcher,
    GlobalBatchSampler,
    LeRobotDataset,
    write_synthetic_dataset,
)
from lerobot_pipe.policies.vision.resnet import resnet_backbone

CONFIGS = {
    # name: (cameras, delta timestamps builder (fps -> dict))
    "act-1cam": (("top",), lambda fps: {"action": [i / fps for i in range(20)]}),
    "act-2cam": (("top", "wrist"), lambda fps: {"action": [i / fps for i in range(20)]}),
    "window2-2cam": (
        ("top", "wrist"),
        lambda fps: {
            "observation.state": [-1 / fps, 0.0],
            "observation.images.top": [-1 / fps, 0.0],
            "observation.images.wrist": [-1 / fps, 0.0],
            "action": [(i - 1) / fps for i in range(16)],
        },
    ),
}
_CLK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by native id."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / _CLK
    return out


def children_cpu() -> float:
    """CPU seconds of this process's live child processes (DataLoader workers)."""
    total = 0.0
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            total += (int(fields[11]) + int(fields[12])) / _CLK
    return total


class Workload:
    def __init__(self, batch: int, size: int) -> None:
        torch.manual_seed(0)
        self.net = resnet_backbone("resnet18")
        self.x = torch.rand(batch, 3, size, size)

    def step(self) -> None:
        self.net(self.x).mean().backward()
        for p in self.net.parameters():
            p.grad = None


class _Batches(torch.utils.data.Dataset):
    """Batch ``k`` of the sampler stream, for a DataLoader with ``batch_size=None``."""

    def __init__(self, dataset: LeRobotDataset, batch: int, seed: int) -> None:
        self.dataset, self.batch, self.seed = dataset, batch, seed

    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, k: int):
        sampler = GlobalBatchSampler(len(self.dataset), self.batch, 0, 1, seed=self.seed)
        sampler.samples_consumed = k * self.batch
        return self.dataset.get_batch(sampler.next_indices())


class Loader:
    """Batches from the prefetcher (threads) or a DataLoader (processes), endlessly."""

    def __init__(self, dataset: LeRobotDataset, batch: int, workers: int, processes: bool):
        self.processes = processes
        if processes:
            loader = torch.utils.data.DataLoader(
                _Batches(dataset, batch, 1000),
                batch_size=None,
                num_workers=workers,
                prefetch_factor=2 if workers else None,
                persistent_workers=bool(workers),
                multiprocessing_context="fork" if workers else None,
            )
            self._it = iter(loader)
            self.next = lambda: next(self._it)
            self.close = lambda: None
        else:
            sampler = GlobalBatchSampler(len(dataset), batch, 0, 1, seed=1000)
            self._pf = BatchPrefetcher(dataset, sampler, workers)
            self.next = self._pf.next
            self.close = self._pf.close


def run_phase(phase: str, work: Workload, loader: Loader, seconds: float) -> dict[str, float]:
    """Rates and CPU shares of one phase: ``work`` (the workload alone), ``load`` (the loader
    drained alone), ``both`` (the loader drained beside the workload) or ``train`` (one batch
    taken per workload step, as the training loop takes them)."""
    stop = threading.Event()
    counts = {"batches": 0}

    def drain() -> None:
        while not stop.is_set():
            loader.next()
            counts["batches"] += 1

    main = threading.get_native_id()
    drained = phase in ("load", "both")
    consumer = threading.Thread(target=drain, daemon=True) if drained else None
    cpu0, kids0, t0 = thread_cpu(), children_cpu(), time.perf_counter()
    if consumer is not None:
        consumer.start()
    steps = 0
    while time.perf_counter() - t0 < seconds:
        if phase == "load":
            time.sleep(0.05)
        else:
            if phase == "train":
                loader.next()
                counts["batches"] += 1
            work.step()
            steps += 1
    wall = time.perf_counter() - t0
    cpu1, kids1 = thread_cpu(), children_cpu()  # before the consumer thread ends
    stop.set()
    batches = counts["batches"]
    if consumer is not None:
        consumer.join()
    main_cpu = cpu1.get(main, 0.0) - cpu0.get(main, 0.0)
    other = sum(v - cpu0.get(t, 0.0) for t, v in cpu1.items() if t != main) + kids1 - kids0
    return {
        "steps_s": steps / wall,
        "batches_s": batches / wall,
        "main_cores": main_cpu / wall,
        "other_cores": other / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="act-1cam")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--processes", action="store_true", help="also DataLoader worker processes")
    ap.add_argument("--root", type=Path, help="an existing synthetic dataset (else one is made)")
    args = ap.parse_args()
    cams, deltas = CONFIGS[args.config]
    root = args.root
    if root is None:
        root = write_synthetic_dataset(
            c.bench_tmp("loader_overlap") / "ds",
            num_episodes=10,
            episode_length=100,
            cameras=cams,
            image_size=96,
        )
    probe = LeRobotDataset(root)
    dataset = LeRobotDataset(root, delta_timestamps=deltas(probe.fps), video_backend="torchcodec")
    work = Workload(args.batch, 96)
    work.step()
    kinds = [("threads", False)] + ([("processes", True)] if args.processes else [])
    print(
        f"{args.config}: batch {args.batch}, cameras {list(cams)} 96x96 (torchcodec, float32); "
        f"workload ResNet-18 fwd+bwd batch {args.batch} 96x96, {torch.get_num_threads()} "
        f"intra-op thread; {args.rounds} rounds x {args.seconds:g} s per phase; "
        f"{os.cpu_count()} CPUs; {c.machine_load()}"
    )
    header = (
        f"{'loader':>13} {'work alone':>11} {'load alone':>11} {'work both':>10} "
        f"{'load both':>10} {'overlap':>8} {'train':>7}  cores main/other (both; work alone)"
    )
    print(header)
    for kind, processes in kinds:
        for workers in args.workers:
            loader = Loader(dataset, args.batch, workers, processes)
            for _ in range(2 * max(workers, 1) + 1):
                loader.next()
            phases = ("work", "load", "both", "train")
            runs: dict[str, list[dict[str, float]]] = {p: [] for p in phases}
            for r in range(args.rounds):
                for p in phases[r % 4 :] + phases[: r % 4]:
                    runs[p].append(run_phase(p, work, loader, args.seconds))
            loader.close()

            def med(phase: str, key: str, runs=runs) -> float:
                return statistics.median(x[key] for x in runs[phase])

            w_alone, l_alone = med("work", "steps_s"), med("load", "batches_s")
            w_both, l_both = med("both", "steps_s"), med("both", "batches_s")
            overlap = statistics.median(
                b["steps_s"] / w_alone + b["batches_s"] / l_alone for b in runs["both"]
            )
            print(
                f"{kind + ' ' + str(workers):>13} {w_alone:8.2f}/s {l_alone:8.1f}/s "
                f"{w_both / w_alone:9.2f}x {l_both / l_alone:9.2f}x {overlap:8.2f} "
                f"{med('train', 'steps_s') / w_alone:6.3f}x  "
                f"{med('both', 'main_cores'):.2f}/{med('both', 'other_cores'):.2f}; "
                f"{med('work', 'main_cores'):.2f}",
                flush=True,
            )
    print(f"done; {c.machine_load()}")


if __name__ == "__main__":
    main()
