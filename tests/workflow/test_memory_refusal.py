"""The validate step's memory plan (issue #40): a run that cannot fit the configured GPU is
refused before anything is queued, the message naming the changes that would make it fit."""

from __future__ import annotations

import pytest
from snakemake_runs import RUN, TRAIN_DIR, Workspace

pytestmark = pytest.mark.slow


def test_a_run_that_cannot_fit_the_gpu_is_refused_in_validate(tmp_path):
    workspace = Workspace.fresh(tmp_path / "repo")
    # The default run (tiny ACT, FSDP2 over 2) needs a little over the 1 GiB allowance: a
    # "1 GB" GPU (0.93 GiB) cannot hold it.
    override = workspace.write_config("small.yaml", {"slurm": {"gpu_memory_gb": 1}})
    result = workspace.snakemake("--cores", "2", "--configfile", "config/config.yaml", override)
    assert result.returncode != 0
    assert "Error in rule validate" in result.output
    assert "Memory plan:" in result.output and "does NOT fit" in result.output
    assert "slurm.gpu_memory_gb=1" in result.output
    assert "train" not in result.jobs()
    assert not workspace.path(TRAIN_DIR).exists()
    assert not workspace.path(f"{RUN}/logs/train.log").exists()
