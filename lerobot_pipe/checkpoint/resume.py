"""The one resume resolver: which checkpoint a run continues from, and what happens when it is
damaged. The pipeline (``lerobot-pipe resume-args``, validate), the train job and the trainer all
ask it; the fallback loop and its messages live only here.

Two steps, because hashing needs every rank:

1. :func:`locate` (before any process group; reads no checkpoint data): the checkpoint named by
   ``--config_path``, which must pass :func:`validate_checkpoint` on sizes, or else the newest
   complete checkpoint of the output folder that does, damaged newer ones skipped with a warning.
2. :func:`verify` (collective, once the process group exists and before anything is written or
   loaded): the SHA-256 of every listed file, each rank a share, so a pipeline resume hashes each
   byte once in total. A damaged checkpoint named explicitly fails; an automatic resume falls
   back to the next older one that validates and verifies, and returns that as a new
   :class:`ResumePoint` (never an edit of the old one).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lerobot_pipe import constants as C
from lerobot_pipe.checkpoint.layout import (
    CheckpointError,
    checkpoints_dir,
    is_complete,
    list_complete_checkpoints,
    read_checkpoint_json,
    read_training_step,
    training_step_path,
)
from lerobot_pipe.checkpoint.manifest import verify_files, verify_split

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """A complete checkpoint to resume from and its training_step.json."""

    step_dir: Path  # resolved (never the ``last`` link)
    info: dict
    explicit: bool = False  # named by --config_path: it must verify, no fallback

    @property
    def step(self) -> int:
        return int(self.info["step"])

    @property
    def stream_revision(self) -> str | None:
        """The Hub commit a streaming run read (its stream state); None when it has none."""
        saved = self.step_dir / C.TRAINING_STATE_DIR / C.STREAM_STATE
        return read_checkpoint_json(saved)["revision"] if saved.is_file() else None


def validate_checkpoint(step_dir: Path, *, hashes: bool = True) -> dict:
    """Check that a step folder is a complete checkpoint of this project's layout; return its
    training_step.json. ``hashes=False`` checks the listed files' sizes, not their SHA-256 (the
    resolver's first step: :func:`verify` hashes them split across the ranks)."""
    if not step_dir.exists():
        raise CheckpointError(f"checkpoint folder not found: {step_dir}")
    resolved = step_dir.resolve()
    if not resolved.is_dir():
        raise CheckpointError(f"checkpoint path is not a folder (dangling link?): {step_dir}")
    if not is_complete(resolved):
        raise CheckpointError(
            f"incomplete checkpoint {step_dir}: {training_step_path(step_dir)} is missing (the save "
            "did not finish); resume from an earlier complete checkpoint"
        )
    info = read_training_step(resolved)
    ts = resolved / C.TRAINING_STATE_DIR
    has_dcp_optim = (ts / C.OPTIMIZER_DCP_DIR).is_dir()
    has_flat_optim = (ts / C.OPTIMIZER_STATE).is_file()
    parallelism = info.get("parallelism") or {}
    upstream_sharded = (
        has_flat_optim
        and not has_dcp_optim
        and "sharded" not in info
        and int(parallelism.get("dp_shard") or 1) > 1
    )
    if upstream_sharded:
        raise CheckpointError(
            f"{resolved} looks like a LeRobot 0.6 sharded checkpoint (one aggregated "
            f"{C.OPTIMIZER_STATE}, no {C.OPTIMIZER_DCP_DIR}/, no topology fields in "
            f"{C.TRAINING_STEP}); its optimizer state cannot be resharded: start a new run from its "
            "weights with --policy.path=<its pretrained_model/>"
        )
    if not has_dcp_optim and not has_flat_optim:
        raise CheckpointError(
            f"checkpoint {resolved} has no optimizer state ({C.OPTIMIZER_STATE} or {C.OPTIMIZER_DCP_DIR}/)"
        )
    pretrained = resolved / C.PRETRAINED_MODEL_DIR
    if not any(
        (pretrained / n).exists()
        for n in (C.MODEL_SAFETENSORS, C.ADAPTER_SAFETENSORS, C.MODEL_DCP_DIR)
    ):
        raise CheckpointError(f"checkpoint {pretrained} holds no model weights")
    verify_files(resolved, info, hashes=hashes)
    for name in (C.CONFIG_NAME, C.TRAIN_CONFIG_NAME):
        read_checkpoint_json(pretrained / name)
    return info


def _check_policy_type(step_dir: Path, policy_type: str | None) -> None:
    if policy_type is None:
        return
    saved = read_checkpoint_json(step_dir / C.PRETRAINED_MODEL_DIR / C.CONFIG_NAME)
    if saved.get("type") != policy_type:
        raise CheckpointError(
            f"checkpoint {step_dir} holds a {saved.get('type')!r} policy but --policy.type is "
            f"{policy_type!r}; resume with the checkpoint's own train_config.json"
        )


def _no_usable(output_dir: Path) -> CheckpointError:
    return CheckpointError(
        f"--resume=true but {checkpoints_dir(output_dir)} holds no complete, undamaged "
        "checkpoint; pass --config_path=<step>/pretrained_model/train_config.json or drop --resume"
    )


def _usable(
    output_dir: Path, below_step: int | None = None, skipped: list | None = None
) -> Iterator[ResumePoint]:
    """Complete checkpoints that validate on sizes, newest first (only those before
    ``below_step`` when given); each one passed over is added to ``skipped`` with its error."""
    # Below a step (verify's fallback), unreadable folders were locate's to report already.
    unreadable = skipped if below_step is None else []
    for step_dir in reversed(list_complete_checkpoints(output_dir, unreadable)):
        try:
            info = validate_checkpoint(step_dir, hashes=False)
        except CheckpointError as e:
            if skipped is not None:
                skipped.append((step_dir, e))
            continue
        if below_step is None or info["step"] < below_step:
            yield ResumePoint(step_dir.resolve(), info)


def _say_fallback(skipped: list[tuple[Path, CheckpointError]], point: ResumePoint | None) -> None:
    """One warning for a fallback: which checkpoints cannot be resumed and why, which one the run
    resumes from, and that saving a skipped step again rewrites its folder."""
    if not skipped:
        return
    names = ", ".join(step_dir.name for step_dir, _ in skipped)
    why = (
        str(skipped[0][1])
        if len(skipped) == 1
        else "; ".join(f"{step_dir.name}: {e}" for step_dir, e in skipped)
    )
    if point is None:
        log.warning("checkpoint %s cannot be resumed (%s), and no earlier one can", names, why)
        return
    steps = "that step" if len(skipped) == 1 else "those steps"
    log.warning(
        "checkpoint %s cannot be resumed (%s); resuming from %s instead: training rewrites %s "
        "when it saves %s again",
        names,
        why,
        point.step_dir.name,
        names,
        steps,
    )


def locate(
    output_dir: str | Path,
    explicit: Path | None = None,
    policy_type: str | None = None,
) -> ResumePoint | None:
    """Step 1, before a process group: ``explicit`` (a step folder, which must validate), else
    the newest usable checkpoint of ``output_dir`` (None when there is none). Sizes only: no
    file's data is read. ``policy_type``, when given, must be the checkpoint's."""
    output_dir = Path(output_dir)
    if explicit is not None:
        info = validate_checkpoint(explicit, hashes=False)
        point = ResumePoint(explicit.resolve(), info, explicit=True)
    else:
        skipped: list[tuple[Path, CheckpointError]] = []
        point = next(_usable(output_dir, skipped=skipped), None)
        _say_fallback(skipped, point)
        if point is None:
            return None
        last = checkpoints_dir(output_dir) / C.LAST_CHECKPOINT_LINK
        # `last` on a checkpoint just passed over is what the warning above said already.
        passed_over = {step_dir.resolve() for step_dir, _ in skipped}
        if last.is_symlink() and last.resolve() not in {point.step_dir, *passed_over}:
            log.warning(
                "%s points to %s, which is not the newest usable checkpoint; resuming from %s",
                last,
                os.readlink(last),
                point.step_dir,
            )
    _check_policy_type(point.step_dir, policy_type)
    return point


def require(output_dir: str | Path, explicit: Path | None, policy_type: str | None) -> ResumePoint:
    """:func:`locate` for ``--resume=true``: a checkpoint, or the error saying what to pass."""
    point = locate(output_dir, explicit, policy_type)
    if point is None:
        raise _no_usable(Path(output_dir))
    return point


def verify(
    point: ResumePoint,
    output_dir: str | Path,
    group: ProcessGroup | None = None,
    policy_type: str | None = None,
) -> ResumePoint:
    """Step 2, collective: the checkpoint to load, every file's SHA-256 verified (each rank a
    share). A damaged explicit one fails; an automatic resume falls back to older ones, which
    the main rank says once."""
    import torch.distributed as dist

    says = not dist.is_initialized() or dist.get_rank() == 0
    skipped: list[tuple[Path, CheckpointError]] = []
    candidate: ResumePoint | None = point
    older = _usable(Path(output_dir), below_step=point.step, skipped=skipped)
    while candidate is not None:
        try:
            verify_split(candidate.step_dir, candidate.info, group)
        except CheckpointError as e:
            if candidate.explicit:
                raise
            skipped.append((candidate.step_dir, e))
            candidate = next(older, None)
            if candidate is not None:
                _check_policy_type(candidate.step_dir, policy_type)
            continue
        if says:
            _say_fallback(skipped, candidate)
        return candidate
    if says:
        _say_fallback(skipped, None)
    raise _no_usable(Path(output_dir))
