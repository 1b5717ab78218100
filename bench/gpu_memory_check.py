"""The memory planner against a real GPU run (issue #40): plan minus allowance vs
``torch.cuda.max_memory_allocated``, ratio printed, pass band 0.85-1.15.

    make gpu-check                             # with bench/gpu_smoke.py, in the project's venv
    python bench/gpu_memory_check.py           # on a machine with one CUDA GPU
    python bench/gpu_memory_check.py --dry-run # anywhere: writes the dataset, prints each plan

For each configuration (ACT at LeRobot's default size and Diffusion Policy with a camera, fp32
and bf16, batch 8 and 32) it plans the run with ``lerobot_pipe.training.memory_plan.plan_memory``
(world size 1, the GPU's memory), then trains it for 3 steps in this process on the GPU with
the peak statistics reset, and compares the plan's counted bytes (its total less its allowance,
which stands for what the caching allocator does not hand out: CUDA context, NCCL) with the
largest memory the allocator handed out. Each line: the configuration, planned GiB, measured GiB,
their ratio, PASS/MISS. Exits non-zero on any MISS.

Untested where it was written (no GPU there): the first run on a GPU is its test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

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
    """max_memory_allocated of a 3-step run of ``argv`` in this process."""
    import torch

    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.train import train

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    train(make_plan(argv, 1))
    return torch.cuda.max_memory_allocated()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="plan only, on any machine")
    args = parser.parse_args()
    import torch

    from lerobot_pipe.datasets import write_synthetic_dataset
    from lerobot_pipe.training.memory_plan import plan_memory

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA GPU: run on a GPU machine, or pass --dry-run", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_properties(0).total_memory if not args.dry_run else None
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
            measured = measure(argv)
            ratio = planned / measured
            ok = BAND[0] <= ratio <= BAND[1]
            misses += not ok
            print(
                f"{name:<28} planned {planned / GIB:8.3f} GiB  measured {measured / GIB:8.3f} "
                f"GiB  ratio {ratio:5.3f}  {'PASS' if ok else 'MISS'}"
            )
    if not args.dry_run:
        print(f"band {BAND[0]}-{BAND[1]}: {'all PASS' if not misses else f'{misses} MISS'}")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
