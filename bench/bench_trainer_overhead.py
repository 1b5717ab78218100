"""Steps/s of lerobot-train's real loop vs a bare PyTorch loop on the same model and data.

    .venv/bin/python bench/bench_trainer_overhead.py [--reps 5] [--steps 40] [--no-profile]
    .venv/bin/python bench/bench_trainer_overhead.py --camera 96   # one 96x96 AV1 camera, ResNet-18

A: ``make_plan`` + ``train`` in this process (single process, no process group), once with
``--num_workers=0`` and once with the default ``num_workers`` (a prefetch thread), ``log_freq`` =
``steps`` (one log record, at the end), ``save_checkpoint=false``. Steps/s is read from the loop's
own ``samples_per_s`` (timed from just before the first step to the end of the last).
B: the same ACTPolicy config, batch, dataset.get_batch + GlobalBatchSampler + normalizer
preprocessor, AdamW over the policy's parameter groups (the ACT preset lr / weight decay, the
backbone's lr) and grad clip 10, timed the same way. With ``--camera N`` the dataset has one
N x N camera (decoded from AV1 by both sides: the trainer in its loader threads, the bare loop
inline) and ACT its ResNet-18 backbone (random initial weights).

Runs alternate A0, A4, B (rotating which goes first) ``--reps`` times; medians are reported.
Afterwards a cProfile pass of each (unless ``--no-profile``) prints where the trainer's extra
time per step goes (tottime per function, trainer minus bare, ms/step). Target: A/B >= 0.95.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
from pathlib import Path

import _common as c  # must come first: pins threads, sets sys.path

# isort: split
import torch
from torch import nn

from lerobot_pipe.training.preflight import make_plan
from lerobot_pipe.training.train import train

TARGET = 0.95
SIZE = "medium"
BATCH = 32
CAMERA_BATCH = 8
SEED = 1000


def trainer_run(
    root: Path, tmp: Path, steps: int, num_workers: int | None, tag: str, batch: int = BATCH
) -> dict:
    out = tmp / f"out-{tag}-{time.monotonic_ns()}"
    flags = {
        "dataset.root": root,
        "output_dir": out,
        **c.policy_flags(SIZE),
        "batch_size": batch,
        "steps": steps,
        "log_freq": steps,
        "save_checkpoint": False,
        "seed": SEED,
        "num_workers": num_workers,  # None: the default
    }
    t0 = time.perf_counter()
    plan = make_plan(c.argv_from(flags), 1, os.environ)
    train(plan)
    wall = time.perf_counter() - t0
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    steps_per_s = rec["samples_per_s"] / batch
    return {
        "steps_per_s": steps_per_s,
        "loop_s": steps / steps_per_s,
        "wall_s": wall,
        "num_workers": plan.cfg.num_workers,
        "loss": rec["loss"],
    }


def bare_run(root: Path, steps: int, batch: int = BATCH) -> dict:
    t0 = time.perf_counter()
    policy, ds, sampler, pre = c.act_policy_and_data(SIZE, root, batch, seed=SEED)
    preset = policy.config.get_optimizer_preset()
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        policy.get_optim_params(),
        lr=preset.lr,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=preset.weight_decay,
    )
    torch.manual_seed(SEED)
    running = torch.zeros((), dtype=torch.float64)
    t_loop = time.perf_counter()
    for _ in range(steps):
        batch = pre(ds.get_batch(sampler.next_indices()))
        loss, _ = policy(batch)
        running += loss.detach()
        loss.backward()
        nn.utils.clip_grad_norm_(params, 10.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    loss_value = running.item() / steps  # the mean loss, as the trainer's log record
    end = time.perf_counter()
    return {
        "steps_per_s": steps / (end - t_loop),
        "loop_s": end - t_loop,
        "wall_s": end - t0,
        "loss": loss_value,
    }


def profile_diff(root: Path, tmp: Path, steps: int, top: int, batch: int) -> None:
    """cProfile each variant once; print the functions whose own time grows most in the trainer."""

    def prof(fn) -> dict:
        pr = cProfile.Profile()
        pr.enable()
        fn()
        pr.disable()
        st = pstats.Stats(pr)
        return {
            f"{Path(k[0]).name}:{k[1]}({k[2]})": (v[2], v[0]) for k, v in st.stats.items()
        }  # tottime, primitive calls

    bare = prof(lambda: bare_run(root, steps, batch))
    for nw in (0, None):
        trainer = prof(lambda nw=nw: trainer_run(root, tmp, steps, nw, "prof", batch))
        label = "num_workers=0" if nw == 0 else "num_workers=default"
        extra = []
        for name, (tt, calls) in trainer.items():
            b_tt, b_calls = bare.get(name, (0.0, 0))
            extra.append((tt - b_tt, name, calls, b_calls))
        extra.sort(reverse=True)
        print(
            f"\n[profile] trainer ({label}) minus bare, own time per step, {steps} steps "
            "(includes each side's setup: model build, make_plan):"
        )
        print(f"  {'ms/step':>8}  {'calls A':>8} {'calls B':>8}  function")
        for d, name, calls, b_calls in extra[:top]:
            print(f"  {1e3 * d / steps:8.3f}  {calls:8d} {b_calls:8d}  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--profile-top", type=int, default=15)
    ap.add_argument("--camera", type=int, default=0, help="one camera of this size (0: none)")
    args = ap.parse_args()

    tmp = c.bench_tmp("trainer_overhead")
    if args.camera:
        root = c.synthetic_dataset(tmp / f"dataset-cam{args.camera}", 20, 50, args.camera)
    else:
        root = c.synthetic_dataset(tmp / "dataset")
    batch = CAMERA_BATCH if args.camera else BATCH
    policy, *_ = c.act_policy_and_data(SIZE, root, batch)
    camera = f"one {args.camera}x{args.camera} AV1 camera, ResNet-18; " if args.camera else ""
    print(
        f"model: ACT {SIZE} {c.ACT_SIZES[SIZE]}, {c.n_params(policy):,} params; {camera}batch {batch}; "
        f"{args.steps} steps x {args.reps} reps; torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s); {c.machine_load()}"
    )
    del policy

    # warm-up (imports, allocator, first-call costs) for both paths
    trainer_run(root, tmp, 3, 0, "warm", batch)
    bare_run(root, 3, batch)

    variants = {
        "trainer nw=0": lambda: trainer_run(root, tmp, args.steps, 0, "a0", batch),
        "trainer nw=default": lambda: trainer_run(root, tmp, args.steps, None, "a4", batch),
        "bare": lambda: bare_run(root, args.steps, batch),
    }
    names = list(variants)
    results: dict[str, list[dict]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {"trainer nw=0": [], "trainer nw=default": []}
    for rep in range(args.reps):
        order = names[rep % 3 :] + names[: rep % 3]
        this = {}
        for name in order:
            this[name] = variants[name]()
            results[name].append(this[name])
        for name in ratios:
            ratios[name].append(this[name]["steps_per_s"] / this["bare"]["steps_per_s"])
        print(
            f"rep {rep}: "
            + ", ".join(f"{n} {this[n]['steps_per_s']:.2f}" for n in names)
            + f" steps/s ({c.machine_load()})"
        )

    default_nw = results["trainer nw=default"][0]["num_workers"]
    print(f"\n{'variant':22} {'steps/s (median)':>17} {'ms/step':>8} {'setup s':>8}  spread")
    for name in names:
        sps = [r["steps_per_s"] for r in results[name]]
        setup = [r["wall_s"] - r["loop_s"] for r in results[name]]
        label = name if name != "trainer nw=default" else f"trainer nw={default_nw} (default)"
        print(
            f"{label:22} {c.median(sps):17.2f} {1e3 / c.median(sps):8.1f} "
            f"{c.median(setup):8.2f}  {c.spread(sps)}"
        )
    losses = {n: results[n][0]["loss"] for n in names}
    print(
        "mean loss over the run (same work check): "
        + ", ".join(f"{n} {v:.6f}" for n, v in losses.items())
    )
    print()
    for name, rs in ratios.items():
        med = c.median(rs)
        print(
            f"ratio {name} / bare: median {med:.3f} (per-rep {', '.join(f'{r:.3f}' for r in rs)})"
            f"  target >= {TARGET}: {c.verdict(med >= TARGET)}"
        )

    if not args.no_profile:
        profile_diff(root, tmp, args.steps, args.profile_top, batch)


if __name__ == "__main__":
    main()
