"""Restoring a :class:`~lerobot_pipe.checkpoint.stateful.TrainState` from a complete checkpoint,
onto whatever topology the model is wrapped for now (resharding as needed), through the same
``Stateful`` parts a save goes through. Collective; the files were verified first
(:func:`lerobot_pipe.checkpoint.resume.verify`).

What a resume continues with, and what it says: the data position (global samples consumed:
LeRobot's checkpoints record only the step, so it is derived from their batch and world size),
a changed topology (resharded on load), a changed global batch (not sample-exact), and RNG
states of another world size (each rank seeded from a saved rank's state).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from lerobot_pipe import constants as C
from lerobot_pipe.checkpoint.layout import CheckpointError, read_checkpoint_json
from lerobot_pipe.checkpoint.lerobot_state import (
    load_safetensors,
    named_optimizer_state,
    rank_rng_state,
    unflatten_tensors,
)
from lerobot_pipe.checkpoint.resume import ResumePoint
from lerobot_pipe.checkpoint.stateful import EMAShadow, TrainState
from lerobot_pipe.distributed.runtime import barrier, broadcast_from_main

log = logging.getLogger(__name__)


def load_train_state(point: ResumePoint, state: TrainState, run_info: dict) -> None:
    """Restore every part of ``state`` from ``point``; ``run_info`` is this run's
    training_step.json record (its topology and batch), to say what changed. Collective."""
    step_dir = point.step_dir
    pretrained = step_dir / C.PRETRAINED_MODEL_DIR
    training_state = step_dir / C.TRAINING_STATE_DIR
    distributed = dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    is_main = rank == 0

    _load_model(state, pretrained, is_main or not distributed)
    _load_optimizer(state, training_state, is_main or not distributed)
    for part, name, what in (
        (state.scheduler, C.SCHEDULER_STATE, "the scheduler starts fresh"),
        (
            state.scaler if state.saves_scaler else None,
            C.SCALER_STATE,
            "the fp16 loss scale starts fresh",
        ),
    ):
        if part is None:
            continue
        path = training_state / name
        if path.is_file():
            part.load_state_dict(read_checkpoint_json(path))
        else:
            log.warning("checkpoint has no %s: %s", path, what)
    if state.ema is not None:
        _load_ema(state, step_dir, is_main or not distributed)
    if state.stream is not None:
        stream = training_state / C.STREAM_STATE
        if stream.is_file():
            state.stream.load_state_dict(read_checkpoint_json(stream))
        else:
            log.warning("checkpoint has no %s: the stream starts a fresh epoch", stream)
    _load_rng(state, training_state / C.RNG_STATE, rank, point.info, run_info)
    state.progress.load_state_dict(
        {"step": point.step, "samples_consumed": resume_position(point.info, run_info, is_main)}
    )
    barrier()


def _load_model(state: TrainState, pretrained: Path, reads: bool) -> None:
    weights_file = next(
        (
            pretrained / n
            for n in (C.MODEL_SAFETENSORS, C.ADAPTER_SAFETENSORS)
            if (pretrained / n).is_file()
        ),
        None,
    )
    if weights_file is not None:
        # model.safetensors holds every tensor; adapter_model.safetensors only the adapters, whose
        # peft names adapter_key_map turns into this model's keys (the frozen base is loaded).
        adapter = weights_file.name == C.ADAPTER_SAFETENSORS
        key_map = state.model.adapter_key_map
        if adapter and key_map is None:
            raise CheckpointError(
                f"{weights_file} holds PEFT adapters: resume it with its --peft.* flags"
            )
        full = load_safetensors(weights_file) if reads else {}
        if key_map is not None and full:
            full = key_map(full)
        state.model.load_full_state_dict(full, strict=not adapter)
    elif (pretrained / C.MODEL_DCP_DIR).is_dir():
        sd = state.model.state_dict()
        _dcp_load(sd, pretrained / C.MODEL_DCP_DIR)
        state.model.load_state_dict(sd)
    else:
        raise CheckpointError(f"checkpoint {pretrained} holds no loadable model weights")


def _load_ema(state: TrainState, step_dir: Path, reads: bool) -> None:
    """The EMA shadow: ours (pretrained_model_ema/'s weights, the count in ema_state.json),
    else LeRobot main's training_state/ema_state.pt, else it restarts from the loaded weights
    (LeRobot's behaviour). Collective."""
    ema = state.ema
    assert ema is not None
    ema_dir = step_dir / C.PRETRAINED_MODEL_EMA_DIR
    counters = step_dir / C.TRAINING_STATE_DIR / C.EMA_STATE
    lerobot_file = step_dir / C.TRAINING_STATE_DIR / C.LEROBOT_EMA_STATE
    if counters.is_file():
        ema.load_counters(read_checkpoint_json(counters))
        weights_file = next(
            (
                ema_dir / n
                for n in (C.MODEL_SAFETENSORS, C.ADAPTER_SAFETENSORS)
                if (ema_dir / n).is_file()
            ),
            None,
        )
        if weights_file is None and (ema_dir / C.MODEL_DCP_DIR).is_dir():
            # Into the shadow's own tensors (this rank's shards), resharded as needed.
            _dcp_load(dict(ema.shadow), ema_dir / C.MODEL_DCP_DIR)
            return
        if weights_file is None:
            raise CheckpointError(
                f"{ema_dir} holds no loadable EMA weights (but {counters} exists)"
            )
        adapter = weights_file.name == C.ADAPTER_SAFETENSORS
        key_map = state.model.adapter_key_map
        if adapter and key_map is None:  # on every rank: none waits in a collective
            raise CheckpointError(
                f"{weights_file} holds PEFT adapters: resume it with its --peft.* flags"
            )
        full = None
        if reads:
            full = load_safetensors(weights_file)
            if adapter:
                full = key_map(full)
        _load_full_shadow(ema, full, weights_file)
    elif lerobot_file.is_file():
        full, problem = None, None
        if reads:
            # LeRobot main's file is a pickle: weights_only refuses anything but tensors and
            # plain containers.
            try:
                saved = torch.load(lerobot_file, map_location="cpu", weights_only=True)
                full = ema.from_lerobot(saved)
            except Exception as e:  # noqa: BLE001 - every rank must hear of it (a collective)
                problem = f"{type(e).__name__}: {e}"
        ema.load_counters(broadcast_from_main(ema.counters()))
        _load_full_shadow(ema, full, lerobot_file, problem)
        if reads:
            log.info("Resumed the EMA shadow from LeRobot's %s", lerobot_file)
    else:
        ema.reset()
        if reads:
            log.warning(
                "checkpoint %s has no EMA state: the EMA shadow restarts from its weights",
                step_dir,
            )


def _load_full_shadow(
    ema: EMAShadow, full: dict | None, source: Path, problem: str | None = None
) -> None:
    """Collective: the shadow from the main rank's whole tensors (``full``; None elsewhere),
    checked there first."""
    if problem is None and full is not None:
        problem = ema.problems_with(full)
    problem = broadcast_from_main(problem)
    if problem is not None:
        raise CheckpointError(f"{source}: the EMA weights do not fit this model: {problem}")
    ema.load_full_shadow(full)


def _load_optimizer(state: TrainState, training_state: Path, reads: bool) -> None:
    # Hyper-parameters as saved (the LR a scheduler had reached, ...), not as constructed.
    groups = read_checkpoint_json(training_state / C.OPTIMIZER_PARAM_GROUPS, expect=list)
    dcp_optim = training_state / C.OPTIMIZER_DCP_DIR
    if dcp_optim.is_dir():
        osd = state.optimizer.state_dict()
        box = {"optimizer": osd["state"]}
        _dcp_load(box, dcp_optim)
        state.optimizer.load_state_dict({"state": box["optimizer"], "param_groups": groups})
        return
    current = state.optimizer.state_dict()
    full = {}
    if reads:
        saved = unflatten_tensors(load_safetensors(training_state / C.OPTIMIZER_STATE))
        full = named_optimizer_state(saved.get("state", saved), groups, current)
    state.optimizer.load_full_state_dict(full)


def _dcp_load(state: dict, path: Path) -> None:
    if not (path / C.DCP_METADATA_FILE).is_file():
        raise CheckpointError(f"missing DCP metadata: {path / C.DCP_METADATA_FILE}")
    try:
        with warnings.catch_warnings():  # a single-process load is intended, not a fallback
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
    except Exception as e:  # noqa: BLE001 - DCP wraps reader errors in many types
        raise CheckpointError(
            f"cannot load DCP checkpoint {path}: {type(e).__name__}: {e}"
        ) from None


def _saved_world(info: dict) -> int | None:
    return info.get("world_size", info.get("num_processes", info.get("dp_world_size")))


def _load_rng(state: TrainState, path: Path, rank: int, info: dict, run_info: dict) -> None:
    flat = load_safetensors(path)
    world_size = run_info["world_size"]
    saved_world = _saved_world(info)
    mine = rank_rng_state(flat, rank)
    if not mine:
        # More ranks than were saved: start from the main rank's state, then decorrelate.
        mine = rank_rng_state(flat, 0)
        if not mine:
            log.warning("%s holds no RNG state: RNG starts fresh", path)
            return
        state.rng.load_state_dict(mine)
        torch.manual_seed(int(torch.randint(0, 2**62, (1,)).item()) + rank)
    else:
        state.rng.load_state_dict(mine)
    # LeRobot before 0.5 records no world size: one process restores its main rank's state.
    unrecorded_single = saved_world is None and world_size == 1
    if saved_world != world_size and not unrecorded_single and rank == 0:
        log.warning(
            "checkpoint was written by %s rank(s), this run has %s: each rank's RNG is seeded from "
            "a saved rank's state, so random layers (dropout, VAE sampling) will not replay exactly",
            saved_world,
            world_size,
        )


def resume_position(info: dict, run_info: dict, explain: bool) -> int:
    """The global sample position to continue at; with ``explain``, log what changed since the
    checkpoint (topology, global batch)."""
    # LeRobot's training_step.json has num_processes (its world size = dp world size); before
    # 0.5 only the step, then it assumes this run's world size and batch size, as LeRobot does.
    saved_dp = info.get("dp_world_size", info.get("num_processes", run_info["dp_world_size"]))
    saved_batch = info.get("batch_size", run_info["batch_size"])
    samples = int(info.get("samples_consumed", info["step"] * saved_batch * saved_dp))
    if not explain:
        return samples
    # LeRobot's training_step.json has no topology: its num_processes ran plain DDP.
    old_topology = info.get("parallelism") or {
        "dp_replicate": saved_dp,
        "dp_shard": 1,
        "world_size": saved_dp,
    }
    now = run_info["parallelism"]
    changes = [
        f"{k}: {old_topology.get(k)} -> {now[k]}"
        for k in ("dp_replicate", "dp_shard", "world_size")
        if old_topology.get(k) != now[k]
    ]
    if changes:
        log.info(
            "Topology changed since the checkpoint (%s); state is resharded on load",
            ", ".join(changes),
        )
    old_global = info.get("global_batch_size", saved_batch * saved_dp)
    new_global = run_info["global_batch_size"]
    if old_global != new_global:
        log.warning(
            "global batch changed (%d -> %d samples per step): the run continues at sample %d of "
            "the same data order, but it is not sample-exact with an uninterrupted run",
            old_global,
            new_global,
            samples,
        )
    return samples
