"""GPU smoke test (<= 5 min): nccl, a bf16 single-GPU lerobot-train run, a resume, samples/s.

    make gpu-check                         # the same as the next line, in the project's venv
    python bench/gpu_smoke.py              # on a machine with a CUDA GPU and a CUDA build of torch
    python bench/gpu_smoke.py --dry-run    # anywhere (CPU): builds and checks every command

Steps (each failure exits non-zero with the reason):
  1. CUDA and nccl are available; a ``torchrun`` with one process per visible GPU runs an nccl
     all_reduce across them;
  2. ``lerobot-pipe make-dataset`` writes a synthetic dataset into a temporary folder;
  3. ``torchrun --standalone --nproc-per-node=1 lerobot-train ... --accelerator.mixed_precision=bf16
     --parallelism.dp_shard=1`` trains ACT (LeRobot's default size: dim_model 512, chunk 100)
     for ``--steps`` steps, saving every ``--steps/2``; (world size 1 cannot shard: this is the
     plain bf16-autocast single-GPU path);
  4. the same command with ``--resume=true --steps=<1.5x> --checkpoint_async=true`` continues
     from the last checkpoint, saving in the background;
  5. checks: every checkpoint is complete, the log records are finite and continue after the
     resumed step, the run said it used cuda; prints samples/s of each run.
At the end it lists what it verified.
``--dry-run`` skips the GPU steps: it prints every command, writes the dataset and runs
``lerobot-pipe validate`` on the training flags (lerobot-train's own parsing and checks).
``--cpu-rehearsal`` runs steps 2-5 for real on CPU with a tiny ACT (bf16 autocast on CPU), to
test this script's own checks without a GPU (~1 min on 2 cores).
Everything is written under a fresh temporary folder, removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NCCL_CHECK = """
import os, torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(4, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
assert x.tolist() == [float(dist.get_world_size())] * 4, x
if dist.get_rank() == 0:
    print("nccl all_reduce ok across", dist.get_world_size(), "x", torch.cuda.get_device_name(),
          "nccl", torch.cuda.nccl.version())
dist.destroy_process_group()
"""


class SmokeFailure(RuntimeError):
    pass


def _console(name: str, module: str) -> list[str]:
    """The console script next to this interpreter (or on PATH), else ``python -m module``."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return [str(beside)]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", module]


def _torchrun(target: list[str], nproc: int = 1) -> list[str]:
    """torchrun for ``nproc`` processes; ``target`` is a script path (+ args) or ``-m module``
    (+ args)."""
    base = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
    ]
    if target[0] == sys.executable and target[1] == "-m":  # python -m module -> torchrun -m module
        return base + ["-m", *target[2:]]
    return base + target


def _run(cmd: list[str], what: str, timeout: float, log: Path | None = None) -> str:
    print(f"\n$ {' '.join(cmd)}", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise SmokeFailure(f"{what}: timed out after {timeout:.0f}s") from e
    out = proc.stdout + proc.stderr
    if log is not None:
        log.write_text(out)
    tail = "\n".join(out.strip().splitlines()[-15:])
    print(f"  ({time.perf_counter() - t0:.1f}s, exit {proc.returncode})\n{tail}", flush=True)
    if proc.returncode != 0:
        raise SmokeFailure(f"{what}: exit status {proc.returncode}")
    return out


def tiny_act_flags() -> list[str]:
    """The package's tiny ACT (ACT_TINY_PRESET), for --cpu-rehearsal."""
    from lerobot_pipe.policies.act import ACT_TINY_PRESET

    return [f"--policy.{key}={value}" for key, value in ACT_TINY_PRESET.items()]


def train_flags(dataset: Path, output: Path, steps: int, batch: int, tiny: bool) -> list[str]:
    save_freq = max(1, steps // 2)
    return [
        f"--dataset.root={dataset}",
        f"--output_dir={output}",
        "--policy.type=act",  # LeRobot's default ACT (dim_model 512, 4+1 layers, chunk 100)
        *(tiny_act_flags() if tiny else []),
        f"--batch_size={batch}",
        f"--steps={steps}",
        f"--save_freq={save_freq}",
        f"--log_freq={max(1, save_freq // 4)}",
        "--num_workers=4",
        "--seed=1000",
        "--checkpoint_format=safetensors",
        "--accelerator.mixed_precision=bf16",
        "--parallelism.dp_shard=1",
    ]


def check_environment(dry_run: bool) -> tuple[int, str]:
    """The number of visible GPUs and what was found, or SmokeFailure."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    nccl = dist.is_available() and dist.is_nccl_available()
    print(f"torch {torch.__version__}; cuda available: {cuda}; nccl available: {nccl}")
    found = f"torch {torch.__version__} (CUDA {torch.version.cuda})"
    if cuda:
        found += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name()} with bf16"
        print(
            f"GPU: {torch.cuda.get_device_name()} x {torch.cuda.device_count()}, "
            f"bf16 supported: {torch.cuda.is_bf16_supported()}"
        )
    if dry_run:
        return 0, found
    if not cuda:
        raise SmokeFailure("CUDA is not available (a CPU build of torch, or no GPU visible)")
    if not nccl:
        raise SmokeFailure("torch.distributed reports no nccl backend")
    if not torch.cuda.is_bf16_supported():
        raise SmokeFailure("this GPU does not support bf16")
    return torch.cuda.device_count(), found


def check_metrics(output: Path, expect_last: int, resumed_at: int | None) -> list[dict]:
    path = output / "metrics.jsonl"
    if not path.is_file():
        raise SmokeFailure(f"{path} was not written")
    records = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    if not records or records[-1]["step"] != expect_last:
        raise SmokeFailure(
            f"{path}: last record is step {records[-1]['step'] if records else None}, "
            f"expected {expect_last}"
        )
    bad = [r for r in records if not math.isfinite(r["loss"]) or not math.isfinite(r["grad_norm"])]
    if bad:
        raise SmokeFailure(
            f"{path}: non-finite loss / grad_norm at steps {[r['step'] for r in bad]}"
        )
    steps = [r["step"] for r in records]
    if steps != sorted(set(steps)):
        raise SmokeFailure(f"{path}: steps are not strictly increasing: {steps}")
    if resumed_at is not None and not any(r["step"] > resumed_at for r in records):
        raise SmokeFailure(f"{path}: no record after the resumed step {resumed_at}")
    return records


def check_checkpoints(output: Path, steps: list[int], total: int) -> None:
    width = max(6, len(str(total)))
    for s in steps:
        d = output / "checkpoints" / f"{s:0{width}d}"
        if not (d / "training_state" / "training_step.json").is_file():
            raise SmokeFailure(f"checkpoint {d} is missing or incomplete")
        if not (d / "pretrained_model" / "model.safetensors").is_file():
            raise SmokeFailure(f"checkpoint {d} has no pretrained_model/model.safetensors")
    last = output / "checkpoints" / "last"
    if not last.is_symlink() or last.resolve().name != f"{steps[-1]:0{width}d}":
        raise SmokeFailure(f"{last} does not point at step {steps[-1]}")


def rate(records: list[dict], after: int) -> float:
    xs = sorted(r["samples_per_s"] for r in records if r["step"] > after)[1:] or [
        r["samples_per_s"] for r in records if r["step"] > after
    ]  # drop the slowest (first, warm-up) window when there are several
    return sorted(xs)[len(xs) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU: build and validate commands only")
    ap.add_argument(
        "--cpu-rehearsal",
        action="store_true",
        help="run the training steps on CPU with a tiny ACT (tests this script)",
    )
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=240.0, help="per command, seconds")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be >= 2")
    if args.cpu_rehearsal:
        args.steps, args.batch = min(args.steps, 8), min(args.batch, 8)

    tmp = Path(tempfile.mkdtemp(prefix="gpu_smoke_"))
    dataset, output = tmp / "dataset", tmp / "train"
    pipe = _console("lerobot-pipe", "lerobot_pipe.scripts.cli")
    trainer = _console("lerobot-train", "lerobot_pipe.scripts.train")
    steps, resumed_steps = args.steps, args.steps + max(1, args.steps // 2)
    first = train_flags(dataset, output, steps, args.batch, tiny=args.cpu_rehearsal)
    second = [f for f in first if not f.startswith("--steps=")] + [
        f"--steps={resumed_steps}",
        "--resume=true",
        "--checkpoint_async=true",  # the resumed run saves in the background (pinned staging)
    ]
    t_start = time.perf_counter()
    verified: list[str] = []
    try:
        gpus, found = check_environment(args.dry_run or args.cpu_rehearsal)
        if gpus:
            verified.append(f"CUDA and nccl: {found}")
        _run(
            [
                *pipe,
                "make-dataset",
                f"--root={dataset}",
                "--num_episodes=50",
                "--episode_length=200",
            ],
            "make-dataset",
            args.timeout,
        )
        if args.dry_run:
            _run(
                [*pipe, "validate", "--nproc_per_node=1", *first],
                "validate (train flags)",
                args.timeout,
            )
            print("\n[dry-run] would run:")
            nccl_script = tmp / "nccl_check.py"
            print("  " + " ".join(_torchrun([str(nccl_script)], nproc=max(gpus, 1))))
            print("  " + " ".join(_torchrun([*trainer, *first])))
            print("  " + " ".join(_torchrun([*trainer, *second])))
            print("\ngpu_smoke dry run OK (commands built, dataset written, train flags valid)")
            return 0

        if not args.cpu_rehearsal:
            nccl_script = tmp / "nccl_check.py"
            nccl_script.write_text(NCCL_CHECK)
            _run(_torchrun([str(nccl_script)], nproc=gpus), "nccl all_reduce", args.timeout)
            verified.append(f"an nccl all_reduce across {gpus} process(es), one per GPU")

        out1 = _run(
            _torchrun([*trainer, *first]), "lerobot-train (bf16)", args.timeout, tmp / "train1.log"
        )
        device = "device cpu" if args.cpu_rehearsal else "device cuda"
        if device not in out1:
            raise SmokeFailure(f"lerobot-train did not report {device!r} in its banner")
        rec1 = check_metrics(output, steps, None)
        check_checkpoints(output, sorted({steps // 2, steps}), steps)
        verified.append(
            f"lerobot-train on {device}: {steps} bf16 steps of ACT, finite loss and grad norm, "
            f"complete checkpoints at steps {sorted({steps // 2, steps})}"
        )

        out2 = _run(
            _torchrun([*trainer, *second]),
            "lerobot-train --resume=true",
            args.timeout,
            tmp / "train2.log",
        )
        if "Resuming from" not in out2:
            raise SmokeFailure("the resumed run did not report resuming from the checkpoint")
        rec2 = check_metrics(output, resumed_steps, steps)
        check_checkpoints(output, sorted({steps // 2, steps, resumed_steps}), resumed_steps)
        verified.append(
            f"--resume=true from step {steps} to {resumed_steps} with background checkpoints "
            "(--checkpoint_async=true), `last` on the newest"
        )
        loss_end1 = next(r["loss"] for r in reversed(rec1) if r["step"] <= steps)
        print(
            f"\nsamples/s: first run {rate(rec1, 0):,.0f}, resumed run {rate(rec2, steps):,.0f} "
            f"(batch {args.batch}, bf16, {'CPU rehearsal' if args.cpu_rehearsal else '1 GPU'}); loss {rec1[0]['loss']:.3f} -> {loss_end1:.3f} "
            f"-> {rec2[-1]['loss']:.3f}; total {time.perf_counter() - t_start:.0f}s"
        )
        print("gpu_smoke OK; verified:")
        for line in verified:
            print(f"  - {line}")
        return 0
    except SmokeFailure as e:
        args.keep = any(tmp.iterdir())  # keep the logs of a failed run
        where = f" (logs under {tmp})" if args.keep else ""
        print(f"\ngpu_smoke FAILED: {e}{where}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
