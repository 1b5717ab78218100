"""lerobot_pipe.training.host_memory: a training process keeps the host memory it frees, so each
step's tensors reuse pages instead of faulting in fresh ones; the user's allocator choice wins.

Measured in fresh processes (the allocator's settings are per process): the minor page faults of
a loop that allocates, writes and frees the same 64 MB of tensors, as a step's activations are."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
from tiny import tiny_act_flags

from lerobot_pipe.training.host_memory import keep_freed_host_memory, user_allocator_choice

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's allocator"
)

# 40 tensors of 256 KiB to 8 MiB (154 MiB) live at once, then all freed, ten rounds: the free top
# of the heap exceeds glibc's trim threshold, whose default adapts to the largest block freed
CHURN = """
import json, resource, sys, torch
from lerobot_pipe.training.host_memory import keep_freed_host_memory
applied = keep_freed_host_memory() if sys.argv[1] == "keep" else None
def round_():
    ts = [torch.empty(n).fill_(1.0) for n in [1 << 16, 1 << 18, 1 << 20, 1 << 21, 3 << 19] * 8]
    del ts
round_()  # the first round faults its pages in either way
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    round_()
print(json.dumps({"applied": applied,
                  "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0}))
"""


def churn(mode: str, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", CHURN, mode],
        env={**environ, "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_tensors_reuse_their_pages():
    default = churn("default")
    kept = churn("keep")
    assert kept["applied"] is True
    # glibc's defaults give ~16 MiB back each round and fault it in again (~4,000 pages a round,
    # measured); kept, a few hundred
    assert default["faults"] > 10 * 1500, default
    assert 4 * kept["faults"] < default["faults"], (kept, default)


@pytest.mark.parametrize(
    "env",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
        {"MALLOC_TRIM_THRESHOLD_": "131072"},
        {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
    ],
    ids=["GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD"],
)
def test_the_users_allocator_choice_is_left_alone(env):
    assert user_allocator_choice(env) == next(iter(env))
    assert keep_freed_host_memory(env) is False
    if "LD_PRELOAD" in env:  # a library that may not be installed: the rule alone
        return
    chosen = churn("keep", **env)
    assert chosen["applied"] is False
    assert chosen["faults"] > 10 * 1500, chosen  # the user's threshold (the default), not ours


def test_no_choice_in_an_ordinary_environment():
    assert user_allocator_choice({"PATH": "/usr/bin", "GLIBC_TUNABLES": "glibc.rtld.nns=2"}) is None


TRAIN_AND_REPORT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tiny import run_train
run_train(json.loads(sys.argv[2]))
from lerobot_pipe.training import host_memory
print(json.dumps({"applied": host_memory._applied}))
"""


def test_lerobot_train_keeps_freed_host_memory(dataset_root, tmp_path):
    argv = tiny_act_flags(
        **{"dataset.root": dataset_root, "output_dir": tmp_path / "out", "steps": 2}
    )
    environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            TRAIN_AND_REPORT,
            os.path.dirname(os.path.dirname(__file__)),
            json.dumps(argv),
        ],
        env={**environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"applied": True}
