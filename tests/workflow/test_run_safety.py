"""The pipeline as a user meets it when things go wrong or take long: snakemake SIGKILLed while
training (its trainers die with it, the stale lock has a safe way out, the rerun finishes with
one trainer at a time), a trainer still holding the run, nulls in the config over a resumed
checkpoint, progress and results on the terminal, failures' causes on the terminal."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from launch import hold_run_lock_in_another_process
from snakemake_runs import RUN, TRAIN_DIR, Workspace

from lerobot_pipe.constants import CHECKPOINTS_DIR, LAST_CHECKPOINT_LINK

pytestmark = pytest.mark.slow

FINAL = f"{RUN}/final_checkpoint.json"


# What these tests check (the run lock, the watchdog, resuming) does not depend on the inputs: the
# default dataset without its camera trains several times faster.
class TrainerWatch(threading.Thread):
    """Counts the trainers running in a workspace, every 0.1 s, for as long as it runs."""

    def __init__(self, workspace: Workspace) -> None:
        super().__init__(daemon=True)
        self.workspace = workspace
        self.most = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.most = max(self.most, len(self.workspace.trainers()))
            time.sleep(0.1)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.most


def _wait_for(predicate, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - start


def test_sigkilled_snakemake_takes_its_trainers_along_and_the_rerun_finishes(tmp_path):
    workspace = Workspace.fresh(tmp_path / "repo")
    # One train job (segments: test_flow_pipeline.py's kills): snakemake is killed while it trains.
    long = workspace.write_config(
        "long.yaml", {"train": {"steps": 120, "save_freq": 40}, "launch": {"segment_steps": 0}}
    )
    command = ("--cores", "2", FINAL, "--configfile", "config/config.yaml", long)
    watch = TrainerWatch(workspace)
    watch.start()

    snakemake = workspace.start(*command)
    step_40 = workspace.path(f"{TRAIN_DIR}/{CHECKPOINTS_DIR}/000040/training_state")
    _wait_for(lambda: step_40.joinpath("training_step.json").exists(), 300, "step 40")
    _wait_for(lambda: workspace.trainers(), 60, "training to run")
    snakemake.send_signal(signal.SIGKILL)  # snakemake alone: its jobs are not signalled
    seconds = _wait_for(lambda: not workspace.trainers(), 30, "the trainers to stop")
    snakemake.wait()
    print(f"trainers gone {seconds:.2f} s after snakemake's SIGKILL")
    assert seconds < 10
    killed_output = workspace.path("snakemake.out").read_text()
    assert "train: step 40/120" in killed_output  # progress reached the terminal
    assert "stopping training: the process that started it" in killed_output
    assert not workspace.path(FINAL).exists()

    # Snakemake's own lock stayed behind: the next run says how to remove it, safely.
    locked = workspace.snakemake(*command)
    assert locked.returncode != 0 and "cannot be locked" in locked.output
    assert f"lerobot-pipe check-run-lock --output_dir={TRAIN_DIR} && snakemake" in locked.output
    workspace.run_ok("--unlock")
    rerun = workspace.run_ok(*command)
    assert watch.stop() == 1, "two trainers ran on the run folder at once"

    assert "train: resuming from results/default/train/checkpoints/" in rerun.output
    steps = ["000040", "000080", "000120"]
    assert workspace.complete_checkpoints() == steps
    checkpoints = workspace.path(f"{TRAIN_DIR}/{CHECKPOINTS_DIR}")
    # Nothing else in there: no unfinished save, no incomplete folder.
    assert sorted(p.name for p in checkpoints.iterdir()) == [*steps, LAST_CHECKPOINT_LINK]
    assert (checkpoints / LAST_CHECKPOINT_LINK).readlink().name == steps[-1]
    assert workspace.final_checkpoint()["step"] == 120


def test_a_trainer_holding_the_run_stops_the_pipeline_before_it_trains(default_run, tmp_path):
    run = default_run.clone(tmp_path / "repo")
    checkpoints = f"{TRAIN_DIR}/{CHECKPOINTS_DIR}/**/*"
    before = run.mtimes(checkpoints)
    holder = hold_run_lock_in_another_process(run.path(TRAIN_DIR))
    try:
        more = run.write_config("more.yaml", {"train": {"steps": 310}})
        result = run.snakemake("--cores", "2", FINAL, "--configfile", "config/config.yaml", more)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode != 0
    assert (
        f"--output_dir={TRAIN_DIR} is in use by another trainer (pid {holder.pid}" in result.output
    )
    assert "train" not in result.jobs()
    assert run.mtimes(checkpoints) == before


def test_null_in_the_config_wins_over_the_resumed_checkpoint(tmp_path):
    """HSDP 2x2 on 4 processes, then the shipped config (dp_replicate null, dp_shard -1) on 2:
    the saved dp_replicate=2 must not come back (it would make a non-sharded DDP run that
    cannot resume a sharded DCP checkpoint)."""
    workspace = Workspace.fresh(tmp_path / "repo")
    hsdp = workspace.write_config(
        "hsdp.yaml",
        {
            "launch": {"nproc_per_node": 4},
            "train": {"steps": 10, "save_freq": 10, "parallelism": {"dp_replicate": 2}},
        },
    )
    workspace.run_ok("--cores", "2", FINAL, "--configfile", "config/config.yaml", hsdp)
    first = workspace.final_checkpoint()
    assert first["world_size"] == 4 and first["parallelism"]["mode"] == "hsdp"

    more = workspace.write_config("more.yaml", {"train": {"steps": 20}})
    result = workspace.run_ok("--cores", "2", FINAL, "--configfile", "config/config.yaml", more)
    assert result.jobs() == {"validate": 1, "train": 1}
    final = workspace.final_checkpoint()
    assert final["step"] == 20 and final["world_size"] == 2
    assert final["parallelism"] == {
        "dp_replicate": 1,
        "dp_shard": 2,
        "world_size": 2,
        "mode": "fsdp2",
    }
    train_log = workspace.path(f"{RUN}/logs/train.log").read_text()
    assert "checkpoints/000010 (step 10)" in train_log and "resharded" in train_log
    # The log of the first attempt is kept: each attempt appends after a header of its own.
    attempts = train_log.split("===== lerobot-pipe launch-train, ")[1:]
    assert len(attempts) == 2, train_log[:2000]
    assert "training starts fresh" in attempts[0] and "Effective batch size" in attempts[0]
    assert "resuming from" in attempts[1] and "Effective batch size" in attempts[1]


def test_training_progress_and_the_results_reach_the_terminal(default_run):
    output = default_run.first_result.output.splitlines()
    finished = next(i for i, line in enumerate(output) if line.endswith("(Rule: train)"))
    progress = [i for i, line in enumerate(output) if line.startswith("train: step ")]
    assert progress and progress[0] < finished, "no progress line before the train job ended"
    line = output[progress[0]]
    for part in ("/300 (", "loss ", "samples/s", "ETA "):
        assert part in line, line
    # The whole log is still in the log file.
    assert "Effective batch size" in default_run.path(f"{RUN}/logs/train.log").read_text()
    text = "\n".join(output)
    assert "Results of run 'default', in results/default/:" in text
    assert "results/default/converted/<step>/pretrained_model/ (000100, 000200, 000300)" in text
    assert "`make report` writes results/default/report.html" in text


def test_nothing_left_to_train_launches_nothing(default_run, tmp_path):
    run = default_run.clone(tmp_path / "repo")
    training_before = run.training_files_mtimes()
    # A change that reruns train (its flags change) but leaves `steps` where the run is. In
    # segments: the train job records the final checkpoint again; no segment runs.
    other = run.write_config("other.yaml", {"train": {"log_freq": 10}})
    result = run.run_ok("--cores", "2", FINAL, "--configfile", "config/config.yaml", other)
    assert result.jobs()["train"] == 1 and "train_segment" not in result.jobs()
    assert run.training_files_mtimes() == training_before
    # As one unbroken train job (launch.segment_steps: 0): it starts, and launches nothing.
    unbroken = run.write_config(
        "unbroken.yaml", {"train": {"log_freq": 10}, "launch": {"segment_steps": 0}}
    )
    result = run.run_ok("--cores", "2", FINAL, "--configfile", "config/config.yaml", unbroken)
    assert result.jobs()["train"] == 1
    assert "nothing to train, torchrun not started" in result.output
    # This attempt's part of the run's log (the first attempt's, above it, launched torchrun).
    attempt = run.path(f"{RUN}/logs/train.log").read_text().split("===== lerobot-pipe")[-1]
    assert "nothing to train" in attempt and "torchrun --standalone" not in attempt
    assert run.training_files_mtimes() == training_before
    assert run.final_checkpoint()["step"] == 300


def test_a_failed_publish_shows_its_cause_on_the_terminal(default_run, hub_server, tmp_path):
    run = default_run.clone(tmp_path / "repo")
    hub = ["--config", "hub_repo_id=alice/tiny-act", f"hub_endpoint={hub_server.url}"]
    result = run.snakemake("--cores", "2", *hub, env={**hub_server.env(), "HF_TOKEN": "hf_wrong"})
    assert result.returncode != 0 and "Error in rule publish" in result.output
    log = run.path(f"{RUN}/logs/publish/000300.log").read_text()
    errors = [line for line in log.splitlines() if "ERROR" in line]
    assert errors and all(line in result.output for line in errors)
