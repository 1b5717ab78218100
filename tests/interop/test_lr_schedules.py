"""The learning rates of tests/lr_schedules.py, recomputed by LeRobot 0.6.1's own schedulers: the
hard-coded table the unit tests compare against is still what LeRobot computes, and lerobot_pipe
computes the same."""

from __future__ import annotations

import json

import pytest
from interop_helpers import DRIVER, LEROBOT_TIMEOUT, DriverResults
from lr_schedules import CASES, LEROBOT_LRS, flat, lerobot_pipe_lrs

pytestmark = pytest.mark.interop


def test_lerobot_computes_the_hard_coded_lrs_and_so_do_we(upstream, tmp_path):
    jobs = tmp_path / "jobs.json"
    jobs.write_text(
        json.dumps([{"job": "lr_schedules", "cases": CASES, "out": str(tmp_path / "lrs.json")}])
    )
    upstream.run_script(DRIVER, "batch", jobs, home=tmp_path / ".hf_home", timeout=LEROBOT_TIMEOUT)
    theirs = DriverResults(tmp_path).json("lrs.json")
    assert theirs.keys() == CASES.keys()
    for name, case in CASES.items():
        assert flat(theirs[name]) == pytest.approx(flat(LEROBOT_LRS[name]), rel=1e-12, abs=0), (
            f"{name}: LeRobot's lrs differ from tests/lr_schedules.py's (its docstring says how to "
            "regenerate the table)"
        )
        assert flat(lerobot_pipe_lrs(case)) == pytest.approx(flat(theirs[name]), rel=1e-12, abs=0)
