"""Checkpoint cost: the training loop's stall per save, asynchronous vs synchronous, and resume
verification per rank at 1, 2 and 4 ranks.

    .venv/bin/python bench/bench_checkpoint_save.py [--reps 4] [--steps-between 3]

Part 1, stall. A 2-rank FSDP2 run (tests/launch.py ``run_distributed``, gloo) of the ~100 MB fp32
ACT (26.9 M params) with its AdamW state (~310 MiB of state in all) trains; after every
``--steps-between`` training steps it saves through lerobot_pipe's ``CheckpointWriter``, in turn
with four of them side by side (own output folders, rotating order each repetition):
``--checkpoint_format`` ``dcp`` (model and optimizer as DCP shards, every rank writes its own) and
``safetensors`` (the full model in one file on rank 0; the optimizer as DCP shards), each
synchronous and asynchronous. A synchronous ``safetensors`` save gathers the full model in the
loop (``get_model_state_dict(full_state_dict=True)``, a collective on the training group); an
asynchronous one stages each rank's model shards like ``dcp`` and assembles the full model on
rank 0 in the background, over the checkpoint writer's gloo group. Per save:
  * stall: the time the loop spends inside ``save()`` (the slowest rank): the whole save when
    synchronous; the copy to CPU memory when asynchronous (either format);
  * complete after: from ``save()`` until the checkpoint is complete on every rank (the
    background's end for async saves);
  * the training steps run right after each save: with an async save they share the 2 cores with
    its background write.
Ratio = async stall / sync save time of the same format (target <= 0.15). Extra memory of async
saves: the bytes each rank staged (one copy of the state it writes; DCP's DefaultStager keeps the
buffers for the next save), the growth of its RSS over its first async save, and, in one more
save per variant with no training steps after it, the peak RSS from ``save()`` until complete
above the RSS at ``save()`` (what the save itself allocates, on top of the staged copy).
Breakdown: the loop's full-model gather alone (what a sync ``safetensors`` save runs in the
loop), and the background's gather from staged shards alone.

Part 2, verification. The newest ``dcp`` checkpoint is verified by 1, 2 and 4 processes with
``verify_split`` (each its share) and, for comparison, with every process checking
every file (what each rank did before the split): bytes read per rank (``rchar`` of
/proc/self/io) and seconds per rank (median of 3). The files were just written, so they are in
the page cache: the seconds measure hashing, not the disk; on 2 cores, 4 processes hash 2 at a
time.
"""

from __future__ import annotations

import _common as c  # must come first: pins threads, sets sys.path

# isort: split

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from launch import run_distributed
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from lerobot_pipe.checkpoint.gather import gather_full_tensors
from lerobot_pipe.checkpoint.layout import list_complete_checkpoints, read_training_step
from lerobot_pipe.checkpoint.manifest import sha256_file, shares, verify_files, verify_split
from lerobot_pipe.checkpoint.stateful import TrainState
from lerobot_pipe.checkpoint.writer import CheckpointWriter
from lerobot_pipe.configs.optim import AdamWConfig
from lerobot_pipe.distributed.parallel_dims import ParallelDims
from lerobot_pipe.distributed.runtime import destroy, init_distributed
from lerobot_pipe.policies.factory import make_pre_post_processors
from lerobot_pipe.training.optim import make_optimizer

SIZE = "100mb"
WORLD = 2
FORMATS = ("dcp", "safetensors")
VARIANTS = tuple(f"{fmt}-{mode}" for fmt in FORMATS for mode in ("sync", "async"))
MIB = 1024 * 1024


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def rank_main(dataset_root: str, out_root: str, reps: int, steps_between: int) -> dict:
    env = init_distributed()
    try:
        dims = ParallelDims(dp_replicate=1, dp_shard=WORLD, world_size=WORLD)
        policy, ds, sampler, pre = c.act_policy_and_data(
            SIZE, dataset_root, 2, seed=1000, rank=env.rank, dp_world_size=WORLD
        )
        _, post = make_pre_post_processors(policy.config, dataset_stats=ds.stats)
        model = c.wrap_policy(policy, dims, env)
        optimizer = make_optimizer(
            policy.get_optim_params(), AdamWConfig(lr=1e-5, weight_decay=1e-4)
        )

        def train_step() -> float:
            t0 = time.perf_counter()
            loss, _ = model(pre(ds.get_batch(sampler.next_indices())))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return time.perf_counter() - t0

        def write_pretrained(directory: Path, full_state):
            if full_state is not None:
                policy.save_pretrained(directory, state_dict=full_state)
            else:
                policy.config.save_pretrained(directory)
            pre.save_pretrained(directory)
            post.save_pretrained(directory)
            (directory / "train_config.json").write_text(json.dumps({"bench": True}) + "\n")

        state = TrainState.build(model, optimizer, write_pretrained)
        run_info = {"step": 0, "samples_consumed": 0, "world_size": WORLD, "sharded": True}
        out = Path(out_root)
        savers = {
            v: CheckpointWriter(
                out / v,
                total_steps=10**6,
                checkpoint_format=v.split("-")[0],
                sharded=True,
                run_info=run_info,
                async_save=v.endswith("async"),
            )
            for v in VARIANTS
        }
        train_step()  # the optimizer state exists from here on
        step = 0
        staged, rss_growth = {}, {}

        def one_save(variant: str, steps_after: int = steps_between) -> dict:
            nonlocal step
            saver = savers[variant]
            step += 1
            state.progress.step = step
            if env.is_main:
                os.sync()  # dirty pages of the previous save are not charged to this one
            rss = c.rss_bytes()
            c.reset_peak_rss()
            dist.barrier()
            t0 = time.perf_counter()
            saver.save(state)
            in_save = time.perf_counter() - t0
            steps = [train_step() for _ in range(steps_after)]
            t1 = time.perf_counter()
            saver.wait()  # where the next save would wait if it came now
            waited = time.perf_counter() - t1
            complete = saver.last_duration_s
            peak = c.peak_rss_bytes() - rss
            dist.barrier()
            if env.is_main:  # untimed: keep one checkpoint per variant on disk
                for old in list_complete_checkpoints(out / variant)[:-1]:
                    shutil.rmtree(old)
            return {
                "stall": _slowest(in_save + waited),
                "waited": _slowest(waited),
                "complete": _slowest(complete),
                "steps": steps,
                "peak": peak,
            }

        gathers = []  # the loop's full-model gather (sync safetensors saves), alone
        for _ in range(3):
            dist.barrier()
            t0 = time.perf_counter()
            state.model.full_state_dict()
            gathers.append(_slowest(time.perf_counter() - t0))
        # The background's gather (async safetensors saves), alone: from a staged copy of the
        # model shards, over a gloo group of its own.
        stager = DefaultStager(StagingOptions(False, False, False, False))
        shards = stager.stage(get_model_state_dict(model))
        group = dist.new_group(backend="gloo")
        bg_gathers = []
        for _ in range(3):
            dist.barrier()
            t0 = time.perf_counter()
            gather_full_tensors(shards, group)
            bg_gathers.append(_slowest(time.perf_counter() - t0))
        del shards
        stager.close()
        # Warm-up save per variant (DCP plans, first staging allocation), not timed.
        for variant in VARIANTS:
            before = c.rss_bytes()
            one_save(variant)
            if variant.endswith("async"):
                staged[variant] = savers[variant].staged_bytes
                rss_growth[variant] = c.rss_bytes() - before
        plain_steps = [train_step() for _ in range(steps_between)]
        rows: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for rep in range(reps):
            k = rep % len(VARIANTS)
            order = VARIANTS[k:] + VARIANTS[:k]
            if rep % 2:
                order = order[::-1]
            for variant in order:
                rows[variant].append(one_save(variant))
            plain_steps += [train_step() for _ in range(steps_between)]
        peaks = {v: one_save(v, steps_after=0)["peak"] for v in VARIANTS}
        for saver in savers.values():
            saver.close()
        newest = list_complete_checkpoints(out / "dcp-sync")[-1]
        return {
            "rows": rows,
            "plain_steps": plain_steps,
            "staged": staged,
            "rss_growth": rss_growth,
            "params": c.n_params(model),
            "gather": c.median(gathers),
            "bg_gather": c.median(bg_gathers),
            "peaks": peaks,
            "verify_dir": str(newest),
        }
    finally:
        destroy()


def _bytes_read() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def verify_main(step_dir: str, split: bool) -> dict:
    env = init_distributed()
    try:
        path = Path(step_dir)
        info = read_training_step(path)
        verify_split(path, {"files": {}})  # imports and the first collective
        if env.distributed:
            dist.barrier()
        reads, seconds = [], []
        for _ in range(3):
            if env.distributed:
                dist.barrier()
            before, t0 = _bytes_read(), time.perf_counter()
            if split:
                verify_split(path, info)
            else:
                verify_files(path, info)
            seconds.append(time.perf_counter() - t0)
            reads.append(_bytes_read() - before)
        return {"bytes": max(reads), "seconds": c.median(seconds)}
    finally:
        destroy()


def _hash_share(step_dir: str, rels: list[str]) -> float:
    t0 = time.perf_counter()
    for rel in rels:
        sha256_file(Path(step_dir) / rel)
    return time.perf_counter() - t0


def hashing_parallelism(step_dir: str, files: dict) -> float:
    """Control: one process hashing everything vs two processes hashing one share each, plain
    hashlib, no torch. ~2.0 where two cores are free, ~1.0 on a saturated machine."""
    import multiprocessing as mp

    alone = _hash_share(step_dir, list(files))
    with mp.get_context("fork").Pool(2) as pool:
        t0 = time.perf_counter()
        pool.starmap(_hash_share, [(step_dir, share) for share in shares(files, 2)])
        both = time.perf_counter() - t0
    return alone / both


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--steps-between", type=int, default=3)
    args = ap.parse_args()
    tmp = c.bench_tmp("checkpoint_save")
    root = str(c.synthetic_dataset(tmp / "dataset", num_episodes=4, episode_length=50))
    print(
        f"model: ACT {SIZE} {c.ACT_SIZES[SIZE]}; FSDP2 over {WORLD} ranks (gloo); AdamW; "
        f"{args.steps_between} training steps between saves; output under {tmp}; "
        f"{c.machine_load()}"
    )
    try:
        res = run_distributed(
            rank_main, WORLD, root, str(tmp / "out"), args.reps, args.steps_between, timeout=1800
        )
        r0 = res[0]
        files = read_training_step(Path(r0["verify_dir"]))["files"]
        total = sum(v["size"] for v in files.values())
        largest = max(v["size"] for v in files.values())
        parallelism = hashing_parallelism(r0["verify_dir"], files)
        verify = {}
        for world in (1, 2, 4):
            for split in (True, False) if world > 1 else (True,):
                verify[world, split] = run_distributed(
                    verify_main, world, r0["verify_dir"], split, timeout=600
                )
    finally:
        shutil.rmtree(tmp / "out", ignore_errors=True)

    keys = ("stall", "waited", "complete")
    med = {v: {k: c.median([row[k] for row in r0["rows"][v]]) for k in keys} for v in VARIANTS}
    print(f"\nparameters: {r0['params']:,}; {args.reps} timed saves per variant (medians)")
    print(f"{'variant':14} {'stall s':>8} {'of it waiting':>14} {'complete s':>11}  stalls per rep")
    for v in VARIANTS:
        stalls = ", ".join(f"{row['stall']:.2f}" for row in r0["rows"][v])
        m = med[v]
        print(f"{v:14} {m['stall']:8.2f} {m['waited']:14.2f} {m['complete']:11.2f}  {stalls}")
    print(
        f"full-model gather alone: in the loop on the training group (sync safetensors saves) "
        f"{r0['gather']:.2f}s; from staged shards on the gloo group (async, in the background) "
        f"{r0['bg_gather']:.2f}s"
    )
    plain = c.median(r0["plain_steps"])
    print(
        f"\ntraining step with no save in flight: {plain:.3f}s (median); the "
        f"{args.steps_between} steps after each save took longer by (median):"
    )
    for v in VARIANTS:
        extra = [sum(row["steps"]) - len(row["steps"]) * plain for row in r0["rows"][v]]
        print(f"  {v:18} {c.median(extra):+.2f}s")
    print()
    for fmt in FORMATS:
        ratio = med[f"{fmt}-async"]["stall"] / med[f"{fmt}-sync"]["stall"]
        print(
            f"ratio async stall / sync save [{fmt}]: {ratio:.3f} "
            f"({c.verdict(ratio <= 0.15)} against <= 0.15)"
        )
    for v in r0["staged"]:
        growth = [r["rss_growth"][v] for r in res]
        staged = [r["staged"][v] for r in res]
        print(
            f"extra memory [{v}]: staged {', '.join(f'{b / MIB:.1f}' for b in staged)} MiB "
            f"per rank; RSS growth over the first async save "
            f"{', '.join(f'{g / MIB:.1f}' for g in growth)} MiB"
        )
    print("peak RSS of a save (no steps after it) above the RSS at save(), MiB per rank:")
    for v in VARIANTS:
        peaks = ", ".join(f"{r['peaks'][v] / MIB:.1f}" for r in res)
        print(f"  {v:18} {peaks}")
    print(
        f"\nverification of {len(files)} files, {total / MIB:.1f} MiB (largest "
        f"{largest / MIB:.1f} MiB); bound per rank = total / N + largest"
    )
    print(
        f"control, plain hashlib: 2 processes hash {parallelism:.2f}x as fast as 1 on this "
        f"machine now (2.0 = two free cores); {c.machine_load()}"
    )
    print(f"{'ranks':>5} {'how':>10} {'MiB read per rank':>28} {'seconds per rank':>24}")
    for (world, split), ranks in verify.items():
        how = "split" if split else "every rank"
        mib = ", ".join(f"{r['bytes'] / MIB:.1f}" for r in ranks)
        sec = ", ".join(f"{r['seconds']:.2f}" for r in ranks)
        ok = all(r["bytes"] <= total / world + largest + 64 * 1024 for r in ranks)
        mark = f" ({c.verdict(ok)} bound)" if split else ""
        print(f"{world:>5} {how:>10} {mib:>28} {sec:>24}{mark}")


if __name__ == "__main__":
    main()
