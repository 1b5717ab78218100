"""The memory planner's table for docs/memory-planner.md: pi0.5 and SmolVLA at their real size
(full fine-tune, LoRA, ``train_expert_only``) on 24, 48 and 80 GB GPUs x 1, 2, 4, 8 processes,
and a check of the planner against docs/benchmarks.md §3d's measured pi0.5 figures.

    .venv/bin/python bench/plan_memory_table.py            # ~5-10 min on 2 cores, no GPU
    .venv/bin/python bench/plan_memory_table.py --check    # the §3d comparison only

Every figure is ``lerobot_pipe.training.memory_plan.plan_memory`` of lerobot-train's flags: the
policy built on the meta device (nothing downloaded: pi0.5 with the tests' tiny PaliGemma
tokenizer in a temporary Hub cache, SmolVLA over a local SmolVLM2-500M geometry,
bench/_common.py), on a synthetic dataset with one camera. The table's runs: bf16 mixed
precision (float32 master weights), the policy's AdamW preset, batch 8 per GPU, FSDP2 over N
(N = 1: one process), no activation checkpointing. Prints Markdown.
"""

from __future__ import annotations

import _common as c  # must come first: pins threads, sets sys.path

# isort: split

import argparse
import tempfile
from pathlib import Path

GPUS_GB = (24, 48, 80)
WORLDS = (1, 2, 4, 8)
# docs/benchmarks.md §3d, pi0.5 fp32 batch 1 (MiB per rank): state, and a step's peak measured
# with FSDPMemTracker under fake tensors (N = 1: the first step's peak plus the AdamW state).
MEASURED_PI05 = {1: (52983, 52986), 2: (26491, 27741), 4: (13246, 14850), 8: (6623, 9512)}
MIB = 2**20
GIB = 2**30


def _flags(d: dict) -> list[str]:
    return [f"--{k}={v}" for k, v in d.items()]


def setups(tmp: Path) -> dict[str, tuple[list[str], dict[str, dict]]]:
    """Per policy: its base flags and its modes' extra flags."""
    from lerobot_pipe.datasets import write_synthetic_dataset

    root = write_synthetic_dataset(
        tmp / "ds", num_episodes=2, episode_length=10, cameras=["top"], image_size=64,
        pixels_only=True, num_tasks=2,
    )  # fmt: skip
    vlm = c.write_smolvlm(tmp / "smolvlm2-500m", "smolvlm2-500m")
    pi05 = {"policy.type": "pi05", "dataset.root": root}
    smolvla = {"policy.type": "smolvla", "policy.vlm_model_name": vlm, "dataset.root": root}
    bases = {}
    for name, flags in (("pi05", pi05), ("smolvla", smolvla)):
        base = tmp / f"{name}_base"
        _policy_config(_flags(flags), base)
        bases[name] = base
    return {
        "pi0.5": (
            _flags(pi05),
            {
                "full": {},
                "LoRA": {"policy.path": bases["pi05"], "peft.method_type": "LORA"},
                "train_expert_only": {"policy.train_expert_only": "true"},
            },
        ),
        "SmolVLA": (
            _flags(smolvla),
            {
                "full": {
                    "policy.train_expert_only": "false",
                    "policy.freeze_vision_encoder": "false",
                },
                "LoRA": {"policy.path": bases["smolvla"], "peft.method_type": "LORA"},
                "train_expert_only": {"policy.train_expert_only": "true"},
            },
        ),
    }


def _policy_config(argv: list[str], folder: Path) -> None:
    """A --policy.path folder holding only the policy's config.json (the planner reads no
    weights)."""
    from lerobot_pipe.configs.loading import parse_train_config
    from lerobot_pipe.policies import factory  # noqa: F401 - registers the policy types

    cfg, _ = parse_train_config(argv)
    folder.mkdir(parents=True, exist_ok=True)
    cfg.policy.save_pretrained(folder)


def plan(argv: list[str], world: int, tmp: Path, **changes):
    from lerobot_pipe.training.memory_plan import plan_memory, with_flags

    flags = {"output_dir": tmp / "out", "batch_size": 8, **changes}
    if world > 1:
        flags |= {"parallelism.dp_shard": world}
    return plan_memory(with_flags(argv, flags), world, world, suggest=False)


def table(tmp: Path) -> list[str]:
    lines = [
        "| policy | training | N | parameters (trainable) | peak GiB per GPU (phase) | "
        + " | ".join(f"{g} GB" for g in GPUS_GB)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(GPUS_GB),
    ]
    for policy, (argv, modes) in setups(tmp).items():
        for mode, extra in modes.items():
            for world in WORLDS:
                p = plan(argv, world, tmp, **{"accelerator.mixed_precision": "bf16", **extra})
                total = p.total_bytes
                cells = " | ".join("fits" if total <= g * 10**9 else "—" for g in GPUS_GB)
                lines.append(
                    f"| {policy} | {mode} | {world} | {p.parameters / 1e9:.2f} B "
                    f"({p.trainable_parameters / 1e9:.3f} B) | {total / GIB:.1f} "
                    f"({p.estimate.peak_phase}) | {cells} |"
                )
                print(lines[-1], flush=True)
    return lines


def check(tmp: Path) -> list[str]:
    """pi0.5 fp32, batch 1, full fine-tune: the plan against §3d's measurements."""
    argv, _ = setups(tmp)["pi0.5"]
    lines = [
        "| N | state MiB: plan / measured | a step's peak MiB: plan less allowance / measured | "
        "ratio |",
        "|---|---|---|---|",
    ]
    for world, (state, peak) in MEASURED_PI05.items():
        p = plan(argv, world, tmp, batch_size=1)
        s = p.estimate.state
        planned_state = s.parameters_local + s.gradients + s.optimizer
        counted = p.estimate.peak.counted
        lines.append(
            f"| {world} | {planned_state / MIB:.0f} / {state} | {counted / MIB:.0f} / {peak} | "
            f"{counted / MIB / peak:.3f} |"
        )
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only the §3d comparison")
    args = parser.parse_args()
    from pi_tiny import paligemma_tokenizer_cache

    with tempfile.TemporaryDirectory() as tmp, paligemma_tokenizer_cache(Path(tmp) / "hf"):
        tmp = Path(tmp)
        out = check(tmp)
        if not args.check:
            out += ["", *table(tmp)]
    print("\n".join(out))


if __name__ == "__main__":
    main()
