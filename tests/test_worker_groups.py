"""CI's rest tier runs on two pytest-xdist workers (`-n 2 --dist loadgroup`): a module goes whole
to one worker, and the modules that share one of tests/tiers.py's SHARED_RUNS go to the same one,
so that no session or module fixture that trains runs once per worker (tests/conftest.py). The
fast tier's module check (tests/test_fast_tier.py) gathers the imports of every worker.

Checked with the real xdist on real modules of this suite: every test is skipped before its
fixtures run, and each records the worker that got it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Two modules that share the interop suite's checkpoints (lerobot_ckpts, our_ckpts, ...), each
# with more tests than one, one of them parametrized; and a module of its own.
SHARED = ("tests/interop/test_configs.py", "tests/interop/test_training.py")
ALONE = "tests/training/test_memory_state.py"

PROBE = """
import os, pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    with open(os.environ["WORKER_GROUPS_LOG"], "a") as log:
        log.write(os.environ.get("PYTEST_XDIST_WORKER", "-") + " " + item.nodeid + "\\n")
    pytest.skip("where it would run")
"""


def test_a_module_and_the_modules_of_one_shared_run_go_to_one_worker(tmp_path):
    (tmp_path / "worker_groups_probe.py").write_text(PROBE)
    log = tmp_path / "workers.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "WORKER_GROUPS_LOG": str(log),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup"]
        + ["-p", "worker_groups_probe", "-p", "no:cacheprovider", *SHARED, ALONE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    workers = defaultdict(set)
    for line in log.read_text().splitlines():
        worker, nodeid = line.split(" ", 1)
        workers[nodeid.split("::")[0]].add(worker)
    assert set(workers) == {*SHARED, ALONE}, workers
    assert all(len(found) == 1 and "-" not in found for found in workers.values()), workers
    assert workers[SHARED[0]] == workers[SHARED[1]], workers
    tests = len(log.read_text().splitlines())
    assert tests > 10, tests
    # The controller's account of each worker's time (tests/conftest.py's _WorkerLoad).
    accounts = [line for line in run.stdout.splitlines() if line.startswith("gw")]
    assert len(accounts) == 2 and all("busy" in line for line in accounts), run.stdout[-3000:]


def test_the_module_check_gathers_every_workers_imports_and_fails_naming_what_is_left():
    """Two workers, a selection far too small to cover the package: the controller's check fails
    the session naming the modules that no test of the selection imports or runs, and only those."""
    env = {**os.environ, "FAST_TIER_CHECK_ANY_SELECTION": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "--tier=fast"]
        + ["-p", "no:cacheprovider", "tests/configs/test_parser.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert "passed" in out and " failed" not in out, out[-3000:]
    check = out[out.index("FAILED (the fast tier's module check)") :]
    assert "lerobot_pipe.scripts.train" in check, check
    # Imported on a worker (by lerobot_pipe.configs.train), named by no code of the selection: the
    # controller has it from that worker.
    assert "lerobot_pipe.configs.checks" not in check, check
