"""Checkpoints that flow (launch.segment_steps): training runs as segment jobs, and each
segment's checkpoint is converted and evaluated while the next segment trains; best.json follows
the evaluations; a kill inside a downstream job or inside training, then the same command
(after `snakemake --unlock` where a hard kill left Snakemake's lock), finishes what is missing
and redoes nothing that finished.

The embedded default on 1 training process, 90 steps, a checkpoint (and a segment) every 30,
`snakemake --cores 2`: training takes one core, the downstream jobs the other."""

from __future__ import annotations

import itertools
import json
import os
import signal
import time

import pytest
from conftest_hub import hub_server_module  # noqa: F401  (one Hub server for the flow run)
from snakemake_runs import RUN, TRAIN_DIR, Workspace

from lerobot_pipe.constants import CHECKPOINTS_DIR, ENV_FAULT_POINT, ENV_FAULT_WAIT, PINS_DIR

pytestmark = pytest.mark.slow

STEPS = ["000030", "000060", "000090"]
FLOW = {"launch": {"nproc_per_node": 1}, "train": {"steps": 90, "save_freq": 30}}
REPO_ID = "alice/flow-act"


def _command(workspace: Workspace, hub=None) -> tuple[str, ...]:
    """The flow run's snakemake arguments; with a Hub server, publish.steps: best to it."""
    config = FLOW
    if hub is not None:
        config = {**FLOW, "publish": {"steps": "best"}}
        config |= {"hub_repo_id": REPO_ID, "hub_endpoint": hub.url}
    flow = workspace.write_config("flow.yaml", config)
    return ("--cores", "2", "--configfile", "config/config.yaml", flow)


def _step_file(step: str) -> str:
    return f"{TRAIN_DIR}/{CHECKPOINTS_DIR}/{step}/training_state/training_step.json"


def _eval_info(step: str) -> str:
    return f"{RUN}/eval/{step}/eval_info.json"


def _pins(workspace: Workspace) -> list[str]:
    folder = workspace.path(f"{TRAIN_DIR}/{PINS_DIR}")
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".tmp"))


def _checkpoint_files(workspace: Workspace, steps: list[str]) -> dict[str, int]:
    """The mtimes of every file of these checkpoints."""
    return {
        path: mtime
        for step in steps
        for path, mtime in workspace.mtimes(f"{TRAIN_DIR}/{CHECKPOINTS_DIR}/{step}/**/*").items()
    }


def _wait_for(predicate, timeout: float, what: str) -> None:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def flow_run(tmp_path_factory, hub_server_module) -> Workspace:  # noqa: F811
    """The run, publishing the best so far to a local Hub (publish.steps: best); as soon as the
    first evaluation lands, `lerobot-pipe report` (make report's command) writes the report
    while training goes on (workspace.report_during_run). Training holds before saving its last
    checkpoint until the first checkpoint is published (ENV_FAULT_WAIT), so that "while training
    goes on" does not depend on how busy the machine is: were the downstream jobs to wait for
    training, the hold would run out (10 minutes) and the tests below fail."""
    workspace = Workspace.fresh(tmp_path_factory.mktemp("flow") / "repo")
    command = _command(workspace, hub_server_module)
    workspace.flow_command, workspace.hub = command, hub_server_module

    def report():
        # The run's own --configfile, as its summary prints the command.
        args = command[command.index("--configfile") :]
        workspace.report_was_final = workspace.path(f"{RUN}/final_checkpoint.json").exists()
        workspace.report_during_run = workspace.command(
            "lerobot-pipe", "report", f"--output={RUN}/report.html", *args
        )

    first_published = workspace.path(f"{RUN}/published/best_so_far/000030.json")
    env = {**hub_server_module.env(), ENV_FAULT_WAIT: f"save:begin@90={first_published}"}
    workspace.first_result = workspace.run_ok(
        *command, env=env, meanwhile=(_eval_info("000030"), report)
    )
    return workspace


def test_each_checkpoint_is_evaluated_while_training_goes_on(flow_run):
    jobs = flow_run.first_result.jobs()
    assert (jobs["train_segment"], jobs["train"]) == (3, 1)
    assert (jobs["convert"], jobs["evaluate"], jobs["best"]) == (3, 3, 1)
    assert (jobs["publish_best_so_far"], jobs["publish"]) == (3, 1)
    assert flow_run.complete_checkpoints() == STEPS
    # The first evaluation ends before training has written its last checkpoint.
    first_eval = flow_run.path(_eval_info("000030")).stat().st_mtime
    last_checkpoint = flow_run.path(_step_file("000090")).stat().st_mtime
    assert first_eval < last_checkpoint
    receipt = json.loads(flow_run.path(f"{RUN}/segments/000030.json").read_text())
    assert receipt["segment_end"] == 30 and receipt["training_step"]["step"] == 30
    assert flow_run.final_checkpoint()["step"] == 90
    # One schedule over the 90 steps: each segment resumed from the one before.
    history = flow_run.path(f"{RUN}/logs/train.log").read_text()
    assert "checkpoints/000030 (step 30)" in history and "checkpoints/000060 (step 60)" in history


def test_best_names_an_evaluated_step_and_no_pending_pin_stays(flow_run):
    best = json.loads(flow_run.path(f"{RUN}/eval/best.json").read_text())
    assert best["step"] in STEPS and flow_run.path(_eval_info(best["step"])).is_file()
    assert sorted(best["candidates"]) == STEPS
    # Evaluated: the pending pins are gone; the best one is pinned (the evaluate jobs moved the
    # pin as results landed, the best job once more).
    assert _pins(flow_run) == [f"{best['step']}.best"]


def test_the_report_during_the_run_shows_the_evaluations_that_exist(flow_run):
    """`snakemake --report` refuses the finished run's figures before they exist: the report
    written while training went on is made from what existed then (report_now)."""
    written = flow_run.report_during_run
    assert written.returncode == 0, written.stdout[-3000:]
    assert not flow_run.report_was_final  # the run had not ended when it began
    assert "writing the report of what exists now" in written.stdout
    report = flow_run.path(f"{RUN}/report.html").read_text()
    for name in ("loss.svg", "eval.svg", "throughput.svg", "checkpoints.html"):
        assert f"report/now/{name}" in report
    table = flow_run.path(f"{RUN}/report/now/checkpoints.html").read_text()
    first = json.loads(flow_run.path(_eval_info("000030")).read_text())["overall"]
    assert "<td>30</td>" in table and f"<td>{first['pc_success']:.1f}</td>" in table
    # After the run, the same command writes the finished run's report.
    args = flow_run.flow_command[flow_run.flow_command.index("--configfile") :]
    after = flow_run.command("lerobot-pipe", "report", f"--output={RUN}/report.html", *args)
    assert after.returncode == 0, after.stdout[-3000:]
    assert "report of the finished run" in after.stdout
    report = flow_run.path(f"{RUN}/report.html").read_text()
    assert "report/now/" not in report and "report/checkpoints.html" in report


def test_each_new_best_is_published_while_training_goes_on(flow_run):
    """After each evaluation the best so far went to the main revision; the same best again made
    no commit; the repository ends on the final best."""
    receipts = [
        json.loads(flow_run.path(f"{RUN}/published/best_so_far/{step}.json").read_text())
        for step in STEPS
    ]
    last_checkpoint = flow_run.path(_step_file("000090")).stat().st_mtime
    first = flow_run.path(f"{RUN}/published/best_so_far/000030.json").stat().st_mtime
    assert first < last_checkpoint  # published while training went on
    for before, after in itertools.pairwise(receipts):
        assert after["best_step"] in STEPS and after["revision"] == "main"
        if after["best_step"] == before["best_step"]:
            assert not after["created_commit"] and after["commit_id"] == before["commit_id"]
    best = json.loads(flow_run.path(f"{RUN}/eval/best.json").read_text())["step"]
    assert receipts[-1]["best_step"] == best
    weights = flow_run.path(f"{RUN}/converted/{best}/pretrained_model/model.safetensors")
    assert flow_run.hub.read_file(REPO_ID, "model.safetensors") == weights.read_bytes()
    final = json.loads(flow_run.path(f"{RUN}/published/{best}.json").read_text())
    assert final["commit_id"] == receipts[-1]["commit_id"] and not final["created_commit"]


def test_the_rerun_has_nothing_to_do(flow_run):
    result = flow_run.run_ok(*flow_run.flow_command, env=flow_run.hub.env())
    assert "Nothing to be done" in result.output and result.jobs() == {}


def test_more_steps_add_a_segment_and_rerun_none(flow_run, tmp_path):
    """train.steps 90 -> 120, on 2 processes: one segment more; the finished segments' params
    hold only their end (their flags come from validate's output, an ancient input), so neither
    they nor their checkpoints' jobs run again, also once the train checkpoint has re-evaluated
    the DAG."""
    run = flow_run.clone(tmp_path / "repo")
    done = run.mtimes(f"{RUN}/segments/*.json") | run.mtimes(f"{RUN}/eval/0*/eval_info.json")
    longer = run.write_config(
        "longer.yaml", {"train": {"steps": 120}, "launch": {"nproc_per_node": 2}}
    )
    command = ("--cores", "2", "--configfile", "config/config.yaml", "flow.yaml", longer)
    planned = run.run_ok("-n", *command).jobs()
    assert (planned["train_segment"], planned["convert"], planned["evaluate"]) == (1, 1, 1)
    jobs = run.run_ok(*command, env=flow_run.hub.env()).jobs()
    assert (jobs["train_segment"], jobs["convert"], jobs["evaluate"]) == (1, 1, 1)
    after = run.mtimes(f"{RUN}/segments/*.json") | run.mtimes(f"{RUN}/eval/0*/eval_info.json")
    assert {path: after[path] for path in done} == done
    assert run.final_checkpoint()["step"] == 120 and run.final_checkpoint()["world_size"] == 2
    assert "resharded" in run.path(f"{RUN}/logs/train.log").read_text()


def test_a_killed_conversion_is_redone_and_nothing_else(tmp_path):
    workspace = Workspace.fresh(tmp_path / "repo")
    command = _command(workspace)
    # SIGKILL the first conversion (step 30) inside its job; training goes on meanwhile.
    killed = workspace.snakemake(*command, env={ENV_FAULT_POINT: "convert:before_replace"})
    assert killed.returncode != 0
    assert not workspace.path(f"{RUN}/converted/000030/pretrained_model").exists()
    trained = workspace.complete_checkpoints()
    assert trained[:2] == STEPS[:2]  # snakemake let the running segment finish
    checkpoints_before = _checkpoint_files(workspace, trained)

    rerun = workspace.run_ok(*command)
    jobs = rerun.jobs()
    assert jobs.get("train_segment", 0) == 3 - len(trained)  # finished segments not redone
    assert (jobs["convert"], jobs["evaluate"]) == (3, 3)
    assert workspace.complete_checkpoints() == STEPS
    assert _checkpoint_files(workspace, trained) == checkpoints_before
    assert workspace.converted_steps() == STEPS


def test_a_hard_kill_during_training_and_evaluation_recovers_with_unlock(tmp_path):
    workspace = Workspace.fresh(tmp_path / "repo")
    command = _command(workspace)
    snakemake = workspace.start(*command)
    # Kill everything (snakemake, segment 60's trainer, evaluate 30) once both run.
    evaluating = workspace.path(f"{RUN}/logs/evaluate/000030.log")
    _wait_for(lambda: evaluating.exists() and workspace.trainers(), 300, "evaluate 30 + training")
    assert not workspace.path(_step_file("000060")).exists(), "segment 60 should be training"
    os.killpg(snakemake.pid, signal.SIGKILL)
    snakemake.wait()
    _wait_for(lambda: not workspace.trainers(), 30, "the trainers to stop")
    assert not workspace.path(_eval_info("000030")).exists()
    converted_30 = workspace.mtimes(f"{RUN}/converted/000030/pretrained_model/*")
    receipt_30 = workspace.mtimes(f"{RUN}/segments/000030.json")
    assert converted_30 and receipt_30

    # The documented recovery: Snakemake's lock stayed; `make unlock` (no trainer holds the
    # run), then the same command.
    locked = workspace.snakemake(*command)
    assert locked.returncode != 0 and "cannot be locked" in locked.output
    workspace.run_ok("--unlock")
    rerun = workspace.run_ok(*command)
    jobs = rerun.jobs()
    assert (jobs["train_segment"], jobs["convert"], jobs["evaluate"]) == (2, 2, 3)
    assert workspace.mtimes(f"{RUN}/converted/000030/pretrained_model/*") == converted_30
    assert workspace.mtimes(f"{RUN}/segments/000030.json") == receipt_30
    assert workspace.complete_checkpoints() == STEPS
    assert all(workspace.path(_eval_info(step)).is_file() for step in STEPS)
    best = json.loads(workspace.path(f"{RUN}/eval/best.json").read_text())
    # The killed evaluation's pin is gone with its rerun; only the best stays pinned.
    assert _pins(workspace) == [f"{best['step']}.best"]
    assert workspace.run_ok(*command).jobs() == {}
