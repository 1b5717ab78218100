"""The pipeline's evaluate job: ``lerobot-pipe evaluate``, one checkpoint rolled out with
lerobot-eval (in this process, its library path) while the checkpoint is pinned against
retention (:mod:`lerobot_pipe.checkpoint.pins`, reason ``evaluate``).

``--output_dir`` (``results/<run>/eval/<step>``) receives lerobot-eval's ``eval_info.json`` and
its videos. eval_info.json is written last, atomically (a temporary file renamed), so its
presence marks a finished evaluation; the videos of an earlier evaluation of the step are
removed first, so none outlives the evaluation that wrote it.

While training goes on (the pipeline's training segments), each evaluation then updates the
run's ``best.json`` from every evaluation there is so far and moves the ``best`` pin
(:func:`update_best`), and removes the checkpoint's ``pending`` pin: it has been evaluated.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import shutil
from pathlib import Path
from typing import Any

from lerobot_pipe.checkpoint.pins import move_pin, pinned, unpin

log = logging.getLogger(__name__)


def evaluate_checkpoint(checkpoint_dir: str | Path, output_dir: str | Path, eval_argv: list[str]):
    """Run lerobot-eval with ``eval_argv`` (its flags, ``--policy.path`` included) into
    ``output_dir`` while ``checkpoint_dir`` (``<train output>/checkpoints/<step>``) is pinned.
    Returns eval_info; raises lerobot-eval's BadInput / ConfigError for bad flags."""
    from lerobot_pipe.configs.parser import parse_options
    from lerobot_pipe.evaluation.eval_policy import EvalPipelineOptions, run

    step_dir = Path(checkpoint_dir)
    out = Path(output_dir)
    options, _ = parse_options(EvalPipelineOptions, [*eval_argv, f"--output_dir={out}"])
    with pinned(step_dir.parent.parent, step_dir.name, "evaluate"):
        shutil.rmtree(out / "videos", ignore_errors=True)
        (out / "eval_info.json").unlink(missing_ok=True)
        info: dict[str, Any] = run(options)
    return info


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` (created), held for the block: evaluations that end at the
    same moment update best.json one after the other."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def update_best(best_path: str | Path, train_dir: str | Path | None) -> dict[str, Any]:
    """best.json from every ``<eval dir>/<step>/eval_info.json`` written so far (the eval dir:
    best.json's folder), the ``best`` pin moved to it first. Returns the record."""
    from lerobot_pipe.evaluation.best import best_record, write_best

    best = Path(best_path)
    with _locked(best.parent / ".best.lock"):
        infos = {
            p.parent.name: str(p)
            for p in sorted(best.parent.glob("*/eval_info.json"))
            if p.parent.name.isdigit()
        }
        record = best_record(infos)
        if train_dir is not None:
            move_pin(train_dir, "best", [record["step"]])
        write_best(best, record)
    log.info(
        "best so far: %s (%.1f %% success) of %d evaluated",
        record["step"],
        record["pc_success"],
        len(infos),
    )
    return record


def evaluated(
    checkpoint_dir: str | Path, best_path: str | Path | None, unpin_pending: bool
) -> None:
    """After the evaluation of ``checkpoint_dir``: best.json updated (when given), then the
    checkpoint's ``pending`` pin removed (when asked)."""
    step_dir = Path(checkpoint_dir)
    train_dir = step_dir.parent.parent
    if best_path is not None:
        update_best(best_path, train_dir)
    if unpin_pending:
        unpin(train_dir, step_dir.name, "pending")
