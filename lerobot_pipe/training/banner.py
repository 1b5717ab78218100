"""The lines a run starts with on the main rank: what it trains, on what, how and for how long."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lerobot_pipe.training.heldout import describe as describe_heldout

if TYPE_CHECKING:
    from lerobot_pipe.distributed.parallelize import ShardingPlan
    from lerobot_pipe.distributed.runtime import DistEnv
    from lerobot_pipe.training.preflight import TrainingPlan


def banner(
    plan: TrainingPlan,
    env: DistEnv,
    num_params: tuple[int, int],
    sharding: ShardingPlan | None = None,
    memory: str | None = None,
) -> str:
    cfg, dims = plan.cfg, plan.dims
    upstream = getattr(cfg.policy, "upstream_class", None)  # LeRobot's own policy (lerobot_bridge)
    whose = (
        f"LeRobot's own, {upstream.__module__.rpartition('.')[0]}" if upstream else "lerobot_pipe"
    )
    ga = cfg.accelerator.gradient_accumulation.steps
    eff = cfg.batch_size * dims.dp_world_size * ga
    lines = [
        f"Effective batch size: {cfg.batch_size} x {dims.dp_world_size} dp workers x {ga} grad accum = {eff} "
        f"(topology: dp_replicate={dims.dp_replicate}, dp_shard={dims.dp_shard}, {dims.mode})",
        f"Processes: {env.world_size} ({env.backend or 'no process group'}, device {env.device.type}); "
        f"precision: {cfg.accelerator.mixed_precision}; checkpoint format: {cfg.checkpoint_format}"
        f"{' (async)' if cfg.checkpoint_async else ''}"
        f"{f', keeping the last {cfg.checkpoint_keep_last}' if cfg.checkpoint_keep_last else ''}",
        f"Policy: {cfg.policy.type} ({whose}), {num_params[0]:,} parameters ({num_params[1]:,} trainable); "
        f"dataset: {plan.dataset.root} ({len(plan.dataset)} frames, {plan.dataset.num_episodes} episodes)",
        f"Steps: {cfg.steps} loop steps (micro-batches per worker); save every {cfg.save_freq or 'end'}; "
        f"output: {plan.output_dir}",
    ]
    if sharding is not None:
        line = f"FSDP2 units: {len(sharding.wrap_units)} and the root"
        if sharding.passed_over:
            line += (
                "; passed over (their forward never runs, their children may be units): "
                + ", ".join(sharding.passed_over)
            )
        lines.append(line)
    if memory is not None:
        lines.append(memory)
    if cfg.ema.enable:
        ema = cfg.ema
        schedule = (
            f"constant decay {ema.decay}"
            if ema.decay is not None
            else f"decay schedule inv_gamma={ema.inv_gamma} power={ema.power} "
            f"in [{ema.min_decay}, {ema.max_decay}]"
        )
        lines.append(
            f"EMA of the weights: {schedule}, update_after_step={ema.update_after_step}, "
            f"use_for_eval={ema.use_for_eval}"
        )
    if plan.heldout is not None:
        every = f"every {cfg.eval_steps} steps" if cfg.eval_steps else "never (--eval_steps=0)"
        lines.append(f"{describe_heldout(plan.heldout)}; held-out loss {every}")
    if cfg.env is not None:
        lines.append(
            f"Rollouts: {cfg.eval.n_episodes} episodes of {cfg.env.gym_id} every "
            f"{cfg.env_eval_freq} steps, split across {env.world_size} rank(s), seeds from "
            f"{cfg.seed}{' (EMA weights)' if cfg.ema.enable and cfg.ema.use_for_eval else ''}"
        )
    if plan.resume_from is not None:
        lines.append(f"Resuming from {plan.resume_from} (step {plan.start_step})")
    return "\n".join(lines)
