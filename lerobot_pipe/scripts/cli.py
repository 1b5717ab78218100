"""``lerobot-pipe``: the small commands the pipeline's rules call (each a library function).

lerobot-pipe make-dataset --root=DIR [--num_episodes=N --episode_length=N --fps=N --seed=N
                          --cameras=top[,wrist] --image_size=64 --camera_dtype=video|image
                          --pixels_only=false]
lerobot-pipe validate --nproc_per_node=N [--nnodes=M] [--write_resolved=PATH] <lerobot-train flags>
lerobot-pipe resume-args --output_dir=DIR
lerobot-pipe launch-train --nproc_per_node=N [--nnodes=M --rdzv_port=P --cpus_per_task=C]
                          --log=PATH [--final_checkpoint=PATH] <lerobot-train flags>
lerobot-pipe check-run-lock --output_dir=DIR
lerobot-pipe list-checkpoints --output_dir=DIR
lerobot-pipe publish --pretrained_dir=DIR --repo_id=R [--step=N --intermediate=false
                     --private=false --endpoint=URL --receipt=PATH]
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from lerobot_pipe.configs.parser import ConfigError, convert_value, split_flags
from lerobot_pipe.scripts.logs import setup_logging

log = logging.getLogger("lerobot_pipe.cli")


def _take(flags: dict[str, str], name: str, tp, default=None, required: bool = False):
    if name not in flags:
        if required:
            raise ConfigError(f"--{name} is required")
        return default
    return convert_value(flags.pop(name), tp, name)


def _no_more(flags: dict[str, str], command: str, allowed: list[str]) -> None:
    if flags:
        raise ConfigError(
            f"{command}: unknown flag(s) {', '.join('--' + f for f in flags)}; allowed: "
            f"{', '.join('--' + a for a in allowed)}"
        )


def cmd_make_dataset(argv: list[str]) -> int:
    from lerobot_pipe.datasets import write_synthetic_dataset

    flags = split_flags(argv)
    allowed = [
        "root",
        "num_episodes",
        "episode_length",
        "fps",
        "seed",
        "cameras",
        "image_size",
        "camera_dtype",
        "pixels_only",
        "overwrite",
    ]
    kwargs = {
        "num_episodes": _take(flags, "num_episodes", int, 50),
        "episode_length": _take(flags, "episode_length", int, 100),
        "fps": _take(flags, "fps", int, 10),
        "seed": _take(flags, "seed", int, 0),
        "cameras": _take(flags, "cameras", list[str], []),
        "image_size": _take(flags, "image_size", int, 64),
        "camera_dtype": _take(flags, "camera_dtype", str, "video"),
        "pixels_only": _take(flags, "pixels_only", bool, False),
        "overwrite": _take(flags, "overwrite", bool, False),
    }
    root = _take(flags, "root", str, required=True)
    _no_more(flags, "make-dataset", allowed)
    path = write_synthetic_dataset(root, **kwargs)
    log.info("synthetic LeRobot v3.0 dataset ready at %s", path)
    return 0


def _split_own_flags(argv: list[str], own: set[str]) -> tuple[dict[str, str], list[str]]:
    """This command's flags (``--name=value`` with a name in ``own``), and the rest: the
    lerobot-train flags it passes on."""
    mine, rest = [], []
    for arg in argv:
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        (mine if name in own else rest).append(arg)
    return split_flags(mine), rest


def cmd_validate(argv: list[str]) -> int:
    """Run lerobot-train's own parsing, resolution and checks for the world size a launch will
    have; nothing is launched and nothing is written except ``--write_resolved``."""
    from lerobot_pipe.configs.parser import to_dict
    from lerobot_pipe.training.plan import make_plan

    flags, rest = _split_own_flags(argv, {"nproc_per_node", "nnodes", "write_resolved"})
    nproc = _take(flags, "nproc_per_node", int, 1)
    nnodes = _take(flags, "nnodes", int, 1)
    out = _take(flags, "write_resolved", str)
    plan = make_plan(rest, nproc * nnodes, os.environ)
    log.info(
        "config valid for %d process(es): %s; effective batch %d",
        nproc * nnodes,
        plan.dims.describe(),
        plan.resolved["effective_batch_size"],
    )
    if plan.resume_from is not None:
        log.info("would resume from %s (step %d)", plan.resume_from, plan.start_step)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        resolved = {**to_dict(plan.cfg), "resolved": plan.resolved}
        Path(out).write_text(json.dumps(resolved, indent=4) + "\n")
    return 0


def cmd_resume_args(argv: list[str]) -> int:
    """``--resume=true`` when --output_dir holds a complete checkpoint: lerobot-train then
    resumes from the newest one that verifies, and its flags (the pipeline's config, nulls
    included) decide everything else; the saved train_config.json is not read back."""
    from lerobot_pipe.training.checkpoint import newest_usable_checkpoint

    flags = split_flags(argv)
    output_dir = _take(flags, "output_dir", str, required=True)
    _no_more(flags, "resume-args", ["output_dir"])
    found = newest_usable_checkpoint(output_dir)
    if found is None:
        log.info("no complete checkpoint in %s: training starts fresh", output_dir)
        return 0
    latest, info = found
    log.info("resuming from %s (step %d)", latest, info["step"])
    print("--resume=true")
    return 0


def cmd_launch_train(argv: list[str]) -> int:
    """The pipeline's train job (lerobot_pipe/training/launcher.py)."""
    from lerobot_pipe.training.launcher import launch_train

    own = {"nproc_per_node", "nnodes", "rdzv_port", "cpus_per_task", "log", "final_checkpoint"}
    flags, rest = _split_own_flags(argv, own)
    final = _take(flags, "final_checkpoint", str)
    return launch_train(
        rest,
        log_path=Path(_take(flags, "log", str, required=True)),
        final_checkpoint=Path(final) if final else None,
        nproc_per_node=_take(flags, "nproc_per_node", int, 1),
        nnodes=_take(flags, "nnodes", int, 1),
        rdzv_port=_take(flags, "rdzv_port", int, 29500),
        cpus_per_task=_take(flags, "cpus_per_task", int, 1),
    )


def cmd_check_run_lock(argv: list[str]) -> int:
    """Exit 0 when no trainer holds --output_dir, else fail naming the one that does."""
    from lerobot_pipe.training.run_lock import check_run_lock

    flags = split_flags(argv)
    output_dir = _take(flags, "output_dir", str, required=True)
    _no_more(flags, "check-run-lock", ["output_dir"])
    check_run_lock(output_dir)
    log.info("no trainer holds %s", output_dir)
    return 0


def cmd_list_checkpoints(argv: list[str]) -> int:
    from lerobot_pipe.training.checkpoint import list_complete_checkpoints

    flags = split_flags(argv)
    output_dir = _take(flags, "output_dir", str, required=True)
    as_json = _take(flags, "json", bool, False)
    _no_more(flags, "list-checkpoints", ["output_dir", "json"])
    names = [p.name for p in list_complete_checkpoints(output_dir)]
    print(json.dumps(names) if as_json else "\n".join(names))
    return 0


def cmd_publish(argv: list[str]) -> int:
    from lerobot_pipe.hub.publish import publish_checkpoint

    flags = split_flags(argv)
    allowed = [
        "pretrained_dir",
        "repo_id",
        "step",
        "intermediate",
        "private",
        "endpoint",
        "receipt",
    ]
    pretrained = Path(_take(flags, "pretrained_dir", str, required=True))
    repo_id = _take(flags, "repo_id", str, required=True)
    step = _take(flags, "step", int, required=True)
    intermediate = _take(flags, "intermediate", bool, False)
    private = _take(flags, "private", bool)
    endpoint = _take(flags, "endpoint", str)
    receipt_path = _take(flags, "receipt", str)
    _no_more(flags, "publish", allowed)
    receipt = publish_checkpoint(
        pretrained,
        repo_id,
        intermediate=intermediate,
        step=step,
        private=private,
        endpoint=endpoint,
    )
    data = receipt.to_json()
    if receipt_path:
        Path(receipt_path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(receipt_path + ".tmp")
        tmp.write_text(json.dumps(data, indent=4) + "\n")
        os.replace(tmp, receipt_path)
    log.info("published %s to %s at %s", pretrained, repo_id, data.get("commit_id"))
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "make-dataset": cmd_make_dataset,
    "validate": cmd_validate,
    "resume-args": cmd_resume_args,
    "launch-train": cmd_launch_train,
    "check-run-lock": cmd_check_run_lock,
    "list-checkpoints": cmd_list_checkpoints,
    "publish": cmd_publish,
}


PIPELINE_JOBS = ("validate", "launch-train")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    setup_logging()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    from lerobot_pipe.hub.publish import PublishError
    from lerobot_pipe.pipeline_config import with_config_keys
    from lerobot_pipe.training.plan import USER_ERRORS
    from lerobot_pipe.training.run_lock import RunLockError

    errors = (*USER_ERRORS, PublishError, ValueError, FileNotFoundError)
    try:
        return COMMANDS[argv[0]](argv[1:])
    except errors as e:
        # validate and launch-train check the pipeline's config: name its keys too.
        message = with_config_keys(str(e)) if argv[0] in PIPELINE_JOBS else str(e)
        log.error("lerobot-pipe %s: error: %s", argv[0], message)
        return 2 if isinstance(e, ConfigError | RunLockError) else 1


if __name__ == "__main__":
    sys.exit(main())
