"""Shared fixtures: small synthetic LeRobot v3.0 datasets (the tiny policies' flags: tiny.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from module_coverage import (  # noqa: E402
    imported_package_modules,
    missing_message,
    missing_modules,
    whole_suite_collected,
)
from tiers import (  # noqa: E402
    FAST_TIER,
    MODULE_CHECK,
    ONE_TORCH_ALONE,
    SHARED_RUNS,
    UNMARKED_UPSTREAM,
    UPSTREAM_FIXTURE,
)


def pytest_addoption(parser):
    parser.addoption(
        "--tier",
        choices=("fast", "rest"),
        help=f"fast: -m '{FAST_TIER}' (make test-fast); rest: every other test",
    )


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_ModulesAcrossWorkers(config), "modules-across-workers")
        if not hasattr(config, "workerinput"):  # the controller (or a run without -n)
            config.pluginmanager.register(_WorkerLoad(), "time-per-worker")
    tier = config.getoption("tier")
    if tier is None:
        return
    if config.option.markexpr:
        raise pytest.UsageError(f"--tier={tier} chooses the markers itself: leave out -m")
    config.option.markexpr = FAST_TIER if tier == "fast" else f"not ({FAST_TIER})"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    # For tests/test_fast_tier.py, which runs where -m has deselected these tests.
    config.stash[UNMARKED_UPSTREAM] = [
        item.nodeid
        for item in items
        if UPSTREAM_FIXTURE in getattr(item, "fixturenames", ())
        and item.get_closest_marker("interop") is None
    ]
    config.stash[ONE_TORCH_ALONE] = [
        item.nodeid
        for item in items
        if item.get_closest_marker("one_torch") and not item.get_closest_marker("torch_range")
    ]
    items.sort(key=lambda item: item.nodeid.endswith(MODULE_CHECK))
    # xdist's workers collect (and run this hook); it sets their `dist` to "no" and keeps
    # `--dist loadgroup` as `config.option.loadgroup`.
    if getattr(config.option, "loadgroup", False):
        _group_for_workers(items)


class _WorkerLoad:
    """Under pytest-xdist, on the controller: each worker's busy seconds (its tests' setup, call
    and teardown) and its groups in the order it ran them, printed at the end, so that the group
    that ends a run last is seen (_group_for_workers orders them by a rough cost)."""

    def __init__(self):
        self.start = time.monotonic()
        self.workers: dict[str, dict] = {}

    def pytest_runtest_logreport(self, report):
        node = getattr(report, "node", None)
        if node is None:
            return
        nodeid = report.nodeid
        group = nodeid.rsplit("@", 1)[1] if "@" in nodeid else nodeid.split("::")[0]
        worker = self.workers.setdefault(node.gateway.id, {"groups": {}, "last": 0.0})
        worker["groups"][group] = worker["groups"].get(group, 0.0) + report.duration
        worker["last"] = time.monotonic() - self.start

    def pytest_terminal_summary(self, terminalreporter):
        if not self.workers:
            return
        terminalreporter.write_sep("-", "time per xdist worker (its groups in the order run)")
        for name, worker in sorted(self.workers.items()):
            groups = worker["groups"]
            shown = ", ".join(f"{g} {t:.0f}" for g, t in groups.items() if t >= 20) or "none"
            terminalreporter.write_line(
                f"{name}: busy {sum(groups.values()):.0f} s, its last test ended "
                f"{worker['last']:.0f} s after the start; groups of 20 s or more: {shown}"
            )


class _ModulesAcrossWorkers:
    """The fast tier's module check (tests/test_fast_tier.py) under pytest-xdist: each worker
    imports what its own tests need, so each sends the controller its imported package modules
    and test files, and the controller checks them together once the workers are done, failing
    the session when a module is left. ``FAST_TIER_CHECK_ANY_SELECTION=1`` checks a partial
    selection too (what tests/test_worker_groups.py uses to see it fail)."""

    def __init__(self, config):
        self.config = config
        self.imported: set[str] = set()
        self.test_files: set[str] = set()
        self.workers = 0
        self.lost = 0  # workers that went down without their imports (crashed)

    def pytest_sessionfinish(self, session):
        config = self.config
        if hasattr(config, "workeroutput"):
            config.workeroutput["package_modules"] = sorted(imported_package_modules())
            config.workeroutput["test_files"] = sorted({str(item.path) for item in session.items})
            return
        if not self.workers or config.getoption("tier") != "fast":
            return
        if not (whole_suite_collected(config) or os.environ.get("FAST_TIER_CHECK_ANY_SELECTION")):
            return
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        reporter.write("\n")  # after xdist's progress line, still open here
        if self.lost:
            # Their imports are unknown: the check would name modules their tests did import.
            reporter.write_line(
                f"the fast tier's module check: not run, {self.lost} worker(s) lost"
            )
            return
        missing = missing_modules(self.imported, {Path(p) for p in self.test_files})
        if missing:
            reporter.write_line(
                f"FAILED (the fast tier's module check): {missing_message(missing)}", red=True
            )
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        else:
            reporter.write_line(
                f"the fast tier imports or names every module of lerobot_pipe ({self.workers} workers)"
            )

    def pytest_testnodedown(self, node, error):
        output = getattr(node, "workeroutput", {})
        self.imported |= set(output.get("package_modules", ()))
        self.test_files |= set(output.get("test_files", ()))
        if "package_modules" in output:
            self.workers += 1
        else:
            self.lost += 1


def _group_for_workers(items) -> None:
    """pytest-xdist's groups (``--dist loadgroup``): a module is one group, and the modules that
    use one of SHARED_RUNS join one group, so that no module or shared fixture runs twice. The
    groups go out longest first (by a rough cost: a test of tests/beside or SLURM, which wait on
    a venv or a scheduler for minutes, 10; another slow one 1; the rest 0.05), so that no long one
    starts last."""
    parent = {}

    def find(key):
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    module = {item: item.nodeid.split("::")[0] for item in items}
    for item in items:
        for name in SHARED_RUNS:
            if name in getattr(item, "fixturenames", ()):
                parent[find(module[item])] = find(name)
    group = {item: find(module[item]) for item in items}
    weight: dict[str, float] = {}
    for item in items:
        _join_group(item, group[item])
        marks = {m.name for m in item.iter_markers()}
        cost = 10.0 if marks & {"beside", "slurm"} else 1.0 if marks & {"slow", "interop"} else 0.05
        weight[group[item]] = weight.get(group[item], 0.0) + cost
    # The fast tier's module check stays last (pytest_collection_modifyitems put it there).
    items.sort(key=lambda item: (item.nodeid.endswith(MODULE_CHECK), -weight[group[item]]))


def _join_group(item, group: str) -> None:
    """What an ``xdist_group`` mark does, done here: loadgroup's scheduler reads a test's group
    from the ``@group`` suffix of its node id. pytest-xdist 3.8 writes that suffix to
    ``item._nodeid``, which pytest 9.2's structured node ids no longer read, so the mark is
    silently ignored there and every test is scheduled alone (pytest-xdist #1386)."""
    suffixed = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):  # pytest >= 9.2: a NodeId
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(suffixed)
    else:
        item._nodeid = suffixed


@pytest.fixture(scope="session")
def dataset_root(tmp_path_factory):
    from lerobot_pipe.datasets import write_synthetic_dataset

    return write_synthetic_dataset(
        tmp_path_factory.mktemp("data") / "ds", num_episodes=20, episode_length=50
    )


@pytest.fixture(scope="session")
def diffusion_camera_root(tmp_path_factory):
    """The synthetic reaching task with a 48x48 ``top`` camera (AV1), for Diffusion Policy: the
    smallest frames whose resnet18 feature map (2x2) gives the spatial softmax something to do."""
    from lerobot_pipe.datasets import write_synthetic_dataset

    return write_synthetic_dataset(
        tmp_path_factory.mktemp("data") / "camera48",
        num_episodes=6,
        episode_length=30,
        cameras=["top"],
        image_size=48,
    )
