"""Streaming from the local test Hub: ours against LeRobot 0.6.1's StreamingLeRobotDataset.

    .venv/bin/python bench/bench_streaming_vs_lerobot.py [--episodes 40] [--length 100]
        [--size 64] [--noise 0] [--batch 8] [--workers 1,2] [--batches 150] [--reps 3]
        [--lerobot-python /work/main/.venv-lerobot/bin/python]

One repo (``bench_streaming.write``'s packed layout: two AV1 cameras, LeRobot's writer
defaults) uploaded to the test Hub (``tests/hub_server.py``, real HTTP on 127.0.0.1) and tagged
with its codebase version (LeRobot's metadata loader requires the tag). ACT-like windows (10
actions), batch ``--batch``. Each measurement runs in its own process, the server in this one,
the two sides alternating (ours, LeRobot, ours, ...) per worker count, each with a cold cache:

- ours: ``BatchPrefetcher(StreamingLeRobotDataset(hub), StreamSampler(0, 1), workers)``;
- LeRobot: ``DataLoader(StreamingLeRobotDataset(repo), batch, num_workers=workers)``
  (``bench/lerobot_stream_driver.py``, LeRobot's interpreter, HF_ENDPOINT at the test Hub;
  ``max_num_shards=workers`` as lerobot-train passes).

Samples/s from the end of the first batch to the end of ``--batches`` more (opening, the
shuffle buffer's fill and the first decoders excluded on both sides). Medians of ``--reps``.
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


def ours(repo: str, cache: str, batch: int, workers: int, batches: int) -> dict:
    """One measurement of our stream (run in a child process: endpoint and token from env)."""
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
    sampler = StreamSampler(dataset.episode_bounds, batch, 0, 1, seed=0)
    steps = min(batches, len(dataset) // batch - 1)
    with BatchPrefetcher(dataset, sampler, workers) as loader:
        loader.next()
        first = time.perf_counter()
        for _ in range(steps):
            loader.next()
        end = time.perf_counter()
    dataset.close()
    return {"first_batch_s": first - start, "batches": steps, "sps": steps * batch / (end - first)}


def run(cmd: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"{cmd[:2]} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--length", type=int, default=100)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--lerobot-python", default=LEROBOT_PYTHON)
    parser.add_argument("--ours-driver", nargs=2, metavar=("REPO", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ours_driver:
        repo, cache = args.ours_driver
        w = int(args.workers)
        print(json.dumps(ours(repo, cache, args.batch, w, args.batches)), flush=True)
        return

    from bench_streaming import write
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
        for rep in range(args.reps):
            for workers in (int(w) for w in args.workers.split(",")):
                for side in ("ours", "lerobot"):
                    cold = tmp / f"{side}-{workers}-{rep}"
                    env = {
                        **base,
                        **hub.env(),
                        "HF_HUB_CACHE": str(cold / "hub"),
                        "OMP_NUM_THREADS": "1",
                    }
                    if side == "ours":
                        env["PYTHONPATH"] = str(c.REPO)
                        cmd = [
                            sys.executable,
                            str(HERE / Path(__file__).name),
                            "--ours-driver",
                            repo,
                            str(cold / "cache"),
                        ]
                    else:
                        env["HF_LEROBOT_HOME"] = str(cold / "lerobot")
                        env["HF_DATASETS_CACHE"] = str(cold / "datasets")
                        cmd = [
                            args.lerobot_python,
                            str(HERE / "lerobot_stream_driver.py"),
                            "--repo",
                            repo,
                        ]
                    cmd += [
                        "--batch",
                        str(args.batch),
                        "--workers",
                        str(workers),
                        "--batches",
                        str(args.batches),
                    ]
                    loads.append(os.getloadavg()[0])
                    seen = len(hub.requests)
                    r = run(cmd, env)
                    # Proof that both sides read the videos over HTTP: their requests.
                    r["video_requests"] = sum(
                        "/videos/" in q.path for q in list(hub.requests)[seen:]
                    )
                    results.setdefault((side, workers), []).append(r)
                    print(
                        json.dumps({"side": side, "workers": workers, "rep": rep, **r}), flush=True
                    )
        loads.append(os.getloadavg()[0])
    print(f"load average (1 min) during the run: {min(loads):.1f}-{max(loads):.1f}")
    print(
        "| loader workers | ours samples/s | LeRobot samples/s | ours / LeRobot | first batch ours / LeRobot (s) |"
    )
    print("|---|---|---|---|---|")
    for workers in (int(w) for w in args.workers.split(",")):
        o = results[("ours", workers)]
        lr = results[("lerobot", workers)]
        os_ = statistics.median(r["sps"] for r in o)
        ls = statistics.median(r["sps"] for r in lr)
        fo = statistics.median(r["first_batch_s"] for r in o)
        fl = statistics.median(r["first_batch_s"] for r in lr)
        print(f"| {workers} | {os_:.0f} | {ls:.0f} | {os_ / ls:.2f} | {fo:.2f} / {fl:.2f} |")


if __name__ == "__main__":
    main()
