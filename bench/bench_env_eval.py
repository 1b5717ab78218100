"""Episodes per second of lerobot-train's in-training rollouts on 1 and 2 ranks, and what share
of a training run they cost at the default --env_eval_freq.

    .venv/bin/python bench/bench_env_eval.py [--reps 2] [--episodes 20] [--pusht]

Each run is the real trainer (``make_plan`` + ``train``; 2 ranks through tests/launch.py's
``run_distributed``, gloo, DDP and FSDP2): the tiny ACT ("small") trained ``--steps`` steps and
rolled out once at the last step in ``--env.type=synthetic`` (``--episodes`` episodes, vector envs
of ``--batch`` sub-envs, synchronous). Episodes per second is ``n_episodes / eval_s`` of the
run's eval_info.json (the whole collective evaluation, gathering and writing included; videos of
the first 4 episodes included). A training step's time is the median ``step_s`` of the run's
metrics.jsonl. The share at the default (every 20,000 steps, 50 episodes) is
``50 / eps / (20000 x step_s + 50 / eps)``. An untrained policy never reaches the goal, so every
episode runs its full length (50 steps): the slowest case. With ``--pusht`` the same for
gym-pusht (300-step episodes, 96x96 image: ACT with a random-init ResNet-18), on a small
dataset recorded in PushT (tests/evaluation/pusht_data.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import _common as c  # must come first: pins threads, sets sys.path

# isort: split
from launch import run_distributed

from lerobot_pipe import constants as C

DEFAULT_FREQ, DEFAULT_EPISODES = 20_000, 50


def _train(argv: list[str]) -> None:
    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.train import train

    train(make_plan(argv, int(os.environ.get("WORLD_SIZE", "1")), os.environ))


def run(root: Path, tmp: Path, env: dict, world: int, topology: str, args, tag: str) -> dict:
    out = tmp / f"{tag}-{time.monotonic_ns()}"
    flags = {
        "dataset.root": root,
        "output_dir": out,
        **c.policy_flags("small"),
        "policy.dropout": 0.0,
        "policy.use_vae": False,
        "batch_size": 8 // world,
        "steps": args.steps,
        "log_freq": 1,
        "save_checkpoint": False,
        "num_workers": 0,
        "env_eval_freq": args.steps,
        "eval.n_episodes": args.episodes,
        "eval.batch_size": args.batch,
        "eval.use_async_envs": False,
        **env,
    }
    if topology == "fsdp":
        flags |= {"parallelism.dp_shard": world}
    argv = c.argv_from(flags)
    if world == 1:
        _train(argv)
    else:
        run_distributed(_train, world, argv, timeout=3600)
    info = json.loads((out / C.EVAL_DIR / f"{args.steps:06d}" / C.EVAL_INFO).read_text())["overall"]
    records = [json.loads(line) for line in (out / C.METRICS_LOG).read_text().splitlines()]
    step_s = statistics.median(r["step_s"] for r in records if "step_s" in r)
    eps = info["n_episodes"] / info["eval_s"]
    default_eval_s = DEFAULT_EPISODES / eps
    return {
        "episodes_per_s": eps,
        "eval_s": info["eval_s"],
        "step_s": step_s,
        "share": default_eval_s / (DEFAULT_FREQ * step_s + default_eval_s),
        "pc_success": info["pc_success"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--pusht", action="store_true", help="also gym-pusht (300-step episodes)")
    args = ap.parse_args()
    tmp = c.bench_tmp("env_eval")
    suites = {"synthetic": (c.synthetic_dataset(tmp / "ds", 20, 50), {"env.type": "synthetic"})}
    if args.pusht:
        sys.path.insert(0, str(c.REPO / "tests" / "evaluation"))
        from pusht_data import write_pusht_dataset

        suites["pusht"] = (
            write_pusht_dataset(tmp / "pusht", episodes=4, length=30),
            {"env.type": "pusht"},
        )
    print(
        f"tiny ACT, {args.episodes} episodes, vector envs of {args.batch}, {args.reps} reps; "
        f"{c.machine_load()}"
    )
    configs = [(1, "single"), (2, "ddp"), (2, "fsdp")]
    for suite, (root, env) in suites.items():
        results: dict[str, list[dict]] = {name: [] for _, name in configs}
        for rep in range(args.reps):
            for world, name in configs[rep % 3 :] + configs[: rep % 3]:
                results[name].append(run(root, tmp, env, world, name, args, f"{suite}-{name}"))
                r = results[name][-1]
                print(
                    f"{suite} rep {rep} {name}: {r['episodes_per_s']:.2f} episodes/s, "
                    f"step {1e3 * r['step_s']:.1f} ms ({c.machine_load()})"
                )
        print(f"\n{suite}: {'ranks':>5} {'episodes/s':>11} {'vs 1':>6} {'step ms':>8} {'share':>8}")
        base = c.median([r["episodes_per_s"] for r in results["single"]])
        for world, name in configs:
            eps = c.median([r["episodes_per_s"] for r in results[name]])
            step = c.median([r["step_s"] for r in results[name]])
            share = c.median([r["share"] for r in results[name]])
            print(
                f"{name:>10} {world:5d} {eps:11.2f} {eps / base:6.2f} {1e3 * step:8.1f} "
                f"{100 * share:7.2f}%"
            )


if __name__ == "__main__":
    main()
