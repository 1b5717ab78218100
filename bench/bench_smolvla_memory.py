"""Per-rank memory of SmolVLA at its real size (450 M parameters: SmolVLM2-500M's geometry written
as a local config, random fp32 weights, no download) built and sharded as lerobot-train does it.

    .venv/bin/python bench/bench_smolvla_memory.py [--cases single,fsdp2,fsdp4,...] [--batch 1]

Cases (run one at a time, each on forked ranks with real gloo process groups, tests/launch.py):
``single`` (one process), ``fsdp2`` / ``fsdp4`` (FSDP2 over 2 / 4 processes), ``lora-single`` /
``lora-fsdp2`` (LoRA with LeRobot's default SmolVLA targets, r=16, on a saved base: the frozen
base sharded with the adapters), ``vlm-weights-fsdp2`` (``load_vlm_weights=true``: the VLM's own
weights, random bf16 saved at this geometry, read as each rank's rows), ``ac-single`` / ``ac-fsdp2`` (``--accelerator.activation_
checkpointing.mode=full``). Each rank runs the trainer's own ``prepare_session`` (policy build,
the probe of the wrap units, sharding, the optimizer: AdamW with SmolVLA's preset), then one
training step on a real batch of the synthetic camera dataset (one 64x64 camera resized with
padding to 512x512, the task string, the state), and reports:

  * the bytes of its local shards of parameters, gradients and optimizer state;
  * its peak RSS from its start to the first step (VmHWM, reset when the rank starts) above its
    RSS at the start, and its RSS growth after the step (both after gc + malloc_trim);
  * the bytes autograd kept for the backward in that step (saved tensors outside checkpointed
    units: the activation memory that activation checkpointing trades for recomputation).

``fsdp2-eager`` / ``fsdp4-eager`` / ``lora-fsdp2-eager`` / ``vlm-weights-fsdp2-eager``: the same with the whole policy built
on every rank before sharding (``LEROBOT_PIPE_META_BUILD=0``); the others shard on the meta
device first and materialize only each rank's shards (distributed/meta_init.py).

Targets: state per rank <= 1.1/N of one process (plain and LoRA); peak host memory per rank
while building below the whole model's parameter bytes (no rank holds a full copy).
"""

from __future__ import annotations

import _common as c  # must come first: pins threads, sets sys.path

# isort: split

import argparse
import json
import os

import torch
from launch import run_distributed

MB = 1024 * 1024
# name -> (world size, extra lerobot-train flags); LoRA cases also get --policy.path=<base>.
# "-eager" cases build the whole policy on every rank (LEROBOT_PIPE_META_BUILD=0), as before the
# meta-device build: the comparison for the peak host memory.
VLM_WEIGHTS = ["--policy.load_vlm_weights=true", "--accelerator.mixed_precision=bf16"]
CASES = {
    "single": (1, []),
    "fsdp2": (2, ["--parallelism.dp_shard=2"]),
    "fsdp4": (4, ["--parallelism.dp_shard=4"]),
    "fsdp2-eager": (2, ["--parallelism.dp_shard=2"]),
    "fsdp4-eager": (4, ["--parallelism.dp_shard=4"]),
    "lora-fsdp2-eager": (2, ["--peft.r=16", "--parallelism.dp_shard=2"]),
    "lora-single": (1, ["--peft.r=16"]),
    "lora-fsdp2": (2, ["--peft.r=16", "--parallelism.dp_shard=2"]),
    # Pretraining from the VLM's own weights (load_vlm_weights=true: its bf16 file, 1 GB at this
    # geometry; bf16 mixed precision keeps the trainable expert and heads in fp32).
    "vlm-weights-fsdp2": (2, [*VLM_WEIGHTS, "--parallelism.dp_shard=2"]),
    "vlm-weights-fsdp2-eager": (2, [*VLM_WEIGHTS, "--parallelism.dp_shard=2"]),
    "ac-single": (1, ["--accelerator.activation_checkpointing.mode=full"]),
    "ac-fsdp2": (
        2,
        ["--accelerator.activation_checkpointing.mode=full", "--parallelism.dp_shard=2"],
    ),
}


def _peak_reset() -> None:
    """Reset this process's VmHWM to its current RSS (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(tensors) -> int:
    return sum(_local(t).nbytes for t in tensors if isinstance(t, torch.Tensor))


def rank_main(argv: list[str]) -> dict:
    c.malloc_trim()
    _peak_reset()
    start = c.rss_parts()["VmRSS"]
    from lerobot_pipe.datasets import BatchPrefetcher, GlobalBatchSampler
    from lerobot_pipe.distributed.runtime import destroy, init_distributed
    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.session import prepare_session

    world = int(os.environ.get("WORLD_SIZE", "1"))
    plan = make_plan(argv, world, os.environ)
    env = init_distributed()
    try:
        session = prepare_session(plan, env)
        built_peak = _hwm() - start
        cfg = plan.cfg
        sampler = GlobalBatchSampler(
            len(plan.dataset),
            cfg.batch_size,
            dp_rank=env.rank,
            dp_world_size=plan.dims.dp_world_size,
            seed=cfg.seed,
        )
        with BatchPrefetcher(plan.dataset, sampler, 0, device=env.device) as loader:
            batch = session.pre(loader.next())
        kept = [0]

        def pack(tensor):
            kept[0] += tensor.nbytes
            return tensor

        with c.Timer() as t:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                loss, _ = session.model(batch)
            loss.backward()
            step_peak = _hwm() - start
            session.optimizer.step()
        params = list(session.trainee.parameters())
        result = {
            "rank": env.rank,
            "global_params": sum(p.numel() for p in params),
            "trainable_params": sum(p.numel() for p in params if p.requires_grad),
            "params_b": _nbytes(params),
            "grads_b": _nbytes(p.grad for p in params if p.grad is not None),
            "optim_b": _nbytes(v for s in session.optimizer.state.values() for v in s.values()),
            "built_peak_b": built_peak,
            "step_peak_b": step_peak,
            "kept_b": kept[0],
            "step_s": t.s,
            "loss": float(loss.detach()),
            "meta": session.built_on_meta,
            "full_params_b": sum(p.numel() * p.element_size() for p in params),
        }
        result["state_b"] = result["params_b"] + result["grads_b"] + result["optim_b"]
        del loss
        result["after_step_b"] = c.rss_parts()["VmRSS"] - start
        return result
    finally:
        destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cases", default="single,fsdp2,fsdp4,lora-single,lora-fsdp2,ac-single,ac-fsdp2"
    )
    ap.add_argument("--batch", type=int, default=1, help="per-rank batch")
    ap.add_argument("--timeout", type=float, default=1500, help="seconds per case")
    args = ap.parse_args()
    cases = args.cases.split(",")
    tmp = c.bench_tmp("smolvla_memory")
    from lerobot_pipe.datasets import write_synthetic_dataset
    from lerobot_pipe.policies.smolvla import SmolVLAConfig, SmolVLAPolicy

    vlm = c.write_smolvlm(tmp / "smolvlm2_500m_geometry", "smolvlm2-500m")
    root = write_synthetic_dataset(
        tmp / "ds", num_episodes=2, episode_length=20, cameras=["top"], image_size=64,
        pixels_only=True,
    )  # fmt: skip
    common = [
        f"--dataset.root={root}",
        f"--batch_size={args.batch}",
        "--steps=1",
        "--num_workers=0",
        "--save_checkpoint=false",
    ]
    fresh = ["--policy.type=smolvla", f"--policy.vlm_model_name={vlm}"]
    vlm_weights = None
    if any(case.startswith("vlm-weights") for case in cases):
        vlm_weights = c.write_smolvlm(tmp / "smolvlm2_500m_weights", "smolvlm2-500m", True)
        c.malloc_trim()
    base = None
    if any(case.startswith("lora") for case in cases):
        from lerobot_pipe.datasets import LeRobotDataset
        from lerobot_pipe.policies.factory import fill_features

        base = tmp / "base"
        cfg = SmolVLAConfig(vlm_model_name=str(vlm))
        fill_features(cfg, LeRobotDataset(root).features)
        torch.manual_seed(0)
        SmolVLAPolicy(cfg).save_pretrained(base)
        c.malloc_trim()
    print(f"SmolVLA at SmolVLM2-500M's geometry, per-rank batch {args.batch}; {c.machine_load()}")
    results = {}
    for case in cases:
        world, flags = CASES[case]
        model = [f"--policy.path={base}"] if case.startswith("lora") else fresh
        if case.startswith("vlm-weights"):
            model = ["--policy.type=smolvla", f"--policy.vlm_model_name={vlm_weights}"]
        argv = [*common, *model, *flags, f"--output_dir={tmp / case}"]
        env = {"LEROBOT_PIPE_META_BUILD": "0"} if case.endswith("-eager") else {}
        with c.Timer() as t:
            ranks = run_distributed(rank_main, world, argv, env=env, timeout=args.timeout)
        results[case] = ranks
        worst = max(ranks, key=lambda r: r["state_b"])
        print(
            f"{case}: {t.s:.0f} s; parameters {worst['global_params']:,} (trainable "
            f"{worst['trainable_params']:,}); per rank (MiB, largest): params "
            f"{worst['params_b'] / MB:.0f}, grads {worst['grads_b'] / MB:.0f}, optim "
            f"{worst['optim_b'] / MB:.0f}, state {worst['state_b'] / MB:.0f}; peak RSS growth "
            f"built {max(r['built_peak_b'] for r in ranks) / MB:.0f}, to first step "
            f"{max(r['step_peak_b'] for r in ranks) / MB:.0f}; saved for backward "
            f"{max(r['kept_b'] for r in ranks) / MB:.0f}; step {worst['step_s']:.1f} s"
            f"{'; built on the meta device' if worst['meta'] else ''}",
            flush=True,
        )
    print("\nstate per rank vs one process (target <= 1.1/N):")
    for case, ranks in results.items():
        world = CASES[case][0]
        ref_name = "lora-single" if case.startswith("lora") else "single"
        if world == 1 or ref_name not in results or case.startswith("vlm-weights"):
            continue  # (vlm-weights: a bf16 VLM, no one-process run of it to compare with)
        ref = max(r["state_b"] for r in results[ref_name])
        ratio = max(r["state_b"] for r in ranks) / ref
        print(f"  {case}: {ratio:.3f} (target {1.1 / world:.3f}) {c.verdict(ratio <= 1.1 / world)}")
    print(
        "\npeak host memory per rank while building (start -> prepare_session done) vs the whole "
        "model's parameter bytes (target < 1: no rank holds a full copy):"
    )
    for case, ranks in results.items():
        if CASES[case][0] == 1:
            continue
        full = ranks[0]["full_params_b"]
        ratio = max(r["built_peak_b"] for r in ranks) / full
        how = "meta-device build" if ranks[0]["meta"] else "eager build"
        print(f"  {case} ({how}): {ratio:.2f} {c.verdict(ratio < 1)}")
    (tmp / "results.json").write_text(json.dumps(results, indent=1))
    print(f"(raw figures: {tmp / 'results.json'})")


if __name__ == "__main__":
    main()
