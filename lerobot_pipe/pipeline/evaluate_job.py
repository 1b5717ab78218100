"""The pipeline's evaluate job: ``lerobot-pipe evaluate``, one checkpoint rolled out with
lerobot-eval (in this process, its library path) while the checkpoint is pinned against
retention (:mod:`lerobot_pipe.checkpoint.pins`, reason ``evaluate``).

``--output_dir`` (``results/<run>/eval/<step>``) receives lerobot-eval's ``eval_info.json`` and
its videos. eval_info.json is written last, atomically (a temporary file renamed), so its
presence marks a finished evaluation; the videos of an earlier evaluation of the step are
removed first, so none outlives the evaluation that wrote it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from lerobot_pipe.checkpoint.pins import pinned


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
