"""LeRobot's own policies where LeRobot is not installed (our venv): a LeRobot type we do not
implement, or ``--policy.implementation=lerobot``, is refused in one line naming the install;
types nobody has stay "unknown". Where LeRobot is installed: tests/beside/."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

import lerobot_pipe.policies  # noqa: F401 - registers our policy types
from lerobot_pipe.configs.loading import parse_train_config
from lerobot_pipe.configs.optim import VQBeTSchedulerConfig
from lerobot_pipe.configs.parser import ConfigError
from lerobot_pipe.policies.factory import get_policy_class
from lerobot_pipe.policies.lerobot_bridge import INSTALL_HINT, LEROBOT_POLICY_TYPES
from lerobot_pipe.training.optim import make_scheduler

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lerobot") is not None, reason="LeRobot is installed here"
)
OURS = ("act", "diffusion", "pi0", "pi05", "smolvla")


@pytest.mark.parametrize("policy_type", ["vqbet", "groot", "tdmpc", "xvla"])
def test_a_lerobot_type_names_the_install(policy_type):
    with pytest.raises(ConfigError) as err:
        parse_train_config([f"--policy.type={policy_type}", "--dataset.repo_id=a/b"])
    message = str(err.value)
    assert "\n" not in message and INSTALL_HINT in message and f"'{policy_type}'" in message
    with pytest.raises(ValueError, match="pip install"):
        get_policy_class(policy_type)


def test_every_lerobot_type_is_ours_or_names_the_install():
    assert len(LEROBOT_POLICY_TYPES) == 19
    for policy_type in LEROBOT_POLICY_TYPES:
        if policy_type in OURS:
            cfg, _ = parse_train_config([f"--policy.type={policy_type}", "--dataset.repo_id=a/b"])
            assert type(cfg.policy).__module__.startswith(f"lerobot_pipe.policies.{policy_type}")
            continue
        with pytest.raises(ConfigError, match="pip install|not built here"):
            parse_train_config([f"--policy.type={policy_type}", "--dataset.repo_id=a/b"])


def test_implementation_flag():
    cfg, _ = parse_train_config(
        ["--policy.type=act", "--policy.implementation=lerobot_pipe", "--dataset.repo_id=a/b"]
    )
    assert type(cfg.policy).__module__ == "lerobot_pipe.policies.act.configuration_act"
    with pytest.raises(ConfigError, match="implementation=lerobot trains LeRobot's own act.*pip"):
        parse_train_config(
            ["--policy.type=act", "--policy.implementation=lerobot", "--dataset.repo_id=a/b"]
        )
    with pytest.raises(ConfigError, match="choose one of lerobot_pipe, lerobot"):
        parse_train_config(
            ["--policy.type=act", "--policy.implementation=other", "--dataset.repo_id=a/b"]
        )


def test_nobodys_type_is_unknown():
    with pytest.raises(ConfigError, match="unknown policy type; choose one of: act, diffusion"):
        parse_train_config(["--policy.type=nope", "--dataset.repo_id=a/b"])


def test_vqbet_scheduler_is_lerobots():
    """LeRobot 0.6.1's VQBeTSchedulerConfig: constant during the VQ-VAE steps, then linear
    warmup and a cosine over the run's steps less the warmup."""
    cfg = VQBeTSchedulerConfig(num_warmup_steps=4, num_vqvae_training_steps=6, num_cycles=0.5)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = make_scheduler(optimizer, cfg, total_steps=30)
    lrs = []
    for _ in range(30):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()

    def lerobots(step: int) -> float:  # LeRobot's lr_lambda, as written in its schedulers.py
        if step < 6:
            return 1.0
        step -= 6
        if step < 4:
            return step / 4
        progress = (step - 4) / (30 - 4)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))

    assert lrs == pytest.approx([lerobots(s) for s in range(30)])
