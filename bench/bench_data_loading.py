"""Samples/s the dataset + sampler deliver vs samples/s one training process consumes.

    .venv/bin/python bench/bench_data_loading.py [--reps 7]

Loader (A): ``dataset.get_batch(sampler.next_indices())`` alone, with an ``action`` window of
100 delta timestamps (ACT's default chunk_size), at the default batch size, on the default
run's dataset; also shown at batch 32 and on a larger dataset (50 x 100 frames), for reference.
Consumer (B): the embedded default run (config/config.yaml ``train:`` section: tiny ACT,
batch 8) trained by ``make_plan`` + ``train`` in ONE process (each rank of the default 2-process
run loads its own batch, so a rank's consumption is what one loader must keep up with);
samples/s from the loop's log records after the first (warm-up) window.
A and B alternate ``--reps`` times; medians. Target: A / B >= 10.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import _common as c  # must come first: pins threads, sets sys.path

# isort: split
import yaml

from lerobot_pipe.datasets import GlobalBatchSampler, LeRobotDataset
from lerobot_pipe.training.preflight import make_plan
from lerobot_pipe.training.train import train

TARGET = 10.0
LOADER_CHUNK = 100  # ACTConfig.chunk_size default
FALLBACK_TRAIN = {  # used when config/config.yaml is absent: tiny ACT, batch 8
    "batch_size": 8,
    "num_workers": 0,
    "seed": 1000,
    "policy": {"type": "act", **c.ACT_SIZES["small"]},
}
FALLBACK_DATASET = {"num_episodes": 4, "episode_length": 50, "seed": 0}


def default_run() -> tuple[dict, dict, str]:
    path = c.REPO / "config" / "config.yaml"
    if not path.is_file():
        return FALLBACK_TRAIN, FALLBACK_DATASET, "built-in fallback (no config/config.yaml)"
    cfg = yaml.safe_load(path.read_text())
    synthetic = (cfg.get("dataset") or {}).get("synthetic") or FALLBACK_DATASET
    return cfg["train"], synthetic, str(path.relative_to(c.REPO))


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def loader_rate(ds: LeRobotDataset, batch: int, min_s: float = 0.4) -> float:
    sampler = GlobalBatchSampler(len(ds), batch, 0, 1, seed=0)
    n, t0 = 0, time.perf_counter()
    while True:
        for _ in range(50):
            ds.get_batch(sampler.next_indices())
        n += 50
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s:
            return n * batch / elapsed


def consumer_rate(train_flags: dict, root: Path, tmp: Path, steps: int, window: int) -> float:
    flags = flatten(train_flags)
    for drop in ("parallelism.dp_shard", "parallelism.dp_replicate", "save_freq"):
        flags.pop(drop, None)  # one process: no sharding
    out = tmp / f"out-{time.monotonic_ns()}"
    flags.update(
        {
            "dataset.root": root,
            "output_dir": out,
            "steps": steps,
            "log_freq": window,
            "save_checkpoint": False,
        }
    )
    train(make_plan(c.argv_from(flags), 1, os.environ))
    records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return c.median([r["samples_per_s"] for r in records[1:]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--window", type=int, default=20)
    args = ap.parse_args()

    train_cfg, ds_cfg, source = default_run()
    batch = int(train_cfg.get("batch_size", 8))
    tmp = c.bench_tmp("data_loading")
    root = c.synthetic_dataset(
        tmp / "dataset",
        num_episodes=ds_cfg["num_episodes"],
        episode_length=ds_cfg["episode_length"],
    )
    big_root = c.synthetic_dataset(tmp / "dataset-big", num_episodes=50, episode_length=100)
    deltas = {"action": [i / 10 for i in range(LOADER_CHUNK)]}
    ds = LeRobotDataset(root, delta_timestamps=deltas)
    big = LeRobotDataset(big_root, delta_timestamps=deltas)
    policy = train_cfg.get("policy", {})
    print(
        f"default run from {source}: batch {batch}, ACT dim_model={policy.get('dim_model')} "
        f"chunk_size={policy.get('chunk_size')}, num_workers={train_cfg.get('num_workers')}; "
        f"dataset {len(ds)} frames; loader action window {LOADER_CHUNK}; {c.machine_load()}"
    )

    loader_rate(ds, batch, 0.2)  # warm-up
    consumer_rate(train_cfg, root, tmp, args.window * 2, args.window)

    a, b, ratios = [], [], []
    extra = {"batch 32": [], "50x100 frames, batch 8": []}
    for rep in range(args.reps):
        first_loader = rep % 2 == 0
        if first_loader:
            ra = loader_rate(ds, batch)
        rb = consumer_rate(train_cfg, root, tmp, args.steps, args.window)
        if not first_loader:
            ra = loader_rate(ds, batch)
        extra["batch 32"].append(loader_rate(ds, 32, 0.2))
        extra["50x100 frames, batch 8"].append(loader_rate(big, batch, 0.2))
        a.append(ra)
        b.append(rb)
        ratios.append(ra / rb)
        print(
            f"rep {rep}: loader {ra:,.0f} samples/s, consumer {rb:,.0f} samples/s, "
            f"ratio {ra / rb:.1f} ({c.machine_load()})"
        )

    print(
        f"\nloader (get_batch + sampler, batch {batch}, chunk {LOADER_CHUNK}): "
        f"median {c.median(a):,.0f} samples/s ({c.spread(a)}) "
        f"= {1e6 * batch / c.median(a):.0f} us/batch"
    )
    for name, xs in extra.items():
        print(f"loader, {name}: median {c.median(xs):,.0f} samples/s")
    print(
        f"consumer (one training process, default run): median {c.median(b):,.0f} samples/s "
        f"({c.spread(b)}) = {c.median(b) / batch:.1f} steps/s"
    )
    med = c.median(ratios)
    print(
        f"ratio loader / consumer: median {med:.1f} (per-rep "
        f"{', '.join(f'{r:.1f}' for r in ratios)})  target >= {TARGET:g}: "
        f"{c.verdict(med >= TARGET)}"
    )


if __name__ == "__main__":
    main()
