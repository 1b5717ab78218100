"""Sharded checkpoint save time vs torch.save of the same full state on one process.

    .venv/bin/python bench/bench_checkpoint_save.py [--reps 5]

A 2-rank FSDP2 run (tests/launch.py ``run_distributed``, gloo) of the ~100 MB fp32 ACT
(27.1 M params) wrapped by ``apply_parallelism``, AdamW after one step (so the optimizer state
exists: ~310 MiB of model + optimizer state in all). Per repetition, in rotating order:
  * ``save_checkpoint(..., checkpoint_format="dcp")``: model and optimizer as DCP shards, every
    rank writes its own; config / processors / RNG / JSON on rank 0; everything fsynced;
  * ``save_checkpoint(..., checkpoint_format="safetensors")``: the full model gathered to rank 0
    and written as model.safetensors, the optimizer as DCP shards (the sharded-run layout);
  * ``torch.save({"model": full, "optimizer": full})`` by rank 0 alone (the other rank waits), of
    the full state gathered once beforehand; shown without and with an fsync of the file
    (save_checkpoint fsyncs everything it writes, so "+fsync" is the like-for-like baseline).
Each is timed from a barrier to a barrier (the slowest rank), after an ``os.sync()``. Medians;
ratio = save / torch.save.
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
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from lerobot_pipe.configs.optim import AdamWConfig
from lerobot_pipe.distributed.parallel_dims import ParallelDims
from lerobot_pipe.distributed.runtime import destroy, init_distributed
from lerobot_pipe.processors import make_pre_post_processors
from lerobot_pipe.training.checkpoint import CheckpointContext, save_checkpoint
from lerobot_pipe.training.optim import make_optimizer

SIZE = "100mb"
WORLD = 2
VARIANTS = ("dcp", "safetensors", "torch.save", "torch.save+fsync")


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def rank_main(dataset_root: str, out_root: str, reps: int) -> dict:
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
        loss, _ = model(pre(ds.get_batch(sampler.next_indices())))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        out = Path(out_root)

        def write_pretrained(directory: Path, full_state):
            if full_state is not None:
                policy.save_pretrained(directory, state_dict=full_state)
            else:
                policy.config.save_pretrained(directory)
            pre.save_pretrained(directory)
            post.save_pretrained(directory)
            (directory / "train_config.json").write_text(json.dumps({"bench": True}) + "\n")

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        t0 = time.perf_counter()
        full = {
            "model": get_model_state_dict(model, options=opts),
            "optimizer": get_optimizer_state_dict(model, optimizer, options=opts),
        }
        gather_s = time.perf_counter() - t0

        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        sizes: dict[str, int] = {}
        step = 0
        for rep in range(reps):
            order = VARIANTS[rep % 3 :] + VARIANTS[: rep % 3] if rep % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                step += 1
                if env.is_main:
                    os.sync()  # dirty pages of the previous save are not charged to this one
                dist.barrier()
                t0 = time.perf_counter()
                if variant in ("dcp", "safetensors"):
                    ctx = CheckpointContext(env.is_main, True, variant)
                    written = save_checkpoint(
                        output_dir=out / variant,
                        step=step,
                        total_steps=10_000,
                        model=model,
                        optimizer=optimizer,
                        ctx=ctx,
                        write_pretrained=write_pretrained,
                        training_step={
                            "step": step,
                            "samples_consumed": step * 2 * WORLD,
                            "dp_world_size": WORLD,
                            "world_size": WORLD,
                            "batch_size": 2,
                            "grad_accum_steps": 1,
                            "parallelism": dims.to_dict(),
                            "sharded": True,
                            "checkpoint_format": variant,
                        },
                    )
                elif env.is_main:
                    written = out / f"{variant}-{step}.pt"
                    written.parent.mkdir(parents=True, exist_ok=True)
                    with open(written, "wb") as f:
                        torch.save(full, f)
                        if variant.endswith("fsync"):
                            f.flush()
                            os.fsync(f.fileno())
                dist.barrier()
                times[variant].append(time.perf_counter() - t0)
                if env.is_main:
                    sizes[variant] = (
                        _dir_bytes(written) if written.is_dir() else written.stat().st_size
                    )
                    if written.is_dir():
                        shutil.rmtree(out / variant, ignore_errors=True)
                    else:
                        written.unlink()
                dist.barrier()
        return {"times": times, "sizes": sizes, "gather_s": gather_s, "params": c.n_params(model)}
    finally:
        destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    tmp = c.bench_tmp("checkpoint_save")
    root = str(c.synthetic_dataset(tmp / "dataset", num_episodes=4, episode_length=50))
    print(
        f"model: ACT {SIZE} {c.ACT_SIZES[SIZE]}; FSDP2 over {WORLD} ranks (gloo); AdamW after "
        f"one step; output under {tmp}; {c.machine_load()}"
    )
    try:
        res = run_distributed(rank_main, WORLD, root, str(tmp / "out"), args.reps, timeout=900)
    finally:
        shutil.rmtree(tmp / "out", ignore_errors=True)
    r0 = res[0]
    med = {v: c.median(r0["times"][v]) for v in VARIANTS}
    mib = 1024 * 1024
    print(
        f"full state gathered to rank 0 (model + optimizer, collective, once): "
        f"{r0['gather_s']:.2f}s"
    )
    print(f"\n{'variant':18} {'median s':>9} {'MiB written':>12}  per-rep")
    for v in VARIANTS:
        print(
            f"{v:18} {med[v]:9.2f} {r0['sizes'][v] / mib:12.1f}  "
            + ", ".join(f"{t:.2f}" for t in r0["times"][v])
        )
    print()
    for v in ("dcp", "safetensors"):
        print(
            f"ratio save_checkpoint[{v}] / torch.save: {med[v] / med['torch.save']:.2f}; "
            f"/ torch.save+fsync: {med[v] / med['torch.save+fsync']:.2f}"
        )


if __name__ == "__main__":
    main()
