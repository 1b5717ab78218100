"""One training step of the issue-19 models with torch's defaults vs with lerobot_pipe's kernels.

    .venv/bin/python bench/bench_model_step.py [--configs act-1cam,act-2cam,act-state,diffusion-2cam]
        [--rounds 6] [--steps 3]

The two choices of lerobot_pipe that change the cost of a step, not what it computes (LeRobot's
trainer makes torch's default choice for both):
- ``fused``: Adam/AdamW with torch's fused kernel (``training/optim.py::make_optimizer``) instead
  of the per-tensor loop, torch's default on CPU;
- ``dropout``: ACT's dropout masks from ``uniform_`` + a comparison (``policies/dropout.py``)
  instead of ``F.dropout``'s ``bernoulli_`` (Diffusion has no dropout).

Each configuration builds its policy once (the sizes and flags of ``bench_vs_lerobot.py``: batch 8,
96x96 AV1 cameras, ACT dim_model 256 / 4 encoder layers / chunk 20, Diffusion down_dims
128/256/512, ResNet-18 from random weights) and times forward + backward + grad clip 10 +
optimizer step + zero_grad on pre-loaded batches. The four variants (``torch``: both torch
defaults, ``fused``, ``dropout``, ``ours``: both) rotate ``--rounds`` times, ``--steps`` timed
steps each after one untimed; medians, and each variant's ratio to ``torch`` (one intra-op
thread).
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import _common as c  # must come first: pins threads, sets sys.path

# isort: split
import torch
from torch import nn

from lerobot_pipe.datasets import write_synthetic_dataset
from lerobot_pipe.policies import dropout as ours_dropout
from lerobot_pipe.training.optim import make_optimizer

ACT = {"dim_model": 256, "n_encoder_layers": 4, "chunk_size": 20, "n_action_steps": 20}
DIFFUSION = {"down_dims": (128, 256, 512)}
CONFIGS = {
    "act-state": ("act", ()),
    "act-1cam": ("act", ("top",)),
    "act-2cam": ("act", ("top", "wrist")),
    "diffusion-2cam": ("diffusion", ("top", "wrist")),
}
VARIANTS = {"torch": (False, False), "fused": (True, False), "dropout": (False, True),
            "ours": (True, True)}  # fmt: skip
BATCH = 8


def build(name: str, tmp: Path):
    policy_type, cameras = CONFIGS[name]
    root = tmp / f"data-{len(cameras)}cam"
    if not (root / "meta").exists():
        write_synthetic_dataset(
            root, num_episodes=10, episode_length=100, cameras=cameras, image_size=96
        )
    if policy_type == "act":
        # state-only ACT reads the environment state (the synthetic dataset has one)
        return c.act_policy_and_data(ACT, root, BATCH, seed=1000)
    return c.diffusion_policy_and_data(root, BATCH, seed=1000, **DIFFUSION)


def measure(name: str, tmp: Path, rounds: int, steps: int) -> dict[str, float]:
    policy, ds, sampler, pre = build(name, tmp)
    batches = [pre(ds.get_batch(sampler.next_indices())) for _ in range(4)]
    params = [p for p in policy.parameters() if p.requires_grad]
    preset = policy.config.get_optimizer_preset()
    optimizers = {
        True: make_optimizer(policy.get_optim_params(), preset),
        False: torch.optim.AdamW(
            policy.get_optim_params(),
            lr=preset.lr,
            betas=tuple(preset.betas),
            eps=preset.eps,
            weight_decay=preset.weight_decay,
        ),
    }
    assert (
        optimizers[True].param_groups[0]["fused"] and not optimizers[False].param_groups[0]["fused"]
    )
    cheap_forward = ours_dropout.Dropout.forward
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    batch_cycle = itertools.cycle(batches)
    order = list(VARIANTS)
    for r in range(rounds):
        for variant in order[r % 4 :] + order[: r % 4]:
            fused, cheap_dropout = VARIANTS[variant]
            ours_dropout.Dropout.forward = cheap_forward if cheap_dropout else nn.Dropout.forward
            optimizer = optimizers[fused]
            for i in range(steps + 1):
                t0 = time.perf_counter()
                loss, _ = policy(next(batch_cycle))
                loss.backward()
                nn.utils.clip_grad_norm_(params, 10.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if i:  # the first step after a switch warms the other optimizer's state
                    times[variant].append(time.perf_counter() - t0)
    ours_dropout.Dropout.forward = cheap_forward
    return {v: c.median(ts) for v, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    tmp = c.bench_tmp("model-step")
    print(f"torch {torch.__version__}, one intra-op thread, batch {BATCH}; {c.machine_load()}")
    header = " | ".join(f"{v} ms (ratio)" for v in VARIANTS)
    print(f"| configuration | {header} |")
    for name in args.configs.split(","):
        medians = measure(name, tmp, args.rounds, args.steps)
        base = medians["torch"]
        cells = " | ".join(f"{1e3 * m:.0f} ({m / base:.2f})" for m in medians.values())
        print(f"| {name} | {cells} |  {c.machine_load()}", flush=True)


if __name__ == "__main__":
    main()
