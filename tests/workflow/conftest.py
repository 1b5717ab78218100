"""Fixtures of the pipeline tests; the helpers live in snakemake_runs.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]  # this folder, tests/

from conftest_hub import hub_server  # noqa: E402,F401  (a local Hub-compatible server)
from snakemake_runs import Workspace  # noqa: E402


@pytest.fixture(scope="session")
def default_run(tmp_path_factory) -> Workspace:
    """The default config run once, uninterrupted, with plain `snakemake --cores 2`.

    Tests that need a finished run clone this workspace instead of training again.
    """
    workspace = Workspace.fresh(tmp_path_factory.mktemp("default") / "repo")
    result = workspace.run_ok("--cores", "2")
    workspace.first_result = result
    return workspace
