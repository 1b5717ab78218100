"""Policy and env config types register when their packages are imported (configs/ holds only the
bases, below them): every module that parses a ``--policy.type`` or ``--env.type`` imports those
packages itself, so in a fresh process it knows every type, and an unknown one is refused with
the list of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

POLICIES = Path(__file__).resolve().parents[2] / "lerobot_pipe" / "policies"
POLICY_TYPES = sorted(p.parent.name for p in POLICIES.glob("*/modeling_*.py"))
ENV_TYPES = ["aloha", "pusht", "synthetic"]

_PROBE = """
import json, sys
import {module}
from lerobot_pipe.configs.envs import EnvConfig
from lerobot_pipe.configs.parser import ConfigError, from_dict
from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.configs.train import TrainConfig
try:
    from_dict(TrainConfig, {{"policy": {{"type": "nope"}}}})
except ConfigError as e:
    refusal = str(e)
print(json.dumps({{"policies": PreTrainedConfig.known_choices(),
                  "envs": EnvConfig.known_choices(), "refusal": refusal}}))
"""


def _known_after_importing(module: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "module, wants_policies",
    [("lerobot_pipe.training.preflight", True), ("lerobot_pipe.evaluation.eval_policy", False)],
)
def test_a_module_that_parses_types_registers_them_itself(module, wants_policies):
    known = _known_after_importing(module)
    assert known["envs"] == ENV_TYPES
    if wants_policies:
        assert known["policies"] == POLICY_TYPES
        assert known["refusal"] == (
            f"--policy.type='nope': unknown policy type; choose one of: {', '.join(POLICY_TYPES)}"
        )
