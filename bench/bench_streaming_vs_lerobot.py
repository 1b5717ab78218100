"""Streaming from the local test Hub: ours against LeRobot 0.6.1's StreamingLeRobotDataset.

    .venv/bin/python bench/bench_streaming_vs_lerobot.py [--episodes 40] [--length 100]
        [--size 64] [--noise 0] [--batch 8] [--workers 1,2] [--ranks 1,2] [--batches 150]
        [--reps 3] [--lerobot-python /work/main/.venv-lerobot/bin/python]

One repo (``bench_streaming.write``'s packed layout: two AV1 cameras, LeRobot's writer
defaults) uploaded to the test Hub (``tests/hub_server.py``, real HTTP on 127.0.0.1) and tagged
with its codebase version (LeRobot's metadata loader requires the tag). ACT-like windows (10
actions), batch ``--batch`` per rank. Each measurement runs in its own processes, the server in
this one, the two sides alternating (ours, LeRobot, ours, ...) per rank and worker count, each
with a cold cache:

- ours: ``BatchPrefetcher(StreamingLeRobotDataset(hub), StreamSampler(rank, ranks), workers)``,
  one process per rank, started together (each reads its own episodes, as under torchrun);
- LeRobot: ``DataLoader(StreamingLeRobotDataset(repo), batch, num_workers=workers)``
  (``bench/lerobot_stream_driver.py``, LeRobot's interpreter, HF_ENDPOINT at the test Hub;
  ``max_num_shards=workers`` as lerobot-train passes); on 2 ranks under
  ``accelerate launch --multi_gpu --num_processes 2`` (CPU processes, gloo) with the loader through
  ``Accelerator.prepare``, as lerobot-train runs, but with ``dispatch_batches=False``:
  accelerate's default for an IterableDataset (the main process reads every batch and splits
  it) fails on the batch's ``task`` strings, so each process iterates the stream and keeps its
  share of the batches.

Samples/s from the end of the first batch to the end of ``--batches`` more (opening, the
shuffle buffer's fill and the first decoders excluded on both sides), summed over the ranks
(which run at the same time). Medians of ``--reps``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as c  # noqa: F401 - must come first: pins threads, sets sys.path

LEROBOT_PYTHON = "/work/main/.venv-lerobot/bin/python"
HERE = Path(__file__).resolve().parent


def ours(
    repo: str, cache: str, batch: int, workers: int, batches: int, rank: int = 0, world: int = 1
) -> dict:
    """One measurement of our stream, rank ``rank`` of ``world`` (run in a child process, one
    per rank: endpoint and token from env)."""
    from bench_streaming import DELTAS

    from lerobot_pipe.datasets import BatchPrefetcher
    from lerobot_pipe.datasets.stream_sampler import StreamSampler
    from lerobot_pipe.datasets.streaming import StreamingLeRobotDataset

    start = time.perf_counter()
    dataset = StreamingLeRobotDataset(
        repo,
        cache,
        endpoint=os.environ["HF_ENDPOINT"],
        token=os.environ["HF_TOKEN"],
        delta_timestamps=DELTAS,
    )
    sampler = StreamSampler(dataset.episode_bounds, batch, rank, world, seed=0)
    _, epochs = sampler.draws(rank, 0, len(dataset))
    steps = min(batches, int((epochs == 0).sum()) // batch - 1)  # within this rank's epoch 0
    with BatchPrefetcher(dataset, sampler, workers) as loader:
        loader.next()
        first = time.perf_counter()
        for _ in range(steps):
            loader.next()
        end = time.perf_counter()
    dataset.close()
    return {
        "rank": rank,
        "first_batch_s": first - start,
        "batches": steps,
        "sps": steps * batch / (end - first),
    }


def run(cmds: list[list[str]], env: dict[str, str]) -> dict:
    """Run ``cmds`` at once (the ranks of one measurement); every JSON line they print is one
    rank's: their samples/s summed (the ranks run at the same time), the slowest first batch."""
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd in cmds
    ]
    lines = []
    for cmd, proc in zip(cmds, procs, strict=True):
        out, err = proc.communicate(timeout=1800)
        if proc.returncode:
            raise RuntimeError(f"{cmd[:3]} failed ({proc.returncode}):\n{err[-3000:]}")
        lines += [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return {
        "ranks": len(lines),
        "sps": sum(r["sps"] for r in lines),
        "first_batch_s": max(r["first_batch_s"] for r in lines),
        "per_rank_sps": [round(r["sps"], 1) for r in lines],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--length", type=int, default=100)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--lerobot-python", default=LEROBOT_PYTHON)
    parser.add_argument(
        "--ours-driver", nargs=4, metavar=("REPO", "CACHE", "RANK", "WORLD"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.ours_driver:
        repo, cache, rank, world = args.ours_driver
        w = int(args.workers)
        r = ours(repo, cache, args.batch, w, args.batches, int(rank), int(world))
        print(json.dumps(r), flush=True)
        return

    from bench_streaming import write
    from bench_vs_lerobot import free_port
    from conftest_hub import hub_client_settings
    from hub_server import HubServer
    from huggingface_hub import HfApi

    tmp = Path(tempfile.mkdtemp(prefix="bench-stream-vs-"))
    repo = "bench/packed"
    results: dict[tuple[str, int], list[dict]] = {}
    loads = []
    with HubServer(root=tmp / "hub") as hub, hub_client_settings(hub):
        root = write(tmp / "packed", args.episodes, args.length, args.size, False, args.noise)
        api = HfApi(endpoint=hub.url, token=hub.token)
        api.create_repo(repo, repo_type="dataset")
        api.upload_folder(repo_id=repo, repo_type="dataset", folder_path=root)
        version = json.loads((root / "meta" / "info.json").read_text())["codebase_version"]
        api.create_tag(repo, tag=version, repo_type="dataset")
        base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        worker_counts = [int(w) for w in args.workers.split(",")]
        rank_counts = [int(r) for r in args.ranks.split(",")]
        for rep in range(args.reps):
            for ranks in rank_counts:
                for workers in worker_counts:
                    for side in ("ours", "lerobot"):
                        cold = tmp / f"{side}-{ranks}-{workers}-{rep}"
                        env = {
                            **base,
                            **hub.env(),
                            "HF_HUB_CACHE": str(cold / "hub"),
                            "OMP_NUM_THREADS": "1",
                        }
                        flags = ["--batch", str(args.batch), "--workers", str(workers)]
                        flags += ["--batches", str(args.batches)]
                        if side == "ours":
                            env["PYTHONPATH"] = str(c.REPO)
                            me = [sys.executable, str(HERE / Path(__file__).name)]
                            cmds = [
                                [*me, "--ours-driver", repo, str(cold / f"cache-{r}"), str(r)]
                                + [str(ranks), *flags]
                                for r in range(ranks)
                            ]
                        else:
                            env["HF_LEROBOT_HOME"] = str(cold / "lerobot")
                            env["HF_DATASETS_CACHE"] = str(cold / "datasets")
                            driver = [str(HERE / "lerobot_stream_driver.py"), "--repo", repo]
                            if ranks == 1:
                                cmds = [[args.lerobot_python, *driver, *flags]]
                            else:  # as a LeRobot user runs lerobot-train on several processes
                                launch = str(Path(args.lerobot_python).parent / "accelerate")
                                cmds = [
                                    [launch, "launch", "--multi_gpu", "--num_processes", str(ranks)]
                                    + ["--num_machines", "1", "--mixed_precision", "no"]
                                    + ["--dynamo_backend", "no", "--main_process_port"]
                                    + [str(free_port()), *driver, "--accelerate", *flags]
                                ]
                        loads.append(os.getloadavg()[0])
                        seen = len(hub.requests)
                        r = run(cmds, env)
                        # Proof that both sides read the videos over HTTP: their requests.
                        r["video_requests"] = sum(
                            "/videos/" in q.path for q in list(hub.requests)[seen:]
                        )
                        results.setdefault((side, ranks, workers), []).append(r)
                        print(
                            json.dumps(
                                {"side": side, "ranks": ranks, "workers": workers, "rep": rep, **r}
                            ),
                            flush=True,
                        )
        loads.append(os.getloadavg()[0])
    print(f"load average (1 min) during the run: {min(loads):.1f}-{max(loads):.1f}")
    print(
        "| ranks | loader workers | ours samples/s | LeRobot samples/s | ours / LeRobot | "
        "first batch ours / LeRobot (s) |"
    )
    print("|---|---|---|---|---|---|")
    for ranks in rank_counts:
        for workers in worker_counts:
            o = results[("ours", ranks, workers)]
            lr = results[("lerobot", ranks, workers)]
            os_ = statistics.median(r["sps"] for r in o)
            ls = statistics.median(r["sps"] for r in lr)
            fo = statistics.median(r["first_batch_s"] for r in o)
            fl = statistics.median(r["first_batch_s"] for r in lr)
            print(
                f"| {ranks} | {workers} | {os_:.0f} | {ls:.0f} | {os_ / ls:.2f} | "
                f"{fo:.2f} / {fl:.2f} |"
            )


if __name__ == "__main__":
    main()
