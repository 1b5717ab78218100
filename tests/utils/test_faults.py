"""The fault points' hold (``LEROBOT_PIPE_FAULT_WAIT``): a process stops at the named point, at the
named step, until a file exists; anywhere else it does not wait."""

from __future__ import annotations

import threading
import time

from lerobot_pipe.constants import ENV_FAULT_WAIT
from lerobot_pipe.utils import faults


def test_the_hold_waits_at_its_point_and_step_until_the_file_exists(tmp_path, monkeypatch):
    flag = tmp_path / "published.json"
    monkeypatch.setenv(ENV_FAULT_WAIT, f"save:begin@90={flag}")
    monkeypatch.setattr(faults, "_current_step", 60)
    start = time.monotonic()
    faults.fault_point("save:begin")  # another step
    faults.fault_point("save:staged")  # another point
    assert time.monotonic() - start < 0.5
    monkeypatch.setattr(faults, "_current_step", 90)
    threading.Timer(0.6, flag.touch).start()
    start = time.monotonic()
    faults.fault_point("save:begin")
    assert flag.exists() and time.monotonic() - start >= 0.5


def test_the_hold_runs_out(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_FAULT_WAIT, f"train:after_backward={tmp_path / 'never'}")
    monkeypatch.setattr(faults, "WAIT_LIMIT_S", 0.3)
    start = time.monotonic()
    faults.fault_point("train:after_backward")
    assert 0.3 <= time.monotonic() - start < 5
