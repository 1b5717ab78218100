"""``lerobot-pipe``: the trainer, evaluator and converter under our own name, and the small
commands the pipeline's rules call (each a library function).

``lerobot-pipe train``, ``eval`` and ``convert-dcp`` are ``lerobot-train``, ``lerobot-eval`` and
``lerobot-convert-dcp`` (every flag passed on unchanged; ``torchrun $(which lerobot-pipe) train
...`` launches the trainer): beside LeRobot in one venv, the commands of those names are
LeRobot's, and ours are installed under them only in our own venv (``lerobot_pipe_commands/``).
Each small command's options are a dataclass below, parsed like lerobot-train's flags
(``lerobot_pipe.configs.parser.parse_options``); ``lerobot-pipe <command> --help`` lists them.
A bad flag exits with status 2 and a one-line reason; a command that fails at its work, 1.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lerobot_pipe.configs.parser import ConfigError, parse_options, required
from lerobot_pipe.scripts.help import command_help, summary
from lerobot_pipe.scripts.logs import report_error, setup_logging

log = logging.getLogger("lerobot_pipe.cli")

PROG = "lerobot-pipe"
# What validate and launch-train do with the flags that are not their own.
PASSES_ON = "Every other flag is lerobot-train's (lerobot-train --help) and is passed on to it."
PASSES_TO_EVAL = "Every other flag is lerobot-eval's (lerobot-eval --help) and is passed on to it."


@dataclass
class MakeDatasetOptions:
    """Write the synthetic LeRobot v3.0 dataset (a scripted 2-D reaching expert), atomically.
    Running it again with the same options is a no-op."""

    root: str = required()  # the dataset folder to write
    num_episodes: int = 50  # episodes to record
    episode_length: int = 100  # frames per episode
    fps: int = 10  # frames per second
    seed: int = 0  # seed of the episodes' start and goal positions
    cameras: list[str] = field(default_factory=list)  # rendered views: top, wrist (none: numeric)
    image_size: int = 64  # square side of the camera frames, in pixels
    camera_dtype: str = "video"  # video (AV1 mp4, LeRobot's encoding) or image (PNG in parquet)
    pixels_only: bool = False  # leave out observation.environment_state (the goal)
    num_tasks: int = 1  # task strings (1 to 4), given to the episodes in turn
    overwrite: bool = False  # replace a folder holding anything else


def cmd_make_dataset(options: MakeDatasetOptions, _: list[str]) -> int:
    from lerobot_pipe.datasets import write_synthetic_dataset

    kwargs = {k: v for k, v in vars(options).items() if k != "root"}
    path = write_synthetic_dataset(options.root, **kwargs)
    log.info("synthetic LeRobot v3.0 dataset ready at %s", path)
    return 0


@dataclass
class ValidateOptions:
    """Run lerobot-train's own parsing, resolution and checks for the world size a launch will
    have; nothing is launched and nothing is written except --write_resolved."""

    nproc_per_node: int = 1  # processes per node of the launch to check for
    nnodes: int = 1  # nodes of that launch
    write_resolved: str | None = None  # write the resolved config (JSON) here
    # The memory plan: refuse a run that does not fit a GPU of this many GB (10^9 bytes), or,
    # without one, the host memory of --mem_mb per node.
    gpu_memory_gb: float | None = None
    mem_mb: int | None = None  # host memory per node, in MiB (slurm.mem_mb)
    gpus_per_node: int = 0  # GPUs per node (slurm.gpus_per_node; 0: the ranks may train on CPU)


def cmd_validate(options: ValidateOptions, train_args: list[str]) -> int:
    import torch

    from lerobot_pipe.configs.parser import to_dict
    from lerobot_pipe.fsutil import write_json_atomic
    from lerobot_pipe.training.memory_plan import GB, check_memory
    from lerobot_pipe.training.preflight import make_plan, probe_units_before_launch

    world_size = options.nproc_per_node * options.nnodes
    # A damaged checkpoint passed over is the train job's to explain (it resumes, and the
    # pipeline runs it right after): validate says only where the run would resume, below.
    resolver = logging.getLogger("lerobot_pipe.checkpoint.resume")
    level = resolver.level
    resolver.setLevel(logging.ERROR)
    try:
        plan = make_plan(train_args, world_size, os.environ)
    finally:
        resolver.setLevel(level)
    log.info(
        "config valid for %d process(es): %s; effective batch %d",
        world_size,
        plan.dims.describe(),
        plan.resolved["effective_batch_size"],
    )
    if plan.resume_from is not None:
        log.info("would resume from %s (step %d)", plan.resume_from, plan.start_step)
    # LeRobot's classes cannot run on the meta device: their wrap units are checked on the real
    # model here, when it is small enough to build on the CPU.
    left = probe_units_before_launch(plan)
    if left is not None:
        log.info("wrap units not probed here (%s)", left)
    gpu = None if options.gpu_memory_gb is None else int(options.gpu_memory_gb * GB)
    host = None if options.mem_mb is None else options.mem_mb * 2**20
    # Without a GPU the ranks train on the host: their whole plan is host memory.
    on_host = options.gpus_per_node == 0 and not torch.cuda.is_available()
    check_memory(plan, train_args, options.nproc_per_node, gpu, host, on_host)
    if options.write_resolved:
        write_json_atomic(
            Path(options.write_resolved), {**to_dict(plan.cfg), "resolved": plan.resolved}
        )
    return 0


@dataclass
class PlanMemoryOptions:
    """What a training configuration needs per GPU, per phase of a step, and the changes that
    make it fit: the policy built on the meta device (no weights read, no GPU)."""

    world_size: int | None = None  # processes of the launch (default: nproc_per_node x nnodes)
    nproc_per_node: int | None = None  # processes per node (default: all on one node)
    nnodes: int = 1  # nodes
    gpu_memory_gb: float | None = None  # memory of one GPU in GB (10^9 bytes, as GPUs are sold)
    json: bool = False  # print the plan as one JSON object


def cmd_plan_memory(options: PlanMemoryOptions, train_args: list[str]) -> int:
    import json

    from lerobot_pipe.training.memory_plan import GB, plan_memory

    per_node = options.nproc_per_node
    world_size = options.world_size or (per_node or 1) * options.nnodes
    gpu = None if options.gpu_memory_gb is None else int(options.gpu_memory_gb * GB)
    try:
        plan = plan_memory(train_args, world_size, min(per_node or world_size, world_size), gpu)
    except OSError as e:  # a file the policy's processors read (a gated tokenizer, ...)
        raise ConfigError(f"cannot plan without what the policy reads at build time: {e}") from e
    print(json.dumps(plan.to_json(), indent=2) if options.json else plan.describe())
    return 1 if plan.fits is False else 0


@dataclass
class ResumeArgsOptions:
    """Print --resume=true when --output_dir holds a usable checkpoint (the resume resolver's
    first step: sizes only, no file is read): lerobot-train then resumes from the newest one
    that verifies, and its flags (the pipeline's config, nulls included) decide everything else;
    the saved train_config.json is not read back."""

    output_dir: str = required()  # lerobot-train's --output_dir


def cmd_resume_args(options: ResumeArgsOptions, _: list[str]) -> int:
    from lerobot_pipe.checkpoint import resume

    point = resume.locate(options.output_dir)
    if point is None:
        log.info("no complete checkpoint in %s: training starts fresh", options.output_dir)
        return 0
    log.info("resuming from %s (step %d)", point.step_dir, point.step)
    print("--resume=true")
    return 0


@dataclass
class LaunchTrainOptions:
    """The pipeline's train job (lerobot_pipe/pipeline/train_job.py): torchrun (srun + torchrun
    under SLURM) resuming from the newest complete checkpoint, its progress on the terminal,
    stopped when snakemake goes."""

    nproc_per_node: int = 1  # processes per node
    nnodes: int = 1  # nodes (more than one: inside a SLURM allocation)
    rdzv_port: int = 29500  # rendezvous port on the first node (several nodes)
    cpus_per_task: int = 1  # CPUs per process (OMP_NUM_THREADS of each)
    log: str = required()  # the job's log: the trainer's whole output
    final_checkpoint: str | None = None  # copy the final checkpoint's training_step.json here
    history: str | None = None  # the run's whole log (default: <log>-history), --log links to it
    steps_from: str | None = None  # read --steps from this resolved config (validate's JSON)
    receipt: str | None = None  # a training segment's receipt (JSON) to write at its end
    pin_pending: bool = False  # pin the checkpoints it will save (reason pending)


def cmd_launch_train(options: LaunchTrainOptions, train_args: list[str]) -> int:
    from lerobot_pipe.pipeline.train_job import launch_train

    final = options.final_checkpoint
    return launch_train(
        train_args,
        log_path=Path(options.log),
        final_checkpoint=Path(final) if final else None,
        nproc_per_node=options.nproc_per_node,
        nnodes=options.nnodes,
        rdzv_port=options.rdzv_port,
        cpus_per_task=options.cpus_per_task,
        history=Path(options.history) if options.history else None,
        steps_from=Path(options.steps_from) if options.steps_from else None,
        receipt=Path(options.receipt) if options.receipt else None,
        pin_pending=options.pin_pending,
    )


@dataclass
class FinalCheckpointOptions:
    """The pipeline's train job after its training segments: the last segment's checkpoint
    record (its training_step.json) written to --output, and --log linked to the run's log."""

    receipt: str = required()  # the last training segment's receipt (segments/<step>.json)
    output: str = required()  # final_checkpoint.json to write
    log: str = required()  # the job's log, made a link to --history
    history: str = required()  # the run's whole training log


def cmd_final_checkpoint(options: FinalCheckpointOptions, _: list[str]) -> int:
    import json

    from lerobot_pipe.fsutil import write_json_atomic
    from lerobot_pipe.pipeline.train_job import link_to_history

    link_to_history(Path(options.log), Path(options.history))
    receipt = json.loads(Path(options.receipt).read_text())
    if receipt["training_step"] is None:
        raise FileNotFoundError(
            f"{options.receipt}: its checkpoint {receipt['checkpoint']} is gone"
        )
    write_json_atomic(Path(options.output), receipt["training_step"])
    log.info("final checkpoint: %s", receipt["checkpoint"])
    return 0


@dataclass
class CheckRunLockOptions:
    """Exit 0 when no trainer holds --output_dir, else fail naming the one that does."""

    output_dir: str = required()  # lerobot-train's --output_dir


def cmd_check_run_lock(options: CheckRunLockOptions, _: list[str]) -> int:
    from lerobot_pipe.training.run_lock import check_run_lock

    check_run_lock(options.output_dir)
    log.info("no trainer holds %s", options.output_dir)
    return 0


@dataclass
class PublishOptions:
    """Publish a checkpoint's pretrained_model/ to the Hub (the final one to the repo root, an
    intermediate one under checkpoints/<step>/, tagged step-<step>), then write the receipt."""

    pretrained_dir: str = required()  # the step folder or its pretrained_model/
    repo_id: str = required()  # Hub model repo (namespace/name)
    step: int = required()  # the checkpoint's step
    intermediate: bool = False  # publish under checkpoints/<step>/, not at the repo root
    private: bool | None = None  # create the repo private (default: the Hub's default)
    endpoint: str | None = None  # Hub endpoint (default: HF_ENDPOINT, else huggingface.co)
    receipt: str | None = None  # write the commit's receipt (JSON) here


def cmd_publish(options: PublishOptions, _: list[str]) -> int:
    from lerobot_pipe.hub.publish import publish_checkpoint

    receipt = publish_checkpoint(
        Path(options.pretrained_dir),
        options.repo_id,
        intermediate=options.intermediate,
        step=options.step,
        private=options.private,
        endpoint=options.endpoint,
    )
    if options.receipt:
        receipt.write(Path(options.receipt))
    log.info("published %s to %s at %s", options.pretrained_dir, receipt.repo_id, receipt.commit_id)
    return 0


@dataclass
class PublishBestOptions:
    """Publish the checkpoint a best.json names (the best evaluated so far, while training goes on)
    to the repo root, as the final one is, then write the receipt with that step: each new best
    re-published; the same best again makes no commit."""

    best: str = required()  # eval/best.json
    converted_dir: str = required()  # the folder holding <step>/pretrained_model/ (converted/)
    repo_id: str = required()  # Hub model repo (namespace/name)
    private: bool | None = None  # create the repo private (default: the Hub's default)
    endpoint: str | None = None  # Hub endpoint (default: HF_ENDPOINT, else huggingface.co)
    receipt: str | None = None  # write the commit's receipt (JSON, with "best_step") here


def cmd_publish_best(options: PublishBestOptions, _: list[str]) -> int:
    from lerobot_pipe.constants import PRETRAINED_MODEL_DIR
    from lerobot_pipe.evaluation.best import read_best
    from lerobot_pipe.fsutil import write_json_atomic
    from lerobot_pipe.hub.publish import publish_checkpoint

    step = read_best(options.best)["step"]
    receipt = publish_checkpoint(
        Path(options.converted_dir, step, PRETRAINED_MODEL_DIR),
        options.repo_id,
        intermediate=False,
        step=int(step),
        private=options.private,
        endpoint=options.endpoint,
    )
    if options.receipt:
        write_json_atomic(Path(options.receipt), {"best_step": step, **receipt.to_json()})
    log.info(
        "published the best so far, %s, to %s at %s (%s)",
        step,
        receipt.repo_id,
        receipt.commit_id,
        "a new commit" if receipt.created_commit else "unchanged",
    )
    return 0


@dataclass
class EvaluateOptions:
    """Evaluate one checkpoint with lerobot-eval (its library path, here), the checkpoint pinned
    against retention meanwhile; eval_info.json is written last, atomically."""

    checkpoint_dir: str = required()  # the step folder (<output_dir>/checkpoints/<step>) to pin
    output_dir: str = required()  # lerobot-eval's --output_dir: eval_info.json and videos/
    # then update this best.json from every evaluation beside this one, and unpin `pending`
    update_best: str | None = None
    unpin_pending: bool = False  # then remove the checkpoint's pending pin


def cmd_evaluate(options: EvaluateOptions, eval_args: list[str]) -> int:
    from lerobot_pipe.configs.parser import ConfigError
    from lerobot_pipe.evaluation.eval_policy import BadInput
    from lerobot_pipe.pipeline.config import with_eval_config_keys
    from lerobot_pipe.pipeline.evaluate_job import evaluate_checkpoint, evaluated

    try:
        evaluate_checkpoint(options.checkpoint_dir, options.output_dir, eval_args)
    except (BadInput, ConfigError) as e:
        report_error(f"{PROG} eval-checkpoint", with_eval_config_keys(str(e)))
        return 2
    if options.update_best or options.unpin_pending:
        evaluated(options.checkpoint_dir, options.update_best, options.unpin_pending)
    return 0


@dataclass
class ChooseBestOptions:
    """Choose a run's best checkpoint from its eval_info.json files (success rate, then mean max
    reward, then mean sum reward, then the later step), write best.json and move the checkpoint's
    `best` pin to it, so that retention keeps it."""

    eval_infos: list[str] = required()  # eval/<step>/eval_info.json of each evaluated step
    output: str = required()  # best.json to write
    train_dir: str | None = None  # lerobot-train's --output_dir whose checkpoint to pin


def cmd_choose_best(options: ChooseBestOptions, _: list[str]) -> int:
    from lerobot_pipe.checkpoint.pins import move_pin
    from lerobot_pipe.evaluation.best import best_record, write_best

    record = best_record({Path(p).parent.name: p for p in options.eval_infos})
    if options.train_dir:
        move_pin(options.train_dir, "best", [record["step"]])
    write_best(options.output, record)
    log.info(
        "best checkpoint: %s (%.1f %% success, avg max reward %.4f, avg sum reward %.4f)",
        record["step"],
        record["pc_success"],
        record["avg_max_reward"],
        record["avg_sum_reward"],
    )
    return 0


@dataclass
class PinOptions:
    """Pin a checkpoint against retention (--checkpoint_keep_last) for a reason: best, evaluate,
    publish or pending."""

    output_dir: str = required()  # lerobot-train's --output_dir
    step: str = required()  # the checkpoint's step folder name, e.g. 000020
    reason: str = required()  # best, evaluate, publish or pending


def cmd_pin(options: PinOptions, _: list[str]) -> int:
    from lerobot_pipe.checkpoint.pins import pin

    pin(options.output_dir, options.step, options.reason)
    return 0


@dataclass
class UnpinOptions(PinOptions):
    """Remove a checkpoint's pin (one a job killed hard left behind): retention may then delete
    the checkpoint again."""


def cmd_unpin(options: UnpinOptions, _: list[str]) -> int:
    from lerobot_pipe.checkpoint.pins import unpin

    unpin(options.output_dir, options.step, options.reason)
    return 0


@dataclass(frozen=True)
class Command:
    options: type
    run: Callable[..., int]
    # Flags that are not its options go on to lerobot-train, and its errors name config keys.
    passes_on: bool = False
    # Flags that are not its options go on to lerobot-eval (the command names config keys).
    passes_to_eval: bool = False


# Our lerobot-train, lerobot-eval and lerobot-convert-dcp, and the report (snakemake's own
# arguments): name -> (module with main(argv), what).
DELEGATED: dict[str, tuple[str, str]] = {
    "train": ("lerobot_pipe.scripts.train", "lerobot-train: train a policy, on 1 process or many"),
    "eval": ("lerobot_pipe.scripts.eval", "lerobot-eval: roll a trained policy out in simulation"),
    "convert-dcp": (
        "lerobot_pipe.scripts.convert_dcp",
        "lerobot-convert-dcp: merge a checkpoint's DCP shards into safetensors",
    ),
    "report": (
        "lerobot_pipe.scripts.report",
        "the run's HTML report (make report), also while it trains or after it failed",
    ),
}

COMMANDS: dict[str, Command] = {
    "make-dataset": Command(MakeDatasetOptions, cmd_make_dataset),
    "validate": Command(ValidateOptions, cmd_validate, passes_on=True),
    "plan-memory": Command(PlanMemoryOptions, cmd_plan_memory, passes_on=True),
    "resume-args": Command(ResumeArgsOptions, cmd_resume_args),
    "launch-train": Command(LaunchTrainOptions, cmd_launch_train, passes_on=True),
    "finish-train": Command(FinalCheckpointOptions, cmd_final_checkpoint),
    "check-run-lock": Command(CheckRunLockOptions, cmd_check_run_lock),
    "publish": Command(PublishOptions, cmd_publish),
    "publish-best": Command(PublishBestOptions, cmd_publish_best),
    "eval-checkpoint": Command(EvaluateOptions, cmd_evaluate, passes_to_eval=True),
    "choose-best": Command(ChooseBestOptions, cmd_choose_best),
    "pin": Command(PinOptions, cmd_pin),
    "unpin": Command(UnpinOptions, cmd_unpin),
}


def overview() -> str:
    lines = [f"usage: {PROG} <command> [--flag=value ...]", "", "Commands:"]
    what = {name: text for name, (_, text) in DELEGATED.items()}
    what |= {name: summary(command.options) for name, command in COMMANDS.items()}
    for name, text in what.items():
        text = f"  {name:<16}{text}"
        lines += textwrap.wrap(text, 100, subsequent_indent=" " * 18, break_on_hyphens=False)
    lines += ["", f"{PROG} <command> --help lists the flags of one."]
    return "\n".join(lines)


def command_usage(name: str) -> str:
    command = COMMANDS[name]
    usage = f"{PROG} {name} [--flag=value ...]"
    if command.passes_on:
        usage += " <lerobot-train flags>"
    if command.passes_to_eval:
        usage += " <lerobot-eval flags>"
        return command_help(usage, command.options, PASSES_TO_EVAL)
    return command_help(usage, command.options, PASSES_ON if command.passes_on else "")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    setup_logging()
    if not argv or argv[0] in ("-h", "--help"):
        print(overview(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    if name in DELEGATED:
        return importlib.import_module(DELEGATED[name][0]).main(args)
    if name not in COMMANDS:
        import difflib

        names = [*DELEGATED, *COMMANDS]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        report_error(PROG, f"unknown command {name!r}.{hint} Commands: {', '.join(names)}")
        return 2
    if any(a in ("-h", "--help") for a in args):
        print(command_usage(name))
        return 0
    from lerobot_pipe.pipeline.config import with_config_keys
    from lerobot_pipe.training.run_lock import RunLockError

    command = COMMANDS[name]
    try:
        options, rest = parse_options(
            command.options, args, others=command.passes_on or command.passes_to_eval
        )
    except ConfigError as e:
        report_error(f"{PROG} {name}", e)
        return 2
    try:
        return command.run(options, rest)
    except Exception as e:
        # Imported only now: it brings torch, which the small commands (check-run-lock, the
        # resume resolver) do not need.
        from lerobot_pipe.training.preflight import USER_ERRORS

        if not isinstance(e, (*USER_ERRORS, ValueError, FileNotFoundError)):
            raise
        # validate and launch-train check lerobot-train's flags, the pipeline's config: name
        # its keys too.
        message = with_config_keys(str(e)) if command.passes_on else str(e)
        report_error(f"{PROG} {name}", message)
        return 2 if isinstance(e, ConfigError | RunLockError) else 1


if __name__ == "__main__":
    sys.exit(main())
