"""The test tiers: the fast tier (`make test-fast`, `pytest --tier=fast`) and the rest
(`--tier=rest`); tests/conftest.py applies them, tests/test_fast_tier.py checks them.

A test says its own tier with markers in its file: `pytestmark = pytest.mark.slow` for a whole
module, `@pytest.mark.slow` on a test, `pytest.param(..., marks=pytest.mark.slow)` for one case
of a parametrized test. Mark slow what would push the fast tier past 5 minutes on 2 cores:
convergence runs, the multi-process parity matrices, torchrun and snakemake end to end."""

from __future__ import annotations

import pytest

# The fast tier (`make test-fast`): no test that launches torchrun or snakemake end to end (slow),
# runs released LeRobot (interop) or needs a SLURM cluster (slurm). `--tier=rest` is the other
# tests, so that CI runs the whole suite once and still times the fast tier on its own.
FAST_TIER = "not slow and not interop and not slurm"
# Runs last in the fast tier: it reads what the tier's tests imported (under pytest-xdist the
# controller checks what every worker imported instead: tests/conftest.py).
MODULE_CHECK = "test_fast_tier.py::test_every_module_is_imported_by_a_fast_test"
# The fixture that runs released LeRobot's own code (tests/datasets/conftest.py,
# tests/interop/conftest.py): a test that uses it must be marked interop.
UPSTREAM_FIXTURE = "upstream"
# Where tests/conftest.py leaves the tests that use UPSTREAM_FIXTURE without the interop marker.
UNMARKED_UPSTREAM = pytest.StashKey[list]()
# Where tests/conftest.py leaves the tests marked one_torch without torch_range (the mark then
# means nothing: only `make test-torch` reads it).
ONE_TORCH_ALONE = pytest.StashKey[list]()

# Session fixtures that train or run a pipeline, each shared by several modules. Under pytest-xdist
# (CI's rest tier: `-n 2 --dist loadgroup`) tests/conftest.py puts each module whole (its module
# fixtures run once) on one worker, and the modules that share one of these on the same worker.
SHARED_RUNS = (
    "default_run",
    "lerobot_ckpts",
    "our_ckpts",
    "lerobot_reads",
    "lerobot_trains_ours",
    "untrained_policy",
    "_plain_template",
    "_peft_template",
)
