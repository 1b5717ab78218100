"""The pipeline through the SLURM profile on a real cluster (`.ci/slurm.sh start` makes one on
localhost): every rule a SLURM job, training launched with srun + torchrun.

Skipped where no cluster answers, except under CI=true, where that is a failure."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess

import pytest
from snakemake_runs import RUN, Workspace

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def slurm_node_ready() -> str | None:
    """None when a SLURM node is up and Snakemake has its SLURM executor, else why not."""
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "the SLURM executor plugin is not installed: make slurm-plugin"
    if shutil.which("sinfo") is None:
        return "sinfo not found: SLURM is not installed (.ci/slurm.sh install)"
    try:
        states = subprocess.run(
            ["sinfo", "--noheader", "--format=%T"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 20 s"
    if states.returncode != 0 or not {"idle", "mixed", "allocated"} & set(states.stdout.split()):
        return f"no SLURM node is up (.ci/slurm.sh start): {states.stdout}{states.stderr}"
    return None


@pytest.fixture
def slurm_cluster():
    why = slurm_node_ready()
    if why is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs a SLURM cluster: {why}")
        pytest.skip(why)


def test_pipeline_through_the_slurm_profile(slurm_cluster, tmp_path):
    """Training in two segments (launch.segment_steps: train.save_freq): each a SLURM job with
    the train resources (srun + torchrun on 2 tasks), each checkpoint's conversion and evaluation
    a small job of its own; the job that records the final checkpoint runs where Snakemake runs."""
    workspace = Workspace.fresh(tmp_path / "repo")
    # Two checkpoints: each SLURM job costs seconds of start-up and status polling.
    override = workspace.write_config("short.yaml", {"train": {"steps": 20, "save_freq": 10}})
    result = workspace.run_ok(
        "--profile",
        "workflow/profiles/slurm",
        "--configfile",
        "config/config.yaml",
        override,
    )
    # validate, 2 segments, 2 conversions, 2 evaluations (train, best and the figures run
    # locally)
    assert result.output.count("submitted with SLURM jobid") == 7
    assert (result.jobs()["train_segment"], result.jobs()["train"]) == (2, 1)
    history = workspace.path(f"{RUN}/logs/train.log").read_text()
    assert history.count("srun + torchrun") == 2  # one launch per segment
    assert "checkpoints/000010 (step 10)" in history  # the second resumed the first
    assert workspace.complete_checkpoints() == ["000010", "000020"]
    assert workspace.converted_steps() == ["000010", "000020"]
    for step in ("000010", "000020"):
        assert workspace.path(f"{RUN}/eval/{step}/eval_info.json").is_file()
        assert workspace.path(f"{RUN}/segments/{step}.json").is_file()
    best = json.loads(workspace.path(f"{RUN}/eval/best.json").read_text())
    assert best["step"] in ("000010", "000020")
    final = workspace.final_checkpoint()
    assert final["step"] == 20 and final["world_size"] == 2
