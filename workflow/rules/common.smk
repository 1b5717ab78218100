# Paths, the lerobot-train flags of the run, and the checkpoint steps training produced.
import json
import os
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from lerobot_pipe.checkpoint.layout import list_complete_checkpoints, step_folder_name
from lerobot_pipe.constants import (
    CHECKPOINTS_DIR,
    LAST_CHECKPOINT_LINK,
    PRETRAINED_MODEL_DIR,
    PRETRAINED_MODEL_EMA_DIR,
    TRAINING_STATE_DIR,
    TRAINING_STEP,
)

RUN = config["run"]
RESULTS = f"results/{RUN}"
SYNTHETIC_DATASET = f"{RESULTS}/dataset"
# lerobot-train's --output_dir. Never a declared output: Snakemake deletes the
# declared outputs of a failed job and of a job it reruns; these are the checkpoints.
TRAIN_DIR = f"{RESULTS}/train"
STEP_DIR = f"{TRAIN_DIR}/{CHECKPOINTS_DIR}/{{step}}"
# Written last into a step folder: its presence marks a complete checkpoint.
STEP_FILE = f"{STEP_DIR}/{TRAINING_STATE_DIR}/{TRAINING_STEP}"
METRICS = f"{TRAIN_DIR}/metrics.jsonl"
# The report's figures and table from what exists now (report_now: a report during a run).
REPORT_NOW = f"{RESULTS}/report/now"

USE_SYNTHETIC_DATASET = not (config["dataset"]["root"] or config["dataset"]["repo_id"])
PUBLISHING = bool(config["hub_repo_id"])
# Evaluation of each checkpoint (eval.env set): eval/<step>/eval_info.json, eval/best.json.
EVALUATING = bool(config["eval"]["env"])
EVAL_DIR = f"{RESULTS}/eval"
BEST = f"{EVAL_DIR}/best.json"
if config["publish"]["steps"] == "best" and not EVALUATING:
    raise WorkflowError(
        "config key publish.steps: best needs evaluation: set eval.env "
        "(e.g. eval: {env: {type: synthetic}}; config/README.md)"
    )
WORLD_SIZE = config["launch"]["nnodes"] * config["launch"]["nproc_per_node"]
TOTAL_STEPS = config["train"]["steps"]


def segment_size():
    """Steps per training segment (launch.segment_steps; null: train.save_freq); 0: one
    unbroken train job."""
    size = config["launch"]["segment_steps"]
    if size is None:
        saving = config["train"].get("save_checkpoint", True)
        size = config["train"].get("save_freq", 0) if saving else 0
    return size if size < TOTAL_STEPS else 0


# Training split at checkpoint boundaries into jobs that resume exactly (train_segment): the
# checkpoint each one ends with is converted, evaluated and published while the next trains.
SEGMENTED = segment_size() > 0
# A segment's receipt: results/<run>/segments/<step folder>.json, written when it ends.
SEGMENT = f"{RESULTS}/segments/{{step}}.json"
# The whole training log of the run; each segment's log and train.log link to it.
TRAIN_HISTORY = f"{RESULTS}/logs/train-history.log"


def segment_ends():
    """The steps the segments end at, ascending, train.steps last: the same for a segment
    when train.steps grows (a longer run adds segments)."""
    size = segment_size()
    return [*range(size, TOTAL_STEPS, size), TOTAL_STEPS] if size else [TOTAL_STEPS]


def step_name(step):
    return step_folder_name(step, TOTAL_STEPS)


FLOW_STEPS = [step_name(end) for end in segment_ends()] if SEGMENTED else []

# A safe --unlock: lerobot-pipe check-run-lock fails while a trainer still holds the run.
UNLOCK_COMMAND = (
    f"lerobot-pipe check-run-lock --output_dir={TRAIN_DIR} && snakemake --unlock"
)

if workflow.is_main_process:
    if not PUBLISHING:
        logger.info(
            "Publishing is off: the pipeline stops after "
            + ("conversion and evaluation. " if EVALUATING else "conversion. ")
            + "Switch it on with --config hub_repo_id=<user>/<repo>."
        )
    if "--unlock" not in sys.argv and any(Path(".snakemake/locks").glob("*")):
        logger.warning(
            "A Snakemake lock is in .snakemake/locks. If Snakemake stops because the "
            "directory cannot be locked and no other snakemake runs here (one was killed "
            f"hard), run `make unlock` or `{UNLOCK_COMMAND}`, then this command again."
        )


wildcard_constraints:
    step=r"\d+",


def _flag_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def dotted_flags(mapping, prefix=""):
    """Nested config keys as lerobot-train flags: {"policy": {"type": "act"}} gives
    --policy.type=act.

    Keys set to null are passed as --key=null: lerobot-train's default, also on a resume
    (the config is the whole truth, not the checkpoint's saved train_config.json).
    """
    for key, value in mapping.items():
        if isinstance(value, dict):
            yield from dotted_flags(value, f"{prefix}{key}.")
        else:
            yield f"--{prefix}{key}={'null' if value is None else _flag_value(value)}"


def dataset_flags():
    if USE_SYNTHETIC_DATASET:
        flags = {"root": SYNTHETIC_DATASET, "repo_id": None, "revision": None}
    else:
        flags = {key: config["dataset"][key] for key in ("root", "repo_id", "revision")}
    # Passed only when set, so that the flags (and params) of a run without it stay as they were.
    if config["dataset"].get("eval_split"):
        flags["eval_split"] = config["dataset"]["eval_split"]
    # Streaming: lerobot-train reads repo_id from the Hub as it trains (no dataset job, no
    # download); a cache size only when set.
    if config["dataset"].get("streaming"):
        flags["streaming"] = True
        if config["dataset"].get("streaming_cache_mb"):
            flags["streaming_cache_mb"] = config["dataset"]["streaming_cache_mb"]
    return flags


def train_flags():
    """The run's lerobot-train flags, resume flags aside.

    validate and train both use them, so validate checks exactly what train launches.
    """
    flags = {
        **config["train"],
        "dataset": dataset_flags(),
        "output_dir": TRAIN_DIR,
        "job_name": RUN,
    }
    return list(dotted_flags(flags))


def memory_flags():
    """lerobot-pipe validate's memory-plan flags: the GPU's size (slurm.gpu_memory_gb, when set),
    the node's host memory (slurm.mem_mb) and GPUs (slurm.gpus_per_node)."""
    slurm = config["slurm"]
    flags = [f"--mem_mb={slurm['mem_mb']}", f"--gpus_per_node={slurm['gpus_per_node']}"]
    if slurm.get("gpu_memory_gb"):
        flags.append(f"--gpu_memory_gb={slurm['gpu_memory_gb']}")
    return flags


def flag_params(*flags):
    """Command-line flags as a rule's params, one named param per flag, each quoted for the
    shell: `{params}` is the whole argument list, `{params.output_dir}` one flag.

    One param per flag because Snakemake compares params value by value: after a config change
    its "Params have changed" reason then names the flags that changed (before: '--steps=60'
    now: '--steps=80'), where a single param holding every flag printed the whole list twice.
    """
    return {
        flag.split("=", 1)[0].removeprefix("--").replace(".", "__"): shlex.quote(flag)
        for flag in flags
    }


def dataset_input(wildcards):
    return SYNTHETIC_DATASET if USE_SYNTHETIC_DATASET else []


def existing(pattern):
    """The paths that match ``pattern`` now, sorted (a report during a run: what has landed)."""
    return sorted(str(path) for path in Path().glob(pattern))


def evaluations_now(wildcards):
    """The eval_info.json files written so far (the *_now rules' params)."""
    return existing(f"{EVAL_DIR}/*/eval_info.json")


def best_now(wildcards):
    """best.json, once an evaluation (or the best job) has written it."""
    return BEST if Path(BEST).is_file() else None


def now_report(name, caption, category, labels):
    """A report file of the *_now rules (report.smk): in REPORT_NOW, with the same report()
    entry as the finished run's, so that the report looks the same. Their params list what
    exists when the job runs, files written last (eval_info.json, the renamed converted folder,
    a publish receipt), so none is half-written."""
    return report(
        f"{REPORT_NOW}/{name}",
        caption=caption,
        category=category,
        subcategory=RUN,
        labels={"run": RUN, **labels},
    )


def complete_steps():
    """Step folder names of the complete checkpoints, ascending: the library's listing,
    which resume and the launcher use too.

    Called behind checkpoints.train.get(), so it lists what the finished training left.
    An unfinished save has no training_step.json yet, or still its temporary name.
    """
    return [path.name for path in list_complete_checkpoints(TRAIN_DIR)]


def is_final_step(step):
    if (
        SEGMENTED
    ):  # known before training ends (the publish jobs of segments run meanwhile)
        return int(step) == TOTAL_STEPS
    return step == complete_steps()[-1]


def segment_of(step):
    """The receipt of the segment that saved checkpoint ``step`` (a step folder name): its own,
    when a segment ended there (also one of an earlier run with other steps, so that its
    conversion stays done), else the first segment that ends after it."""
    own = SEGMENT.format(step=step)
    if Path(own).is_file():
        return own
    ends = [end for end in segment_ends() if end >= int(step)]
    return SEGMENT.format(step=step_name(ends[0] if ends else TOTAL_STEPS))


def flow_converted(wildcards):
    """The conversions of the segments' checkpoints, known before training: each runs as soon
    as its segment ends."""
    return expand(rules.convert.output[0], step=FLOW_STEPS)


def flow_evaluated(wildcards):
    return expand(rules.evaluate.output[0], step=FLOW_STEPS)


def flow_published(wildcards):
    """publish.steps: all, every segment's checkpoint; final, the last one; best: after each
    segment's evaluation, the best so far (publish_best_so_far)."""
    if config["publish"]["steps"] == "best":
        return expand(rules.publish_best_so_far.output[0], step=FLOW_STEPS)
    steps = {"all": FLOW_STEPS, "final": FLOW_STEPS[-1:]}[config["publish"]["steps"]]
    return expand(rules.publish.output[0], step=steps)


def converted_steps(wildcards):
    checkpoints.train.get()
    return expand(rules.convert.output[0], step=complete_steps())


def eval_env():
    """eval.env; for the synthetic env on the synthetic dataset its cameras, image size and
    pixels_only default to the dataset's, so the policy gets the inputs it was trained on.
    """
    env = dict(config["eval"]["env"] or {})
    if env.get("type") == "synthetic" and USE_SYNTHETIC_DATASET:
        for key in ("cameras", "image_size", "pixels_only"):
            env.setdefault(key, config["dataset"]["synthetic"][key])
    return env


def eval_flags():
    """The evaluate rule's lerobot-eval flags (the policy path and output folder aside)."""
    settings = config["eval"]
    flags = {
        "env": eval_env(),
        "eval": {
            key: settings[key] for key in ("n_episodes", "batch_size", "use_async_envs")
        },
        "seed": settings["seed"],
    }
    if settings["device"]:
        flags["policy"] = {"device": settings["device"]}
    return list(dotted_flags(flags))


def check_eval_flags():
    """lerobot-eval's own parsing of the eval flags, when the workflow is read: a bad key or
    value fails before anything trains, naming the config key."""
    from lerobot_pipe.configs.parser import ConfigError, parse_options
    from lerobot_pipe.pipeline.config import with_eval_config_keys
    from lerobot_pipe.evaluation.eval_policy import EvalPipelineOptions

    try:
        parse_options(EvalPipelineOptions, eval_flags())
    except ConfigError as e:
        raise WorkflowError(f"lerobot-eval: {with_eval_config_keys(str(e))}") from None


if EVALUATING:
    check_eval_flags()


def evaluated_steps(wildcards):
    checkpoints.train.get()
    return expand(rules.evaluate.output[0], step=complete_steps())


def best_step():
    """The step folder name eval/best.json names (after the best checkpoint job ran)."""
    from lerobot_pipe.evaluation.best import read_best

    return read_best(checkpoints.best.get().output[0])["step"]


def published_main_step(step):
    """Whether ``step`` goes to the repository's main revision: the best one with
    publish.steps: best, else the final one."""
    if config["publish"]["steps"] == "best":
        return step == best_step()
    return is_final_step(step)


def published_steps(wildcards):
    if not PUBLISHING:
        raise WorkflowError(
            "Publishing is off: set the Hub repository with "
            "--config hub_repo_id=<user>/<repo> (or hub_repo_id in a config file)."
        )
    checkpoints.train.get()
    steps = complete_steps()
    if config["publish"]["steps"] == "final":
        steps = steps[-1:]
    elif config["publish"]["steps"] == "best":
        steps = [best_step()]
    return expand(rules.publish.output[0], step=steps)


def print_results():
    """Where a finished run's results are (the Snakefile's onsuccess)."""
    steps = complete_steps()
    last = Path(TRAIN_DIR, CHECKPOINTS_DIR, LAST_CHECKPOINT_LINK)
    lines = [f"Results of run {RUN!r}, in {RESULTS}/:"]
    if steps:
        link = f"; last -> {last.readlink()}" if last.is_symlink() else ""
        lines.append(
            f"  checkpoints  {TRAIN_DIR}/{CHECKPOINTS_DIR}/ ({', '.join(steps)}{link}; "
            f"{checkpoints_size()})"
        )
    converted = sorted(
        p.parent.name
        for p in Path(RESULTS, "converted").glob(f"*/{PRETRAINED_MODEL_DIR}")
    )
    if converted:
        lines.append(
            f"  policies     {RESULTS}/converted/<step>/{PRETRAINED_MODEL_DIR}/ "
            f"({', '.join(converted)}): load with --policy.path=<that folder>"
        )
    if Path(BEST).is_file():
        best = json.loads(Path(BEST).read_text())
        lines.append(
            f"  evaluation   {EVAL_DIR}/<step>/eval_info.json; best {best['step']} "
            f"({best['pc_success']:.0f} % success over {best['n_episodes']} episodes), "
            f"{BEST}"
        )
    published = sorted(p.stem for p in Path(RESULTS, "published").glob("*.json"))
    if published:
        lines.append(
            f"  published    {config['hub_repo_id']} ({', '.join(published)}), "
            f"receipts in {RESULTS}/published/"
        )
    lines += [
        f"  logs         {RESULTS}/logs/ (training: {RESULTS}/logs/train.log)",
        f"  report       `{report_command()}` writes {RESULTS}/report.html (loss, "
        "evaluation, throughput, checkpoint table)",
    ]
    logger.info("\n".join(lines))


def checkpoints_size():
    """Their size on disk, and the key that bounds it while it is unbounded."""
    folder = Path(TRAIN_DIR, CHECKPOINTS_DIR)
    size = sum(
        p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and not p.is_symlink()
    )
    text = f"{size / 1e6:,.0f} MB"
    if not config["train"].get("checkpoint_keep_last"):
        text += "; train.checkpoint_keep_last: N keeps only the newest N"
    return text


def report_command():
    """The command that writes this run's report into RESULTS (also while it trains): `make
    report` for the run of config/config.yaml alone, else lerobot-pipe report with this run's
    --configfile and --config.
    """
    configfiles = [
        os.path.relpath(path) for path in workflow.config_settings.configfiles
    ]
    overrides = list(workflow.config_settings.config_args or [])
    if not overrides and configfiles in ([], ["config/config.yaml"]):
        return "make report"
    args = ["--configfile", *configfiles] if configfiles else []
    args += ["--config", *overrides] if overrides else []
    return shlex.join(
        ["lerobot-pipe", "report", f"--output={RESULTS}/report.html", *args]
    )


def previous_segment(wildcards):
    """The receipt of the segment before (resume from its checkpoint); none for the first."""
    ends = [step_name(end) for end in segment_ends()]
    at = ends.index(wildcards.step)
    return SEGMENT.format(step=ends[at - 1]) if at else []


def convert_input(wildcards):
    return segment_of(wildcards.step) if SEGMENTED else STEP_FILE.format(**wildcards)


def unpin_pending(wildcards):
    """The command that removes the step's pending pin, where conversion is its last use."""
    if not SEGMENTED or EVALUATING:
        return "true"
    return (
        f"lerobot-pipe unpin --output_dir={TRAIN_DIR} --step={wildcards.step} "
        "--reason=pending"
    )


def train_resources():
    """sbatch resources of the train job; local runs use only threads."""
    slurm = config["slurm"]
    resources = {
        "nodes": config["launch"]["nnodes"],
        "tasks": WORLD_SIZE,
        # One task per training process, spread evenly over the nodes.
        "slurm_extra": f"--ntasks-per-node={config['launch']['nproc_per_node']}",
        "cpus_per_task": slurm["cpus_per_task"],
        "mem_mb": slurm["mem_mb"],
        "runtime": slurm["runtime"],
    }
    if WORLD_SIZE > 1:
        # The shell then runs in the batch step and starts one torchrun per node itself.
        resources["mpi"] = "srun"
    if slurm["gpus_per_node"]:
        resources["gres"] = f"gpu:{slurm['gpus_per_node']}"
        # Else the plugin passes --ntasks-per-gpu=<tasks>; no per-GPU task binding is
        # wanted: each node's torchrun gives its ranks the node's GPUs itself.
        resources["tasks_per_gpu"] = 0
    for key in ("partition", "account"):
        if slurm[key]:
            resources[f"slurm_{key}"] = slurm[key]
    return resources
