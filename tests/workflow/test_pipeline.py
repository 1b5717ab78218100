"""The pipeline end to end, as users run it: `snakemake --cores 2` on the default config, reruns
after a kill, a new topology with more steps, partial reruns and publishing."""

from __future__ import annotations

import json

import pytest
import torch
from snakemake_runs import RUN, TRAIN_DIR, Workspace

from lerobot_pipe.constants import (
    ENV_FAULT_POINT,
    MODEL_DCP_DIR,
    MODEL_SAFETENSORS,
    PRETRAINED_MODEL_DIR,
    TMP_CHECKPOINT_PREFIX,
    TRAIN_CONFIG_NAME,
)

pytestmark = pytest.mark.slow

DEFAULT_STEPS = ["000100", "000200", "000300"]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"


def test_default_config_runs_end_to_end(default_run):
    result = default_run.first_result
    assert result.jobs() == {
        "dataset": 1,
        "validate": 1,
        # Training in 3 segments (one per checkpoint), then the job that records the final one.
        "train_segment": 3,
        "train": 1,
        "convert": 3,
        "evaluate": 3,
        "best": 1,
        "plot_training": 1,
        "plot_eval": 1,
        "checkpoint_table": 1,
        "all": 1,
    }
    assert "Publishing is off" in result.output
    assert default_run.complete_checkpoints() == DEFAULT_STEPS
    assert default_run.converted_steps() == DEFAULT_STEPS
    final = default_run.final_checkpoint()
    assert final["step"] == 300 and final["world_size"] == 2
    assert "torchrun --standalone" in default_run.path(f"{RUN}/logs/train.log").read_text()
    assert not default_run.path(f"{RUN}/published").exists()
    for figure in ("loss.svg", "eval.svg", "throughput.svg", "checkpoints.html"):
        assert default_run.path(f"{RUN}/report/{figure}").stat().st_size > 0


def test_second_run_has_nothing_to_do(default_run):
    result = default_run.run_ok("--cores", "2")
    assert "Nothing to be done" in result.output
    assert result.jobs() == {}
    assert result.seconds < 20


def test_report_has_the_figures_and_the_checkpoint_table(default_run, tmp_path):
    run = default_run.clone(tmp_path / "repo")
    run.run_ok(
        "--report", f"{RUN}/report.html", "--report-metadata", "workflow/report/metadata.yaml"
    )
    report = run.path(f"{RUN}/report.html").read_text()
    for name in ("loss.svg", "eval.svg", "throughput.svg", "checkpoints.html"):
        assert name in report


def test_killed_training_resumes_to_the_same_weights(default_run, tmp_path):
    """As one unbroken train job (the default's segments: test_flow_pipeline.py's kills), killed
    and interrupted: it ends on the weights of the default run, which trained in segments."""
    workspace = Workspace.fresh(tmp_path / "repo")
    unbroken = workspace.write_config("unbroken.yaml", {"launch": {"segment_steps": 0}})
    # The target convert_all stops after conversion: no report figures, no table.
    command = ("--cores", "2", "convert_all", "--configfile", "config/config.yaml", unbroken)
    # SIGKILL a training process while it saves step 200: step 100 is complete, step 200 is not.
    killed = workspace.snakemake(*command, env={ENV_FAULT_POINT: "save:before_rename@200"})
    assert killed.returncode != 0
    assert workspace.complete_checkpoints() == ["000100"]
    assert workspace.path(f"{TRAIN_DIR}/checkpoints/{TMP_CHECKPOINT_PREFIX}000200").exists()
    assert workspace.converted_steps() == []

    # The same command resumes from step 100; Ctrl-C once it has saved step 200.
    step_200 = f"{TRAIN_DIR}/checkpoints/000200/training_state/training_step.json"
    interrupted = workspace.snakemake(*command, interrupt_when=step_200)
    assert interrupted.returncode != 0
    assert "checkpoints/000100 (step 100)" in workspace.path(f"{RUN}/logs/train.log").read_text()
    assert workspace.complete_checkpoints() == ["000100", "000200"]
    assert not workspace.path(f"{RUN}/final_checkpoint.json").exists()

    # And again: no --rerun-incomplete, no --unlock.
    rerun = workspace.run_ok(*command)
    assert rerun.jobs() == {"train": 1, "convert": 3, "convert_all": 1}
    assert "checkpoints/000200 (step 200)" in workspace.path(f"{RUN}/logs/train.log").read_text()
    assert workspace.complete_checkpoints() == DEFAULT_STEPS
    assert workspace.converted_steps() == DEFAULT_STEPS
    assert not workspace.path(f"{RUN}/report").exists()
    assert_same_weights(
        workspace.converted_weights("000300"), default_run.converted_weights("000300")
    )


def test_changing_the_process_count_either_way_resumes_resharded(default_run, tmp_path):
    """2 -> 1 -> 2 processes, more steps each time and no other edit: each run resumes the other
    topology's checkpoint. The single process writes model.safetensors though the config says
    dcp (and its saved config still does); sharded again, the run writes DCP shards. Only the
    new steps are converted."""
    run = default_run.clone(tmp_path / "repo")
    converted_before = run.mtimes(f"{RUN}/converted/*/{PRETRAINED_MODEL_DIR}/*")
    train_log = run.path(f"{RUN}/logs/train.log")
    for nproc, steps, resumed_from in ((1, 310, 300), (2, 320, 310)):
        logged = len(train_log.read_text())  # every attempt appends to the same log
        override = run.write_config(
            f"nproc{nproc}.yaml", {"launch": {"nproc_per_node": nproc}, "train": {"steps": steps}}
        )
        result = run.run_ok("--cores", "2", "--configfile", "config/config.yaml", override)
        assert (result.jobs()["train"], result.jobs()["convert"]) == (1, 1)
        assert f"step=000{steps}" in result.output
        attempt = train_log.read_text()[logged:]
        assert f"checkpoints/000{resumed_from} (step {resumed_from})" in attempt
        assert "resharded" in attempt
        final = run.final_checkpoint()
        assert final["step"] == steps and final["world_size"] == nproc
    single, sharded = (
        run.path(f"{TRAIN_DIR}/checkpoints/{step}/{PRETRAINED_MODEL_DIR}")
        for step in ("000310", "000320")
    )
    assert (single / MODEL_SAFETENSORS).is_file()
    assert json.loads((single / TRAIN_CONFIG_NAME).read_text())["checkpoint_format"] == "dcp"
    assert (sharded / MODEL_DCP_DIR).is_dir() and not (sharded / MODEL_SAFETENSORS).exists()
    assert run.converted_steps() == [*DEFAULT_STEPS, "000310", "000320"]
    converted_after = run.mtimes(f"{RUN}/converted/*/{PRETRAINED_MODEL_DIR}/*")
    assert {path: converted_after[path] for path in converted_before} == converted_before


def test_rerun_convert_does_not_train(default_run, tmp_path):
    run = default_run.clone(tmp_path / "repo")
    training_before = run.training_files_mtimes()
    result = run.run_ok("--cores", "2", "-R", "convert")
    # ... and what depends on the converted policies: their evaluation.
    assert result.jobs() == {
        "convert": 3,
        "evaluate": 3,
        "best": 1,
        "plot_eval": 1,
        "checkpoint_table": 1,
        "all": 1,
    }
    assert run.training_files_mtimes() == training_before
    assert run.converted_steps() == DEFAULT_STEPS


def test_publish_to_the_hub_and_rerun_publish_only(default_run, hub_server, tmp_path):
    run = default_run.clone(tmp_path / "repo")
    repo_id = "alice/tiny-act"
    hub = ["--config", f"hub_repo_id={repo_id}", f"hub_endpoint={hub_server.url}"]
    training_before = run.training_files_mtimes()
    converted_before = run.mtimes(f"{RUN}/converted/*/pretrained_model/*")

    result = run.run_ok("--cores", "2", *hub, env=hub_server.env())
    assert result.jobs() == {"publish": 1, "checkpoint_table": 1, "all": 1}
    assert "Publishing is off" not in result.output
    receipt = json.loads(run.path(f"{RUN}/published/000300.json").read_text())
    assert receipt["repo_id"] == repo_id
    files = hub_server.list_files(repo_id)
    assert "model.safetensors" in files and "config.json" in files
    commits = hub_server.commit_count(repo_id)

    rerun = run.run_ok("--cores", "2", "-R", "publish", *hub, env=hub_server.env())
    assert rerun.jobs() == {"publish": 1, "checkpoint_table": 1, "all": 1}
    assert (
        json.loads(run.path(f"{RUN}/published/000300.json").read_text())["commit_id"]
        == (receipt["commit_id"])
    )
    # Unchanged files make no new commit; neither training nor conversion ran again.
    assert hub_server.commit_count(repo_id) == commits
    assert run.training_files_mtimes() == training_before
    assert run.mtimes(f"{RUN}/converted/*/pretrained_model/*") == converted_before


def test_bad_config_fails_in_validate_before_training(tmp_path):
    workspace = Workspace.fresh(tmp_path / "repo")
    # 3 shards cannot divide 2 processes: lerobot-train's own topology check refuses it.
    override = workspace.write_config("bad.yaml", {"train": {"parallelism": {"dp_shard": 3}}})
    result = workspace.snakemake("--cores", "2", "--configfile", "config/config.yaml", override)
    assert result.returncode != 0
    assert "Error in rule validate" in result.output
    assert "dp_shard" in result.output  # lerobot-train's message, on the console
    assert "[config: train.parallelism.dp_shard, launch.nproc_per_node x launch.nnodes]" in (
        result.output
    )  # ... naming the config keys
    assert "train" not in result.jobs()
    assert not workspace.path(TRAIN_DIR).exists()
    assert not workspace.path(f"{RUN}/logs/train.log").exists()


def test_ema_policy_is_converted_and_published(tmp_path, hub_server):  # noqa: F811
    """train.ema: every checkpoint's pretrained_model_ema/ (DCP shards under the default FSDP2)
    is converted beside the policy and published to <hub_repo_id>-ema."""
    workspace = Workspace.fresh(tmp_path / "repo")
    override = workspace.write_config(
        "ema.yaml", {"train": {"steps": 4, "save_freq": 4, "ema": {"enable": True}}}
    )
    repo_id = "alice/tiny-act"
    hub = ["--config", f"hub_repo_id={repo_id}", f"hub_endpoint={hub_server.url}"]
    result = workspace.snakemake(
        "--cores", "2", "--configfile", "config/config.yaml", override, *hub, env=hub_server.env()
    )
    assert result.returncode == 0, result.output[-3000:]
    converted = workspace.path(f"{RUN}/converted/000004")
    ema = converted / "pretrained_model_ema/model.safetensors"
    assert ema.is_file() and (converted / "pretrained_model/model.safetensors").is_file()
    assert not (converted / "pretrained_model_ema/pytorch_model_fsdp_0").exists()
    assert hub_server.read_file(f"{repo_id}-ema", "model.safetensors") == ema.read_bytes()
    receipt = json.loads(workspace.path(f"{RUN}/published/000004.json").read_text())
    assert receipt["ema"]["repo_id"] == f"{repo_id}-ema"
