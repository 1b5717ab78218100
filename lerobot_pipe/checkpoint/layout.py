"""The on-disk layout of a run's checkpoints, without torch: names, listing, completeness,
temporaries, the atomic rename into place, the ``last`` link and retention.

Every name is in :mod:`lerobot_pipe.constants`; the rules are the package's contract
(:mod:`lerobot_pipe.checkpoint`).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from lerobot_pipe import constants as C
from lerobot_pipe.checkpoint.pins import pinned_steps
from lerobot_pipe.fsutil import fsync_path, read_json
from lerobot_pipe.utils.faults import fault_point

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used. The message names the file."""


def step_folder_name(step: int, total_steps: int) -> str:
    return f"{step:0{max(6, len(str(total_steps)))}d}"


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / C.CHECKPOINTS_DIR


def training_step_path(step_dir: Path) -> Path:
    return step_dir / C.TRAINING_STATE_DIR / C.TRAINING_STEP


def is_complete(step_dir: Path) -> bool:
    return training_step_path(step_dir).is_file()


def read_checkpoint_json(path: Path, expect: type[dict] | type[list] = dict) -> Any:
    """A JSON file of a checkpoint; CheckpointError naming the file when missing or corrupt."""
    return read_json(path, "checkpoint file", error=CheckpointError, expect=expect)


def read_training_step(step_dir: Path) -> dict:
    path = training_step_path(step_dir)
    data = read_checkpoint_json(path)
    if not isinstance(data.get("step"), int):
        raise CheckpointError(f"corrupt checkpoint file {path}: no integer 'step'")
    return data


def list_complete_checkpoints(output_dir: str | Path, unreadable: list | None = None) -> list[Path]:
    """Complete step folders, oldest first (by the step recorded in training_step.json). One
    whose training_step.json cannot be read is logged, or added to ``unreadable`` with its
    error when given (the resume resolver says it in its own message)."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        if child.name.startswith(".") or child.is_symlink() or not child.is_dir():
            continue
        if not is_complete(child):
            continue
        try:
            found.append((read_training_step(child)["step"], child))
        except CheckpointError as e:
            if unreadable is None:
                log.warning("ignoring checkpoint %s: %s", child, e)
            else:
                unreadable.append((child, e))
    return [path for _, path in sorted(found)]


def remove_stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Delete ``.tmp-*`` folders left by a save that was killed (they were never complete)."""
    root = checkpoints_dir(output_dir)
    removed = []
    if root.is_dir():
        old_prefix = f"{C.TMP_CHECKPOINT_PREFIX}old-"
        for child in root.glob(f"{old_prefix}*"):
            # A complete checkpoint moved aside while a newer save of the same step replaced it;
            # the kill came before the new one was in place: put the old one back.
            original = root / child.name[len(old_prefix) :]
            if not original.exists() and is_complete(child):
                os.rename(child, original)
                log.warning(
                    "restored %s (a replacement save of the same step did not finish)", original
                )
        for child in root.iterdir():
            if child.name.startswith(C.TMP_CHECKPOINT_PREFIX):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
            elif child.is_dir() and not child.is_symlink() and not is_complete(child):
                log.warning(
                    "ignoring incomplete checkpoint folder %s (no %s)", child, C.TRAINING_STEP
                )
        for link in root.glob(".last*"):
            link.unlink(missing_ok=True)
    return removed


def fsync_folders(root: Path) -> None:
    """fsync every folder of a tree (its files were fsynced by whoever wrote them), so the
    creations and renames in it are durable."""
    for dirpath, _, _ in os.walk(root):
        fsync_path(Path(dirpath))


def _exchange_paths(a: Path, b: Path) -> bool:
    """Atomically swap two directory entries (Linux renameat2 RENAME_EXCHANGE); False where the
    system call or the file system does not support it."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def publish_step_folder(tmp: Path, final: Path) -> None:
    """Rename the finished temporary folder into place. A complete checkpoint already there (the
    same step saved again after resuming from an older one) is swapped out atomically, so at
    every instant one complete checkpoint of that step exists."""
    if final.exists():
        if _exchange_paths(tmp, final):
            fault_point("save:after_exchange")
            shutil.rmtree(tmp, ignore_errors=True)  # now the old copy
            fsync_path(final.parent)
            return
        # No atomic exchange here: move the old one aside; remove_stale_temporaries puts it back
        # if the process dies before the new one is in place.
        old = final.with_name(f"{C.TMP_CHECKPOINT_PREFIX}old-{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        fault_point("save:during_replace")
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fsync_path(final.parent)


def update_last_link(ckpt_root: Path, name: str) -> None:
    link = ckpt_root / C.LAST_CHECKPOINT_LINK
    # A symlink swap, not a file write (fsutil.atomic_path writes a file's content): the kill
    # tests stop the process between the new link and the rename (save:during_last_link).
    tmp_link = ckpt_root / f".{C.LAST_CHECKPOINT_LINK}.tmp"
    tmp_link.unlink(missing_ok=True)
    os.symlink(name, tmp_link)
    fault_point("save:during_last_link")
    os.replace(tmp_link, link)
    fsync_path(ckpt_root)


def prune_checkpoints(output_dir: str | Path, keep_last: int) -> list[Path]:
    """Retention (``--checkpoint_keep_last``): delete the complete checkpoints older than the
    ``keep_last`` newest (by step), never the one ``last`` points to nor a pinned one (the
    pipeline's best checkpoint, one being evaluated or published: :mod:`.pins`). Called right
    after a save completed, so a checkpoint goes only once a newer one is complete. Each is
    first renamed to a temporary name (atomic: no half-deleted folder ever looks complete; a
    kill mid-delete leaves a temporary that the next start removes)."""
    if keep_last <= 0:
        return []
    root = checkpoints_dir(output_dir)
    complete = list_complete_checkpoints(output_dir)
    link = root / C.LAST_CHECKPOINT_LINK
    current = link.resolve() if link.is_symlink() else None
    removed = []
    for step_dir in complete[:-keep_last]:
        if current is not None and step_dir.resolve() == current:
            continue
        pins = pinned_steps(output_dir).get(step_dir.name)
        if pins:
            log.info("keeping checkpoint %s: pinned (%s)", step_dir.name, ", ".join(sorted(pins)))
            continue
        doomed = root / f"{C.DELETING_CHECKPOINT_PREFIX}{step_dir.name}"
        shutil.rmtree(doomed, ignore_errors=True)
        os.rename(step_dir, doomed)
        fsync_path(root)
        fault_point("save:during_prune")
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(step_dir)
    return removed
