"""The memory planner against a real GPU run (issue #40): plan minus allowance vs
``torch.cuda.max_memory_allocated``, ratio printed, pass band 0.85-1.15.

    make gpu-check                             # with bench/gpu_smoke.py, in the project's venv
    python bench/gpu_memory_check.py           # on a machine with one CUDA GPU
    python bench/gpu_memory_check.py --dry-run # anywhere: writes the dataset, prints each plan
    python bench/gpu_memory_check.py --cpu-rehearsal  # the same runs on the CPU (~2 min, 2 cores)

For each configuration (ACT at LeRobot's default size and Diffusion Policy with a camera, fp32
and bf16, batch 8 and 32) it plans the run with ``lerobot_pipe.training.memory_plan.plan_memory``
(world size 1, the GPU's memory), then trains it for 3 steps in this process on the GPU with
the peak statistics reset, and compares the plan's counted bytes (its total less its allowance,
which stands for what the caching allocator does not hand out: CUDA context, NCCL) with the
largest memory the allocator handed out. Each line: the configuration, planned GiB, measured GiB,
their ratio, PASS/MISS. Exits non-zero on any MISS.

``--cpu-rehearsal`` runs the same configurations for real on the CPU, measured by what an
allocator would be asked for: every storage the run's ops create, counted from its creation to
its release, the largest sum over the run (tests/memory_runs.py's ``peak_of_a_cpu_run``: a
dispatch mode with weak-reference finalizers, the instrument of the planner's tests). It tests
this script's own path (eight trainings in one process, the flags, the comparison) and the
plan's whole step without a GPU; it counts a little the GPU would not (the CPU side of the data
loading) and none of what only a GPU has (cuBLAS / cuDNN workspaces, the allocator's 512-byte
rounding).

The GPU run was never made where this was written (no GPU there): its first run is its test.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from memory_runs import peak_of_a_cpu_run  # noqa: E402 - tests/: the planner's tests' instrument

BAND = (0.85, 1.15)
GIB = 1024**3


def configurations(root: Path, camera_root: Path) -> dict[str, list[str]]:
    act = ["--policy.type=act", f"--dataset.root={root}"]
    diffusion = [
        "--policy.type=diffusion",
        f"--dataset.root={camera_root}",
        "--policy.pretrained_backbone_weights=null",
    ]
    out = {}
    for name, flags in (("act", act), ("diffusion", diffusion)):
        for precision in ("no", "bf16"):
            for batch in (8, 32):
                out[f"{name} {precision} batch {batch}"] = [
                    *flags,
                    f"--accelerator.mixed_precision={precision}",
                    f"--batch_size={batch}",
                    "--steps=3",
                    "--save_checkpoint=false",
                    "--num_workers=0",
                    "--log_freq=1",
                    "--wandb.enable=false",
                ]
    return out


def measure(argv: list[str]) -> int:
    """max_memory_allocated of a 3-step run of ``argv`` in this process, less what the
    allocator already held when it started (whatever an earlier run left behind)."""
    import torch

    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.train import train

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    train(make_plan(argv, 1))
    return torch.cuda.max_memory_allocated() - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="plan only, on any machine")
    parser.add_argument(
        "--cpu-rehearsal", action="store_true", help="the same runs on the CPU, storages counted"
    )
    args = parser.parse_args()
    import torch

    from lerobot_pipe.datasets import write_synthetic_dataset
    from lerobot_pipe.training.memory_plan import plan_memory

    on_gpu = not (args.dry_run or args.cpu_rehearsal)
    if on_gpu and not torch.cuda.is_available():
        print(
            "no CUDA GPU: run on a GPU machine, or pass --dry-run / --cpu-rehearsal",
            file=sys.stderr,
        )
        return 2
    if args.cpu_rehearsal and torch.cuda.is_available():
        print(
            "--cpu-rehearsal runs on the CPU: hide the GPU (CUDA_VISIBLE_DEVICES=)", file=sys.stderr
        )
        return 2
    gpu = torch.cuda.get_device_properties(0).total_memory if on_gpu else None
    misses = 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root = write_synthetic_dataset(tmp / "ds", num_episodes=10, episode_length=100)
        camera = write_synthetic_dataset(
            tmp / "cam", num_episodes=4, episode_length=50, cameras=["top"], image_size=96
        )
        for i, (name, argv) in enumerate(configurations(root, camera).items()):
            argv = [*argv, f"--output_dir={tmp / f'out{i}'}"]
            plan = plan_memory(argv, 1, 1, gpu, suggest=False)
            planned = plan.estimate.peak.counted
            if args.dry_run:
                print(f"{name:<28} planned {planned / GIB:8.3f} GiB ({plan.estimate.peak_phase})")
                continue
            measured = measure(argv) if on_gpu else peak_of_a_cpu_run(argv)
            ratio = planned / measured
            ok = BAND[0] <= ratio <= BAND[1]
            misses += not ok
            print(
                f"{name:<28} planned {planned / GIB:8.3f} GiB  measured {measured / GIB:8.3f} "
                f"GiB  ratio {ratio:5.3f}  {'PASS' if ok else 'MISS'}"
            )
    if not args.dry_run:
        instrument = "torch.cuda.max_memory_allocated" if on_gpu else "live storages on the CPU"
        print(f"measured: {instrument}")
        print(f"band {BAND[0]}-{BAND[1]}: {'all PASS' if not misses else f'{misses} MISS'}")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
