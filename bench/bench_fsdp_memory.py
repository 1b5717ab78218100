"""Per-rank memory of a ~100 MB fp32 ACT (or Diffusion Policy at LeRobot's default size, ~263M
parameters) under FSDP2 at dp_shard = 1, 2, 4.

    .venv/bin/python bench/bench_fsdp_memory.py [--reps 2] [--shards 1,2,4] [--policy diffusion]

Each topology runs through tests/launch.py's ``run_distributed`` (forked ranks, real gloo
process groups); the model is built like the trainer builds it and wrapped by
``lerobot_pipe.distributed.parallelize.apply_parallelism`` with a ``ParallelDims`` (dp_shard=1 on
one rank is the plain single-process path). After ONE optimizer step (gradients kept; AdamW for
ACT, Adam with LeRobot's preset for Diffusion Policy, whose batch also holds one 96x96 camera over
its 2 observation steps) each rank reports:
  * the bytes of its local shards of parameters, gradients and optimizer state
    (``DTensor.to_local()``), and their ratio to the dp_shard=1 figure (target <= 1/N + 10%,
    read as <= 1.1/N);
  * its RSS growth above its own post-import baseline (VmRSS after gc + malloc_trim, measured
    in the forked rank before the process group, the model or anything else exists).
Topologies alternate (1,2,4,4,2,1,...) over ``--reps``; byte counts are exact, RSS is the median.
"""

from __future__ import annotations

import _common as c  # must come first: pins threads, sets sys.path

# isort: split

import argparse

import torch
from launch import run_distributed

from lerobot_pipe.configs.optim import AdamWConfig
from lerobot_pipe.datasets import GlobalBatchSampler, LeRobotDataset  # noqa: F401 - baseline
from lerobot_pipe.distributed.parallel_dims import ParallelDims
from lerobot_pipe.distributed.runtime import destroy, init_distributed
from lerobot_pipe.policies.factory import (
    make_policy,  # noqa: F401 - baseline
    make_pre_post_processors,  # noqa: F401 - baseline
)
from lerobot_pipe.training.optim import make_optimizer

MB = 1024 * 1024
SIZE = "100mb"
BATCH = 2  # per rank: memory of state, not of activations


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(tensors) -> int:
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            loc = _local(t)
            total += loc.numel() * loc.element_size()
    return total


def rank_main(dp_shard: int, dataset_root: str, policy_type: str) -> dict:
    base = c.rss_parts()  # post-import (imports inherited from the parent), before anything else
    env = init_distributed()
    try:
        after_pg = c.rss_parts()
        dims = ParallelDims(dp_replicate=1, dp_shard=dp_shard, world_size=dp_shard)
        if policy_type == "diffusion":
            policy, ds, sampler, pre = c.diffusion_policy_and_data(
                dataset_root, BATCH, seed=1000, rank=env.rank, dp_world_size=dims.dp_world_size
            )
            optimizer_cfg = policy.config.get_optimizer_preset()
        else:
            policy, ds, sampler, pre = c.act_policy_and_data(
                SIZE,
                dataset_root,
                BATCH,
                seed=1000,
                rank=env.rank,
                dp_world_size=dims.dp_world_size,
            )
            optimizer_cfg = AdamWConfig(lr=1e-5, weight_decay=1e-4)
        global_params = c.n_params(policy)
        stages = {"process group": after_pg, "model built": c.rss_parts()}
        model = c.wrap_policy(policy, dims, env)
        optimizer = make_optimizer(policy.get_optim_params(), optimizer_cfg)
        stages["wrapped"] = c.rss_parts()
        loss, _ = model(pre(ds.get_batch(sampler.next_indices())))
        loss.backward()
        optimizer.step()  # gradients are kept: they are part of the steady-state footprint
        params = list(model.parameters())
        result = {
            "rank": env.rank,
            "mode": dims.mode,
            "global_params": global_params,
            "local_param_numel": sum(_local(p).numel() for p in params),
            "params_b": _nbytes(params),
            "grads_b": _nbytes(p.grad for p in params if p.grad is not None),
            "optim_b": _nbytes(v for s in optimizer.state.values() for v in s.values()),
            "baseline_rss_b": base["VmRSS"],
            "pg_rss_b": after_pg["VmRSS"] - base["VmRSS"],
        }
        result["state_b"] = result["params_b"] + result["grads_b"] + result["optim_b"]
        del loss
        end = c.rss_parts()
        stages["after step"] = end
        result["stages_anon_b"] = {k: v["RssAnon"] - base["RssAnon"] for k, v in stages.items()}
        result["rss_growth_b"] = end["VmRSS"] - base["VmRSS"]
        result["anon_growth_b"] = end["RssAnon"] - base["RssAnon"]
        result["file_growth_b"] = end["RssFile"] - base["RssFile"]
        return result
    finally:
        destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--policy", choices=("act", "diffusion"), default="act")
    args = ap.parse_args()
    shards = [int(s) for s in args.shards.split(",")]

    tmp = c.bench_tmp("fsdp_memory")
    if args.policy == "diffusion":
        from lerobot_pipe.datasets import write_synthetic_dataset

        root = str(
            write_synthetic_dataset(
                tmp / "dataset", num_episodes=4, episode_length=80, cameras=["top"], image_size=96
            )
        )
        model = "Diffusion Policy at LeRobot 0.6.1's defaults, one 96x96 camera; Adam (preset)"
    else:
        root = str(c.synthetic_dataset(tmp / "dataset", num_episodes=4, episode_length=50))
        model = f"ACT {SIZE} {c.ACT_SIZES[SIZE]}; AdamW"
    print(f"model: {model}; per-rank batch {BATCH}; {c.machine_load()}")

    runs: dict[int, list[list[dict]]] = {n: [] for n in shards}
    for rep in range(args.reps):
        order = shards if rep % 2 == 0 else shards[::-1]
        for n in order:
            with c.Timer() as t:
                res = run_distributed(rank_main, n, n, root, args.policy, timeout=1800)
            runs[n].append(res)
            print(
                f"rep {rep} dp_shard={n}: {t.s:.1f}s, per-rank state "
                f"{[round(r['state_b'] / MB, 1) for r in res]} MB, RSS growth "
                f"{[round(r['rss_growth_b'] / MB, 1) for r in res]} MB"
            )

    ref = runs[shards[0]][0][0]
    print(
        f"\nglobal parameters: {ref['global_params']:,} "
        f"({ref['global_params'] * 4 / MB:.1f} MiB fp32)"
    )
    ref_state = max(r["state_b"] for r in runs[shards[0]][0])
    ref_rss = c.median([max(r["rss_growth_b"] for r in res) for res in runs[shards[0]]])
    hdr = (
        f"{'dp_shard':>8} {'mode':>6} {'params':>8} {'grads':>8} {'optim':>8} {'state':>8} "
        f"{'ratio':>6} {'target':>7} {'verdict':>7} {'RSS growth':>10} {'RSS ratio':>9} "
        f"{'anon':>7} {'file':>6}"
    )
    print("per-rank figures (MiB; the largest rank):")
    print(hdr)
    for n in shards:
        first = runs[n][0]
        worst = max(first, key=lambda r: r["state_b"])
        ratio = worst["state_b"] / ref_state
        target = 1.1 / n
        rss = c.median([max(r["rss_growth_b"] for r in res) for res in runs[n]])
        anon = c.median([max(r["anon_growth_b"] for r in res) for res in runs[n]])
        file_ = c.median([max(r["file_growth_b"] for r in res) for res in runs[n]])
        ok = ratio <= target + 1e-9
        print(
            f"{n:8d} {worst['mode']:>6} {worst['params_b'] / MB:8.1f} {worst['grads_b'] / MB:8.1f}"
            f" {worst['optim_b'] / MB:8.1f} {worst['state_b'] / MB:8.1f} {ratio:6.3f} "
            f"{target:7.3f} {c.verdict(ok):>7} {rss / MB:10.1f} {rss / ref_rss:9.3f} "
            f"{anon / MB:7.1f} {file_ / MB:6.1f}"
        )
    print(
        "RssAnon growth by stage (MiB, rank 0, first rep): "
        + "; ".join(
            f"dp_shard={n}: "
            + ", ".join(f"{k} {v / MB:.0f}" for k, v in runs[n][0][0]["stages_anon_b"].items())
            for n in shards
        )
    )
    print(
        "(target: state ratio <= 1.1/N; RSS growth = VmRSS after the step minus the rank's "
        "post-import VmRSS, both after gc + malloc_trim; anon / file = its RssAnon (heap) and "
        "RssFile (first-touched library code pages) parts; includes the process group's own "
        f"buffers: {c.median([r['pg_rss_b'] for res in runs[shards[-1]] for r in res]) / MB:.1f}"
        f" MiB at dp_shard={shards[-1]})"
    )


if __name__ == "__main__":
    main()
