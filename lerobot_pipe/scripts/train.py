"""``lerobot-train``: LeRobot's training command, on one process or many.

    lerobot-train --dataset.root=DIR --policy.type=act --output_dir=OUT --steps=1000
    torchrun --nproc-per-node=2 $(which lerobot-train) ...
    accelerate launch --multi_gpu --num_processes=2 $(which lerobot-train) ...   (CPU too)

Every input is checked before a process group starts; a bad one exits with status 2 and a
one-line reason, on each rank alone. So does a second trainer on an --output_dir that a running
one holds (its run lock, lerobot_pipe/training/run_lock.py), naming the first.
"""

from __future__ import annotations

import logging
import os
import sys

from lerobot_pipe.scripts.logs import report_error, setup_logging

PROG = "lerobot-train"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        from lerobot_pipe.scripts.help import train_help

        print(train_help())
        return 0
    from lerobot_pipe.distributed.runtime import launched_rank, launched_world_size

    setup_logging(launched_rank())
    log = logging.getLogger("lerobot_pipe.train")
    from lerobot_pipe.training.preflight import USER_ERRORS, make_plan

    try:
        plan = make_plan(argv, launched_world_size(), os.environ)
    except USER_ERRORS as e:
        report_error(PROG, e)
        return 2
    if plan.acknowledged_env:
        log.warning(
            "ACCELERATE_* configuration acknowledged through LEROBOT_ALLOW_ACCELERATE_ENV=1 and "
            "ignored (the flags decide): %s",
            ", ".join(plan.acknowledged_env),
        )
    from lerobot_pipe.training.run_lock import RunLockError
    from lerobot_pipe.training.train import train

    try:
        train(plan)
    except (RunLockError, *USER_ERRORS) as e:  # the run lock, or a checkpoint failing verification
        if launched_rank() == 0:
            report_error(PROG, e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
