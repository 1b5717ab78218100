"""The training loop: one function, its branches visible (DDP / FSDP2 / HSDP, accumulation,
mixed precision, checkpointing, resume), and the step it runs.

Counting: ``step`` counts loop steps, i.e. micro-batches per worker. One loop step consumes one
global batch of ``batch_size x dp_world_size`` samples; the optimizer updates every
``gradient_accumulation.steps`` loop steps; the LR scheduler steps every loop step (as LeRobot).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lerobot_pipe import constants as C
from lerobot_pipe.datasets import BatchPrefetcher
from lerobot_pipe.datasets.prefetch import to_device
from lerobot_pipe.distributed.parallelize import autocast_dtype, average_gradients, clip_grad_norm
from lerobot_pipe.distributed.runtime import DistEnv, run_on_main
from lerobot_pipe.evaluation.in_training import InTrainingEval, eval_batch_size
from lerobot_pipe.evaluation.in_training import describe as describe_rollouts
from lerobot_pipe.evaluation.in_training import summary as env_eval_summary
from lerobot_pipe.policies.pretrained import PreTrainedPolicy
from lerobot_pipe.training.data import make_sampler
from lerobot_pipe.training.ema import evaluation_weights
from lerobot_pipe.training.heldout import heldout_loss
from lerobot_pipe.training.preflight import TrainingPlan
from lerobot_pipe.training.progress import EventChannel, ProgressReporter
from lerobot_pipe.training.session import Session
from lerobot_pipe.training.step_time import StepTimer
from lerobot_pipe.training.trackers import MetricsLog, TrackerError
from lerobot_pipe.utils import faults

log = logging.getLogger("lerobot_pipe.train")

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class StepParts:
    """What every training step uses, gathered once from the session."""

    model: nn.Module  # the policy wrapped for the topology
    optimizer: torch.optim.Optimizer
    scaler: Any  # torch.amp.GradScaler (a no-op one unless fp16)
    scheduler: Any  # stepped every loop step; None: a constant lr
    ema: Any  # training/ema.py's EMAState, or None
    trainable: list[nn.Parameter]  # what the gradient clipping measures
    ignored: list[nn.Parameter]  # FSDP2-ignored parameters: their gradients averaged here
    accumulation: int  # loop steps per optimizer update
    grad_clip_norm: float  # 0: no clipping
    sharded: bool  # FSDP2: gradient sync toggled on the model
    samples_per_step: int  # the global batch: batch_size x dp_world_size
    autocast: contextlib.AbstractContextManager  # mixed precision, or a null context

    @classmethod
    def of(cls, session: Session, env: DistEnv) -> StepParts:
        cfg, dims, state = session.plan.cfg, session.plan.dims, session.state
        amp_dtype = autocast_dtype(cfg.accelerator, dims)
        return cls(
            model=session.model,
            optimizer=session.optimizer,
            scaler=state.scaler,
            scheduler=state.scheduler,
            ema=state.ema,
            trainable=[p for p in session.model.parameters() if p.requires_grad],
            ignored=session.ignored,
            accumulation=cfg.accelerator.gradient_accumulation.steps,
            grad_clip_norm=cfg.optimizer.grad_clip_norm,
            sharded=dims.is_sharded,
            samples_per_step=cfg.batch_size * dims.dp_world_size,
            autocast=torch.autocast(env.device.type, dtype=amp_dtype)
            if amp_dtype is not None
            else contextlib.nullcontext(),
        )


def train_step(
    parts: StepParts, batch: Batch, loss_kwargs: dict, *, sync: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One micro-batch: forward and backward, its gradients kept local unless ``sync`` (the
    last micro-batch of an optimizer update), which then averages them and steps the optimizer
    and the EMA. The scheduler steps every micro-batch. Returns the loss and, when the update
    clipped, the gradient norm."""
    model, optimizer, scaler = parts.model, parts.optimizer, parts.scaler
    if parts.sharded:
        model.set_requires_gradient_sync(sync)
    is_ddp = isinstance(model, DistributedDataParallel)
    no_sync = model.no_sync() if (is_ddp and not sync) else contextlib.nullcontext()
    with no_sync:
        with parts.autocast:
            loss, _ = model(batch, **loss_kwargs)
        scaler.scale(loss / parts.accumulation).backward()
    faults.fault_point("train:after_backward")
    grad_norm = None
    if sync:
        average_gradients(parts.ignored)
        scaler.unscale_(optimizer)
        if parts.grad_clip_norm > 0:
            grad_norm = clip_grad_norm(parts.trainable, parts.grad_clip_norm)
        scaler.step(optimizer)
        faults.fault_point("train:after_optimizer_step")
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if parts.ema is not None:  # once per optimizer update (a skipped fp16 one too)
            parts.ema.update()
    if parts.scheduler is not None:
        parts.scheduler.step()
    return loss, grad_norm


def run_loop(env: DistEnv, session: Session, channel: EventChannel | None = None) -> Path | None:
    """Train the session's plan to its last step; the newest checkpoint this run wrote (or, when
    nothing was left to train, the one it resumed from). Progress events go to ``channel``."""
    plan, state, checkpoints = session.plan, session.state, session.checkpoints
    cfg, dims, start_step = plan.cfg, plan.dims, state.progress.step
    end = last_step_of_launch(cfg)
    if start_step >= end:
        return _nothing_to_train(session, env, end)
    parts = StepParts.of(session, env)
    sampler = make_sampler(
        plan, cfg.batch_size, env.rank, dims.dp_world_size, state.progress.samples_consumed
    )
    if state.stream is not None:
        sampler = state.stream.attach(sampler)
    prefetcher = BatchPrefetcher(plan.dataset, sampler, cfg.num_workers, device=env.device)
    timer = StepTimer(env.device)
    progress = ProgressReporter(env.is_main, start_step, cfg.steps, parts.samples_per_step, channel)
    running = torch.zeros(2, dtype=torch.float64, device=env.device)  # loss sum, count
    grad_norm = torch.zeros((), device=env.device)
    window: list[Batch] = []  # the micro-batches of one optimizer update
    metrics = rollouts = None
    try:
        metrics, rollouts = open_metrics(plan, env), open_rollouts(plan, env)
        for step in range(start_step + 1, end + 1):
            faults.set_step(step)
            log_step = step % cfg.log_freq == 0 or step == end
            timer.start()
            if not window:
                window = [prefetcher.next() for _ in range(parts.accumulation)]
                timer.lap("dataloading_s")
                loss_kwargs = _loss_normalizers(session.policy, window, env.device)
                timer.lap("update_s")
            batch = session.pre(to_device(window.pop(0), env.device, non_blocking=True))
            timer.lap("preprocessing_s")
            sync = step % parts.accumulation == 0
            loss, clipped_norm = train_step(parts, batch, loss_kwargs, sync=sync)
            grad_norm = clipped_norm if clipped_norm is not None else grad_norm
            running[0] += loss.detach().float()
            running[1] += 1
            timer.stop(sync=log_step)
            if log_step:
                record = log_record(step, running, grad_norm, timer.reduce(), parts, sampler)
                _report(record, metrics, progress, env, cfg.steps)
                running.zero_()
            if cfg.eval_steps and step % cfg.eval_steps == 0:  # LeRobot's rule (not at the end)
                _evaluate_heldout(step, session, parts, env, metrics, progress)
            state.progress.step = step
            state.progress.samples_consumed = sampler.samples_consumed
            saved = _save(step, session, metrics, last_step=step == end)
            if rollouts is not None and step % cfg.env_eval_freq == 0:  # LeRobot's rule
                _roll_out(step, session, parts, rollouts, metrics)
            progress.update(step, running, saved)
        last_saved = checkpoints.close()  # training ends once the last save is durable
        metrics.checkpoint(last_saved)
    finally:
        checkpoints.shutdown()  # after an error: still lets the save in flight finish
        prefetcher.close()
        if rollouts is not None:
            rollouts.close()
        progress.close()
        if metrics is not None:
            metrics.close()
    if last_saved is not None and cfg.policy.push_to_hub and end == cfg.steps:
        _push_final(plan, last_saved)
    return last_saved


def last_step_of_launch(cfg) -> int:
    """The loop step this launch ends at (with a checkpoint): --stop_after_step when set and
    below --steps, else --steps. The schedule follows --steps either way."""
    if 0 < cfg.stop_after_step < cfg.steps:
        return cfg.stop_after_step
    return cfg.steps


def _nothing_to_train(session: Session, env: DistEnv, end: int) -> Path | None:
    session.checkpoints.shutdown()
    if env.is_main:
        flag = "--steps" if end == session.plan.cfg.steps else "--stop_after_step"
        log.info(
            "Checkpoint step %d already reaches %s=%d: nothing to train",
            session.state.progress.step,
            flag,
            end,
        )
    return session.plan.resume_from


def _loss_normalizers(policy: PreTrainedPolicy, window: list[Batch], device: torch.device) -> dict:
    """The ``normalizers`` keyword of the policy's forward for one optimizer update: each
    ratio-of-sums loss term's denominator counted over every micro-batch of every rank, and the
    number of (micro-batch, rank) shares it splits into. Dividing by total / shares instead of
    by the local count makes the data-parallel, accumulated gradient the whole batch's. Integers
    only, so that FSDP's mixed-precision input cast leaves them alone."""
    counts = [policy.loss_normalizers(batch) for batch in window]
    if not counts[0]:
        return {}
    names = sorted(counts[0])
    totals = torch.stack([sum(c[n] for c in counts) for n in names]).to(device, torch.int64)
    shares = len(window)
    if dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        shares *= dist.get_world_size()
    return {"normalizers": {n: (totals[i], shares) for i, n in enumerate(names)}}


def _reduce_mean(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        values /= dist.get_world_size()
    return values


def log_record(
    step: int,
    running: torch.Tensor,
    grad_norm: torch.Tensor,
    times: dict[str, float],
    parts: StepParts,
    sampler: Any,
) -> dict[str, Any]:
    """metrics.jsonl's training record of ``step``: the loss averaged over the steps since the
    last record and over the ranks, throughput and the timings (each the max over ranks).
    Collective."""
    stats = _reduce_mean(running.clone())
    samples_per_step = parts.samples_per_step
    record = {
        "step": step,
        "loss": stats[0].item() / max(stats[1].item(), 1),
        "grad_norm": float(grad_norm),
        "lr": parts.optimizer.param_groups[0]["lr"],
        "samples_per_s": samples_per_step / times["step_s"] if times["step_s"] > 0 else 0.0,
        **times,
        "samples": sampler.samples_consumed,
        "epoch": sampler.epochs_consumed,
    }
    if parts.ema is not None:  # LeRobot main's names (W&B: train/ema/...)
        record["ema/decay"] = parts.ema.decay
        record["ema/step"] = parts.ema.optimization_step
    return record


def _report(
    record: dict[str, Any],
    metrics: MetricsLog,
    progress: ProgressReporter,
    env: DistEnv,
    total_steps: int,
) -> None:
    metrics.log(record)
    step_s = record["step_s"]
    progress.set_loss(record["loss"], record["dataloading_s"] / step_s if step_s > 0 else None)
    if env.is_main:
        log.info(
            "step %d/%d loss %.5f grad_norm %.3f lr %.2e %.1f samples/s "
            "data_s %.3f prep_s %.3f updt_s %.3f step_s %.3f",
            record["step"],
            total_steps,
            record["loss"],
            record["grad_norm"],
            record["lr"],
            record["samples_per_s"],
            record["dataloading_s"],
            record["preprocessing_s"],
            record["update_s"],
            step_s,
        )


def _evaluate_heldout(
    step: int,
    session: Session,
    parts: StepParts,
    env: DistEnv,
    metrics: MetricsLog,
    progress: ProgressReporter,
) -> None:
    plan = session.plan
    cfg = plan.cfg
    eval_loss = heldout_loss(
        parts.model,
        session.pre,
        plan.dataset,
        plan.heldout,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        rank=env.rank,
        world_size=plan.dims.dp_world_size,
        device=env.device,
        autocast=parts.autocast,
    )
    metrics.log(
        {"step": step, "eval_loss": eval_loss, "eval_samples": plan.heldout.num_samples},
        mode="eval",
    )
    progress.set_eval_loss(eval_loss)
    if env.is_main:
        log.info("step %d: eval_loss=%.5f", step, eval_loss)


def _save(step: int, session: Session, metrics: MetricsLog, *, last_step: bool) -> Path | None:
    """The checkpoint of ``step`` when one is due (the interval; always at the launch's last
    step); the newest durable one then (this one when saved synchronously, the one before when
    asynchronously)."""
    checkpoints = session.checkpoints
    if not checkpoints.save(step, last_step=last_step):
        return None
    saved = checkpoints.last_saved
    metrics.checkpoint(saved)
    return saved


def _roll_out(
    step: int, session: Session, parts: StepParts, rollouts: InTrainingEval, metrics: MetricsLog
) -> None:
    cfg = session.plan.cfg
    with evaluation_weights(parts.ema, cfg.ema.use_for_eval):
        info = rollouts.run(session.policy, session.pre, session.post, step, parts.autocast)
    if info is not None:
        record = env_eval_summary(info, step)
        metrics.log(record, mode="eval")
        log.info("%s", describe_rollouts(record, cfg.env.type))


def open_metrics(plan: TrainingPlan, env: DistEnv) -> MetricsLog:
    """Collective: the trackers, opened on the main rank (W&B starts its run there); when that
    fails (a login the server refuses, ...) every rank stops with its message."""
    opened: list[MetricsLog] = []
    # W&B's episodes and epochs count the training episodes (LeRobot's train dataset).
    num_frames, num_episodes = len(plan.dataset), plan.dataset.num_episodes
    if plan.heldout is not None:
        num_frames -= plan.heldout.num_held_out_frames
        num_episodes = len(plan.heldout.train_episodes)

    def _open() -> None:
        opened.append(
            MetricsLog(
                plan.cfg,
                start_step=plan.start_step,
                is_main=True,
                num_frames=num_frames,
                num_episodes=num_episodes,
                resumed_from=plan.resume_from,
            )
        )

    run_on_main(_open, error_type=TrackerError, what="starting the metrics trackers")
    return opened[0] if opened else MetricsLog(plan.cfg, start_step=plan.start_step, is_main=False)


def open_rollouts(plan: TrainingPlan, env: DistEnv) -> InTrainingEval | None:
    """The in-training rollouts of ``--env.*`` (None without an env), their environment made
    on every rank. Collective (the batch size is the main rank's)."""
    cfg = plan.cfg
    if cfg.env is None:
        return None
    return InTrainingEval(
        env_cfg=cfg.env,
        n_episodes=cfg.eval.n_episodes,
        batch_size=eval_batch_size(cfg.eval.n_episodes, cfg.eval.batch_size),
        seed=cfg.seed,
        output_dir=plan.output_dir,
        total_steps=cfg.steps,
        rank=env.rank,
        world_size=env.world_size,
        device=env.device,
        lockstep=plan.dims.is_sharded,
        use_async_envs=cfg.eval.use_async_envs,
    ).open()


def _push_final(plan: TrainingPlan, step_dir: Path) -> None:
    from lerobot_pipe.hub.publish import PublishError, publish_checkpoint
    from lerobot_pipe.utils.hub_http import redacted

    repo_id = plan.cfg.policy.repo_id
    run_on_main(
        publish_checkpoint,
        step_dir,
        repo_id,
        intermediate=False,
        step=int(step_dir.name),
        private=plan.cfg.policy.private,
        error_type=PublishError,
        describe=redacted,
        what="publishing",
    )
    log.info("Pushed %s to %s", step_dir / C.PRETRAINED_MODEL_DIR, repo_id)
