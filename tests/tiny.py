"""Flags for a tiny, fast ACT and Diffusion Policy, and a helper to run lerobot-train's library
path in-process."""

from __future__ import annotations

import json
from pathlib import Path

from lerobot_pipe.policies.act import ACT_TINY_PRESET

# The package's tiny ACT (ACTConfig.tiny, bench/_common.py's "small") as lerobot-train flags.
TINY_ACT = {"policy.type": "act", **{f"policy.{k}": v for k, v in ACT_TINY_PRESET.items()}}
DETERMINISTIC = {"policy.dropout": 0.0, "policy.use_vae": False}
# An explicit optimizer and LR schedule instead of the policy's preset (LeRobot's rule: with the
# preset on, --optimizer.* and --scheduler.* are replaced by it).
WITH_SCHEDULER = {
    "use_policy_training_preset": "false",
    "optimizer.type": "adamw",
    "optimizer.lr": 1e-3,
    "optimizer.weight_decay": 1e-4,
    "scheduler.type": "cosine_decay_with_warmup",
    "scheduler.num_warmup_steps": 1,
    "scheduler.num_decay_steps": 6,
    "scheduler.peak_lr": 1e-3,
    "scheduler.decay_lr": 1e-4,
}


# A tiny Diffusion Policy (DIFFUSION_TINY_PRESET) with a randomly initialized resnet18.
TINY_DIFFUSION = {
    "policy.type": "diffusion",
    "policy.horizon": 8,
    "policy.n_action_steps": 4,
    "policy.drop_n_last_frames": 3,
    "policy.down_dims": "[16,32]",
    "policy.kernel_size": 3,
    "policy.n_groups": 4,
    "policy.diffusion_step_embed_dim": 16,
    "policy.spatial_softmax_num_keypoints": 8,
    "policy.num_train_timesteps": 10,
    "policy.pretrained_backbone_weights": "null",
}


def tiny_diffusion_flags(**overrides) -> list[str]:
    flags = {
        **TINY_DIFFUSION,
        "policy.optimizer_lr": 1e-3,
        "policy.scheduler_warmup_steps": 1,
        "num_workers": 0,
        "log_freq": 1,
        **overrides,
    }
    return [f"--{k}={v}" for k, v in flags.items() if v is not None]


def tiny_act_flags(**overrides) -> list[str]:
    flags = {**TINY_ACT, "policy.optimizer_lr": 1e-3, "num_workers": 0, "log_freq": 1, **overrides}
    return [f"--{k}={v}" for k, v in flags.items() if v is not None]


def run_train(argv: list[str]):
    """lerobot-train's library path in this process (a rank of run_distributed, or single)."""
    import os

    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.train import train

    plan = make_plan(argv, int(os.environ.get("WORLD_SIZE", "1")), os.environ)
    out = train(plan)
    return str(out) if out else None


def train_one_rank(argv: list[str], inspect=None):
    """One rank of a training run (or the only process): its plan, process group and session;
    ``inspect(session, env)`` before the first step (after a resume's restore), its result
    returned, then the whole run. The process group is destroyed, also on failure."""
    import os

    from lerobot_pipe.distributed.runtime import destroy, init_distributed
    from lerobot_pipe.training.loop import run_loop
    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.session import prepare_session

    plan = make_plan(argv, int(os.environ.get("WORLD_SIZE", "1")), os.environ)
    env = init_distributed()
    try:
        session = prepare_session(plan, env)
        seen = inspect(session, env) if inspect is not None else None
        run_loop(env, session)
    finally:
        destroy()
    return seen


def run_on_topology(topologies: dict, name: str, argv: list[str], rank_fn) -> list:
    """``rank_fn(argv)`` on every rank of ``topologies[name]`` = (world size, per-rank batch,
    flags), in this process for one rank; the per-rank results."""
    from launch import run_distributed

    world, batch, flags = topologies[name]
    argv = [*argv, *flags, f"--batch_size={batch}"]
    if world == 1:
        return [rank_fn(argv)]
    return run_distributed(rank_fn, world, argv)


def full_state(session) -> dict:
    """Collective: the session's full model state and optimizer state (in LeRobot's layout,
    parameters numbered, as optimizer_state.safetensors holds it), as copies on the main rank
    (without a process group the gathers return views of the live tensors); empty elsewhere."""
    from lerobot_pipe.checkpoint.lerobot_state import flatten_tensors, index_optimizer_state

    model = {k: v.clone() for k, v in session.state.model.full_state_dict().items()}
    optim = session.state.optimizer.full_state_dict()
    numbered = index_optimizer_state(optim)[0] if optim else {}
    return {
        "model": model,
        "optim": {k: v.clone() for k, v in flatten_tensors({"state": numbered}).items()},
    }


def train_fsdp2_dcp(dataset_root: str | Path, output_dir: Path) -> Path:
    """A real 2-rank FSDP2 run of the tiny ACT, 2 steps, one DCP checkpoint (step 2)."""
    from launch import run_distributed

    flags = tiny_act_flags(
        **{"dataset.root": dataset_root, "steps": 2, "save_freq": 2, "batch_size": 4}
    )
    run_distributed(
        run_train,
        2,
        [
            *flags,
            "--parallelism.dp_shard=2",
            "--checkpoint_format=dcp",
            f"--output_dir={output_dir}",
        ],
    )
    return output_dir


def losses(output_dir: str | Path) -> dict[int, float]:
    lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return {rec["step"]: rec["loss"] for rec in map(json.loads, lines) if "loss" in rec}


def eval_losses(output_dir: str | Path) -> dict[int, float]:
    """The held-out loss records of metrics.jsonl by step."""
    lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return {rec["step"]: rec["eval_loss"] for rec in map(json.loads, lines) if "eval_loss" in rec}
