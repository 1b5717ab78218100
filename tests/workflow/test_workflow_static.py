"""The workflow without training: lint, dry runs, config validation, checkpoint discovery."""

from __future__ import annotations

import importlib.util
import json

import pytest
from snakemake_runs import REPO, RUN, TRAIN_DIR, Workspace

from lerobot_pipe.constants import (
    CHECKPOINTS_DIR,
    LAST_CHECKPOINT_LINK,
    PRETRAINED_MODEL_DIR,
    TMP_CHECKPOINT_PREFIX,
    TRAINING_STATE_DIR,
    TRAINING_STEP,
)


@pytest.fixture
def workspace(tmp_path) -> Workspace:
    return Workspace.fresh(tmp_path / "repo")


@pytest.fixture
def trained(workspace) -> Workspace:
    """A run as training leaves it, without training: steps 20 and 40 complete, 60 without its
    training_step.json (killed while saving), 80 still in its temporary folder. Trained as one
    unbroken job (launch.segment_steps: 0): the checkpoints are discovered after it."""
    config = workspace.path("config/config.yaml")
    config.write_text(config.read_text().replace("segment_steps: null", "segment_steps: 0"))
    checkpoints = workspace.path(f"{TRAIN_DIR}/{CHECKPOINTS_DIR}")
    for name, complete in [
        ("000020", True),
        ("000040", True),
        ("000060", False),
        (f"{TMP_CHECKPOINT_PREFIX}000080", True),
    ]:
        (checkpoints / name / PRETRAINED_MODEL_DIR).mkdir(parents=True)
        (checkpoints / name / TRAINING_STATE_DIR).mkdir()
        if complete:
            step = int(name[-6:])
            (checkpoints / name / TRAINING_STATE_DIR / TRAINING_STEP).write_text(
                json.dumps({"step": step})
            )
    (checkpoints / LAST_CHECKPOINT_LINK).symlink_to("000040")
    # The upstream outputs, oldest first, as a finished run leaves them.
    workspace.path(f"{RUN}/dataset").mkdir(parents=True)
    workspace.path(f"{RUN}/resolved_train_config.json").write_text("{}")
    workspace.path(f"{RUN}/final_checkpoint.json").write_text(json.dumps({"step": 40}))
    return workspace


def test_lint_is_clean(workspace):
    result = workspace.run_ok("--lint")
    assert "Congratulations" in result.output


def test_snakefmt_is_clean():
    """Snakefile and rules are formatted with snakefmt (it formats the shell blocks with shfmt)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    snakefmt = shutil.which("snakefmt") or str(Path(sys.executable).parent / "snakefmt")
    if not Path(snakefmt).exists():
        pytest.skip("snakefmt is not installed (it is in the dev extra)")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PATH": f"{Path(snakefmt).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [snakefmt, "--check", "Snakefile", "workflow/rules"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


# The jobs of a dry run of the default config (the stages up to the train checkpoint, and the
# jobs whose inputs only it will tell: the best checkpoint and its figure).
DRY_RUN_JOBS = (
    "dataset",
    "validate",
    "train",
    "plot_training",
    "best",
    "plot_eval",
    "checkpoint_table",
    "all",
)
# What a planned job is, besides its rule and shell command: not the jobid, the reason, nor the
# threads (Snakemake caps them at --cores, which a SLURM run does not set; no command uses them).
PLANNED = ("input", "output", "log", "wildcards")


def test_dry_run_plans_the_stages_before_the_checkpoint(workspace):
    """Training in segments (one per checkpoint, by default): the conversion and evaluation of
    every segment's checkpoint are planned from the start, each after its own segment."""
    result = workspace.run_ok("-n", "-p")
    segments = {"train_segment": 3, "convert": 3, "evaluate": 3}
    assert result.jobs() == {**dict.fromkeys(DRY_RUN_JOBS, 1), **segments}
    for job in result.planned_jobs():
        if job.rule == "train_segment":
            step = int(job.fields["wildcards"].removeprefix("step="))
            # Each stops at its end; its flags are those validate checked, the total steps its
            # resolved config's.
            assert f"--stop_after_step={step}" in job.shell and "--steps=" not in job.shell
            assert "train_flags" in job.shell and "--policy.type" not in job.shell
        if job.rule == "convert":
            assert job.fields["input"] == f"{RUN}/segments/{job.fields['wildcards'][5:]}.json"
    assert "Publishing is off" in result.output
    assert not workspace.path("results").exists()


def test_dry_run_with_a_dataset_root_generates_no_dataset(workspace, tmp_path):
    override = workspace.write_config(
        "override.yaml", {"dataset": {"root": str(tmp_path / "my_dataset")}}
    )
    result = workspace.run_ok("-n", "-p", "--configfile", "config/config.yaml", override)
    assert "dataset" not in result.jobs()
    assert f"--dataset.root={tmp_path / 'my_dataset'}" in result.output


def test_profiles_plan_the_same_jobs(workspace):
    """The local and the SLURM profile run the same jobs on the same files with the same
    commands; the SLURM profile only adds its default sbatch resources, never overrides what a
    rule asks for (a training segment's nodes, tasks, memory and runtime)."""
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        pytest.skip("the SLURM profile needs its executor plugin: make slurm-plugin")

    def plan(profile: str) -> dict[tuple, dict[str, str]]:
        result = workspace.run_ok("-n", "-p", "--profile", f"workflow/profiles/{profile}")
        return {
            (job.rule, job.kind, *(job.fields.get(k) for k in PLANNED), job.shell): job.resources
            for job in result.planned_jobs()
        }

    local, slurm = plan("local"), plan("slurm")
    # The default trains in segments: each one's checkpoint converted and evaluated beside them.
    assert {job[0] for job in local} == {*DRY_RUN_JOBS, "train_segment", "convert", "evaluate"}
    assert local.keys() == slurm.keys()
    for job, resources in local.items():
        assert resources.items() <= slurm[job].items(), job[0]
    train = next(resources for job, resources in local.items() if job[0] == "train_segment")
    assert {"nodes", "tasks", "mem_mb", "runtime"} <= train.keys()


def test_the_default_run_trains_the_tiny_act():
    """The embedded default's policy is the package's tiny ACT (ACT_TINY_PRESET), the "small"
    model of the benchmarks; only its camera backbone's settings and a learning rate are added."""
    import yaml

    from lerobot_pipe.policies.act import ACT_TINY_PRESET

    policy = yaml.safe_load((REPO / "config/config.yaml").read_text())["train"]["policy"]
    assert policy.pop("type") == "act"
    assert policy.pop("vision_backbone") == "resnet18"
    assert policy.pop("pretrained_backbone_weights") is None
    assert policy.pop("optimizer_lr") == 0.001
    assert policy == ACT_TINY_PRESET


def test_publishing_switched_on_from_the_command_line(workspace):
    result = workspace.run_ok("-n", "--config", "hub_repo_id=alice/tiny-act")
    assert "Publishing is off" not in result.output


@pytest.mark.parametrize(
    "override, complaint",
    [
        (
            {"no_such_key": 1},
            "unknown config key no_such_key; allowed here: run, dataset, launch, train, eval, slurm, "
            "publish, hub_repo_id, hub_endpoint",
        ),
        ({"launch": {"nprocs": 2}}, "unknown config key launch.nprocs; allowed here: nproc_per"),
        ({"launch": {"nproc_per_node": 0}}, "config key launch.nproc_per_node: 0 is less than"),
        ({"train": {"output_dir": "x"}}, "train.output_dir: the pipeline sets --output_dir"),
        ({"publish": {"steps": "some"}}, "config key publish.steps: 'some' is not one of"),
        ({"train": {"ema": {"decay": 2}}}, "config key train.ema.decay: 2 is greater than"),
        ({"train": {"ema": {"every": 2}}}, "unknown config key train.ema.every; allowed here"),
    ],
)
def test_config_schema_rejects_bad_keys(workspace, override, complaint):
    name = workspace.write_config("override.yaml", override)
    result = workspace.snakemake("-n", "--configfile", "config/config.yaml", name)
    assert result.returncode != 0
    assert complaint in result.output
    # One line naming the key, not Snakemake's dump of the schema and the config.
    assert "Failed validating" not in result.output and len(result.output.splitlines()) < 10


def test_the_held_out_split_is_passed_to_lerobot_train(workspace):
    override = workspace.write_config(
        "override.yaml", {"dataset": {"eval_split": 0.25}, "train": {"eval_steps": 10}}
    )
    result = workspace.run_ok("-n", "-p", "--configfile", "config/config.yaml", override)
    assert "--dataset.eval_split=0.25" in result.output and "--eval_steps=10" in result.output
    assert "--dataset.eval_split" not in workspace.run_ok("-n", "-p").output


def test_a_streamed_hub_dataset_has_no_dataset_job(workspace):
    override = workspace.write_config(
        "override.yaml",
        {"dataset": {"repo_id": "alice/big", "streaming": True, "streaming_cache_mb": 512}},
    )
    result = workspace.run_ok("-n", "-p", "--configfile", "config/config.yaml", override)
    assert "dataset" not in result.jobs()
    assert "--dataset.repo_id=alice/big" in result.output
    assert "--dataset.streaming=true --dataset.streaming_cache_mb=512" in result.output
    assert "--dataset.streaming" not in workspace.run_ok("-n", "-p").output


def test_null_keys_are_passed_to_lerobot_train(workspace):
    """null means lerobot-train's default on every run, also over a resumed checkpoint's
    saved value: the flag is passed, not left out."""
    result = workspace.run_ok("-n", "-p")
    assert "--parallelism.dp_replicate=null --parallelism.dp_shard=-1" in result.output
    assert "--dataset.repo_id=null --dataset.revision=null" in result.output


@pytest.mark.slow
def test_only_complete_checkpoints_are_converted(trained):
    result = trained.run_ok("-n", "convert_all")
    assert result.jobs() == {"convert": 2, "convert_all": 1}
    assert "step=000020" in result.output and "step=000040" in result.output
    assert "000060" not in result.output and "000080" not in result.output


def test_publish_all_without_a_repository_says_how_to_set_one(trained):
    result = trained.snakemake("-n", "publish_all")
    assert result.returncode != 0
    assert "hub_repo_id" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("steps, published", [("final", ["000040"]), ("all", ["000020", "000040"])])
def test_publish_selects_the_configured_steps(trained, steps, published):
    name = trained.write_config("override.yaml", {"publish": {"steps": steps}})
    result = trained.run_ok(
        "-n",
        "publish_all",
        "--configfile",
        "config/config.yaml",
        name,
        "--config",
        "hub_repo_id=alice/tiny-act",
    )
    assert result.jobs()["publish"] == len(published)
    for step in published:
        assert f"{RUN}/published/{step}.json" in result.output
