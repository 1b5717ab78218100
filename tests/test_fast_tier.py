"""The fast tier (`make test-fast`, `pytest --tier=fast`) still covers every module: each module
of lerobot_pipe is imported while its tests run, or named by the code of one of them (an import,
a ``python -m`` or monkeypatch target, the console script that runs it), directly or through the
test helpers it imports (tests/module_coverage.py).

A module that only the slow, interop or SLURM tests reach fails here, naming it: give it a fast
test (or import it from one) instead of leaving it to the tiers that take half an hour."""

from __future__ import annotations

from pathlib import Path

import pytest
from module_coverage import (
    imported_package_modules,
    missing_message,
    missing_modules,
    whole_suite_collected,
)
from tiers import ONE_TORCH_ALONE, UNMARKED_UPSTREAM, UPSTREAM_FIXTURE


def test_every_module_is_imported_by_a_fast_test(request):
    """Runs last in the fast tier (tests/conftest.py moves it there), so that sys.modules holds
    everything its tests imported in this process; the names in the tests' code add what they
    run in subprocesses (torchrun workers, console scripts)."""
    config = request.config
    if not (config.getoption("tier") == "fast" and whole_suite_collected(config)):
        pytest.skip("checks the selection of the fast tier: make test-fast (pytest --tier=fast)")
    if hasattr(config, "workeroutput"):
        pytest.skip(
            "one xdist worker sees its own imports: the controller checks them all at the end"
        )
    selected = {Path(item.path) for item in request.session.items}
    missing = missing_modules(imported_package_modules(), selected)
    assert not missing, missing_message(missing)


def test_every_test_of_released_lerobot_says_it_is_interop(request):
    """A test that runs released LeRobot (the ``upstream`` fixture) is marked interop in its own
    file, so that the fast tier never needs LeRobot's venv and `pytest -m interop` finds it."""
    if not whole_suite_collected(request.config):
        pytest.skip("checks a collection of the whole of tests/ (make test, make test-fast)")
    unmarked = request.config.stash[UNMARKED_UPSTREAM]
    assert not unmarked, (
        f"{', '.join(unmarked)} use the {UPSTREAM_FIXTURE!r} fixture without the interop marker: "
        "add @pytest.mark.interop (or the module's pytestmark)"
    )


def test_one_torch_marks_only_torch_range_cases(request):
    """``one_torch`` leaves a torch_range case to the pinned torch (`make test-torch` deselects
    it on the range's ends); on any other test it would say something that nothing does."""
    if not whole_suite_collected(request.config):
        pytest.skip("checks a collection of the whole of tests/ (make test, make test-fast)")
    alone = request.config.stash[ONE_TORCH_ALONE]
    assert not alone, f"{', '.join(alone)}: one_torch without torch_range"
