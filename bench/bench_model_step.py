"""One training step of the issue-19 models with torch's default optimizer vs lerobot_pipe's.

    .venv-bench/bin/python bench/bench_model_step.py [--rounds 8] [--steps 2]
        [--configs act-state,act-1cam,act-2cam,diffusion-2cam]

LeRobot's trainer builds Adam/AdamW with torch's default implementation, the per-tensor loop on
CPU (~10 elementwise ops over each parameter); lerobot_pipe's ``make_optimizer``
(``training/optim.py``) asks for torch's fused kernel (one pass). This measures what that choice
alone is worth in a step: ``loop`` vs ``fused``, the same policy, batches and update formula.

Each configuration builds its policy once (the sizes and flags of ``bench_vs_lerobot.py``: batch 8,
96x96 AV1 cameras, ACT dim_model 256 / 4 encoder layers / chunk 20, Diffusion down_dims
128/256/512, ResNet-18 from random weights) and times forward + backward + grad clip 10 +
optimizer step + zero_grad on pre-loaded batches, the variants alternating ``--rounds`` times,
``--steps`` timed steps each after one untimed; medians of the wall time and of the training
thread's CPU time (``time.thread_time``: one intra-op thread, so the step's work; it varies far
less than wall time on a machine shared with other jobs), and the ratios fused / loop.
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
from lerobot_pipe.training.optim import make_optimizer

ACT = {"dim_model": 256, "n_encoder_layers": 4, "chunk_size": 20, "n_action_steps": 20}
DIFFUSION = {"down_dims": (128, 256, 512)}
CONFIGS = {
    "act-state": ("act", ()),
    "act-1cam": ("act", ("top",)),
    "act-2cam": ("act", ("top", "wrist")),
    "diffusion-2cam": ("diffusion", ("top", "wrist")),
}
VARIANTS = ("loop", "fused")
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


def measure(name: str, tmp: Path, rounds: int, steps: int) -> dict[str, tuple[float, float]]:
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
    assert optimizers[True].param_groups[0]["fused"]
    assert not optimizers[False].param_groups[0]["fused"]
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    batch_cycle = itertools.cycle(batches)
    order = list(VARIANTS)
    for r in range(rounds):
        for variant in order[r % 2 :] + order[: r % 2]:
            optimizer = optimizers[variant == "fused"]
            for i in range(steps + 1):
                t0, c0 = time.perf_counter(), time.thread_time()
                loss, _ = policy(next(batch_cycle))
                loss.backward()
                nn.utils.clip_grad_norm_(params, 10.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if i:  # the first step after a switch warms the other optimizer's state
                    times[variant].append(time.perf_counter() - t0)
                    cpu[variant].append(time.thread_time() - c0)
    return {v: (c.median(times[v]), c.median(cpu[v])) for v in VARIANTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    tmp = c.bench_tmp("model-step")
    print(f"torch {torch.__version__}, one intra-op thread, batch {BATCH}; {c.machine_load()}")
    print("ms per step: wall; CPU of the training thread; and fused / loop")
    print("| configuration | loop: wall; CPU | fused: wall; CPU | fused / loop: wall; CPU | load |")
    for name in args.configs.split(","):
        medians = measure(name, tmp, args.rounds, args.steps)
        (lw, lc), (fw, fc) = medians["loop"], medians["fused"]
        print(
            f"| {name} | {1e3 * lw:.0f}; {1e3 * lc:.0f} | {1e3 * fw:.0f}; {1e3 * fc:.0f} "
            f"| {fw / lw:.2f}; {fc / lc:.2f} | {c.machine_load()} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
