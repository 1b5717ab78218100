"""How trainer cost grows: steps/s at 3 ACT sizes x 1, 2, 4 processes (DDP).

    .venv/bin/python bench/bench_scaling.py [--reps 2] [--batch 8] [--sizes small,medium,large]

Every cell is lerobot-train's library path (``make_plan`` + ``train``) in ranks forked by
tests/launch.py ``run_distributed`` (gloo; 1 process = the single-process path, no process
group; 2 and 4 = DDP, the default topology). The per-rank batch is fixed (weak scaling: the
global batch grows with the processes). Steps/s comes from the loop's own log records after
the first (warm-up) window; global samples/s = steps/s x batch x processes. Cells alternate
across repetitions; medians. On a 2-core machine 4 processes oversubscribe the cores.
"""

from __future__ import annotations

import _common as c  # must come first: pins threads, sets sys.path

# isort: split

import argparse
import json
import os
from pathlib import Path

from launch import run_distributed

from lerobot_pipe.training.preflight import make_plan
from lerobot_pipe.training.train import train


def rank_main(argv: list[str]) -> list[float] | None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    plan = make_plan(argv, world, os.environ)
    train(plan)
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    lines = (plan.output_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(ln)["samples_per_s"] for ln in lines]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument(
        "--steps",
        default="small=80,medium=48,large=24",
        help="loop steps per size; logged in 4 windows, the first one dropped",
    )
    ap.add_argument("--sizes", default="small,medium,large")
    ap.add_argument("--worlds", default="1,2,4")
    args = ap.parse_args()
    sizes = args.sizes.split(",")
    steps = {k: int(v) for k, v in (kv.split("=") for kv in args.steps.split(","))}
    worlds = [int(w) for w in args.worlds.split(",")]

    tmp = c.bench_tmp("scaling")
    root = c.synthetic_dataset(tmp / "dataset")
    from lerobot_pipe.policies.act import ACTPolicy  # noqa: F401 - param counts below

    params = {}
    for s in sizes:
        policy, *_ = c.act_policy_and_data(s, root, args.batch)
        params[s] = c.n_params(policy)
    print(
        f"per-rank batch {args.batch}; loop steps {steps} (4 log windows, first dropped); "
        f"{c.machine_load()}"
    )
    for s in sizes:
        print(f"  {s}: {params[s]:,} params, {c.ACT_SIZES[s]}")

    cells: dict[tuple[str, int], list[float]] = {(s, w): [] for s in sizes for w in worlds}
    n = 0
    for rep in range(args.reps):
        for s in sizes:
            for w in worlds if rep % 2 == 0 else worlds[::-1]:
                n += 1
                flags = {
                    "dataset.root": root,
                    "output_dir": Path(tmp) / f"out-{n}",
                    **c.policy_flags(s),
                    "batch_size": args.batch,
                    "steps": steps[s],
                    "log_freq": max(1, steps[s] // 4),
                    "save_checkpoint": False,
                    "num_workers": 0,
                }
                rates = run_distributed(rank_main, w, c.argv_from(flags), timeout=600)[0]
                steps_per_s = c.median(rates[1:]) / (args.batch * w)
                cells[(s, w)].append(steps_per_s)
                print(f"rep {rep} {s:6} x{w}: {steps_per_s:.2f} steps/s ({c.machine_load()})")

    print(
        f"\n{'size':8} {'params':>10} "
        + " ".join(f"{f'{w} proc steps/s':>15}" for w in worlds)
        + "  "
        + " ".join(f"{f'{w}p samples/s':>14}" for w in worlds)
        + "  "
        + " ".join(f"{f'eff {w}p':>7}" for w in worlds[1:])
    )
    for s in sizes:
        med = {w: c.median(cells[(s, w)]) for w in worlds}
        print(
            f"{s:8} {params[s]:10,} "
            + " ".join(f"{med[w]:15.2f}" for w in worlds)
            + "  "
            + " ".join(f"{med[w] * args.batch * w:14.0f}" for w in worlds)
            + "  "
            + " ".join(f"{med[w] / med[worlds[0]]:7.2f}" for w in worlds[1:])
        )
    print(
        "(eff Np = steps/s at N processes / steps/s at 1: 1.00 is perfect weak scaling; "
        "with 2 cores the ceiling is 1.00 at 2 processes and 0.50 at 4)"
    )


if __name__ == "__main__":
    main()
