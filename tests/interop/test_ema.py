"""The EMA policy folder (``--ema.enable=true``): LeRobot 0.6.1's policy class loads our
``pretrained_model_ema/`` with strict keys and acts as lerobot_pipe does with the EMA weights,
not the live ones; LeRobot main's own EMA rule (diffusers' EMAModel, installed beside LeRobot)
gives the decays we apply."""

from __future__ import annotations

import json

import pytest
import torch
from interop_helpers import DRIVER, LEROBOT_TIMEOUT, DriverResults, our_actions, tiny_flags
from tiny import run_train

from lerobot_pipe import constants as C
from lerobot_pipe.configs.train import EMAConfig
from lerobot_pipe.training.ema import ema_decay

pytestmark = pytest.mark.interop

STEPS = 4
# LeRobot main's EMA configurations, and ours: the decay rule compared update by update.
CASES = {
    "default": EMAConfig(),
    "warmup": EMAConfig(
        max_decay=0.99, min_decay=0.3, update_after_step=3, inv_gamma=2.0, power=0.5
    ),
    "constant": EMAConfig(decay=0.99, update_after_step=2),
}


@pytest.fixture(scope="module")
def ema_step(dataset_root, interop_root):
    out = interop_root / "our_ema"
    flags = tiny_flags(steps=STEPS, save_freq=STEPS)
    run_train(
        [*flags, f"--dataset.root={dataset_root}", "--ema.enable=true", f"--output_dir={out}"]
    )
    return out / C.CHECKPOINTS_DIR / f"{STEPS:06d}"


@pytest.fixture(scope="module")
def lerobot_acts(upstream, ema_step, inputs, interop_root):
    root = interop_root / "ema_reads"
    root.mkdir()
    jobs = [
        {
            "job": "strict_actions",
            "pretrained": str(ema_step / folder),
            "observation": str(inputs.observation),
            "out": str(root / f"{folder}.safetensors"),
        }
        for folder in (C.PRETRAINED_MODEL_DIR, C.PRETRAINED_MODEL_EMA_DIR)
    ]
    cases = {name: _lerobot_main_kwargs(cfg) for name, cfg in CASES.items()}
    jobs.append({"job": "ema_decays", "cases": cases, "out": str(root / "decays.json")})
    (root / "jobs.json").write_text(json.dumps(jobs))
    upstream.run_script(
        DRIVER, "batch", root / "jobs.json", home=root / ".hf_home", timeout=LEROBOT_TIMEOUT
    )
    return DriverResults(root)


def test_lerobot_loads_the_ema_policy_strictly_and_acts_with_its_weights(
    lerobot_acts, ema_step, inputs
):
    ema = lerobot_acts.tensors(f"{C.PRETRAINED_MODEL_EMA_DIR}.safetensors")
    live = lerobot_acts.tensors(f"{C.PRETRAINED_MODEL_DIR}.safetensors")
    assert lerobot_acts.meta(f"{C.PRETRAINED_MODEL_EMA_DIR}.safetensors")["policy_class"] == (
        "ACTPolicy"
    )
    ours = our_actions(ema_step / C.PRETRAINED_MODEL_EMA_DIR, inputs.observation)
    torch.testing.assert_close(ours.chunk, ema["chunk"], atol=1e-5, rtol=0)
    torch.testing.assert_close(
        ours.action_unnormalized, ema["action_unnormalized"], atol=1e-5, rtol=0
    )
    # The EMA weights act otherwise than the live ones.
    assert (ema["chunk"] - live["chunk"]).abs().max() > 1e-4


def test_lerobot_main_shadow_order_is_our_parameter_order(lerobot_acts, ema_step):
    """LeRobot main's ema_state.pt lists the shadow by position, in the order of its policy's
    parameters(): LeRobot's ACT registers its parameters in the order ours does, so a resume
    maps each tensor onto the parameter of the same name."""
    from lerobot_pipe.configs.policies import PreTrainedConfig
    from lerobot_pipe.policies.factory import get_policy_class

    folder = ema_step / C.PRETRAINED_MODEL_EMA_DIR
    theirs = lerobot_acts.json(f"{C.PRETRAINED_MODEL_EMA_DIR}.safetensors.parameters.json")
    config = PreTrainedConfig.from_pretrained(folder)
    with torch.device("meta"):
        ours = [n for n, _ in get_policy_class(config.type)(config).named_parameters()]
    assert ours == theirs


def test_decays_are_diffusers_ema_model_rule(lerobot_acts):
    """LeRobot main builds diffusers' EMAModel with use_ema_warmup=True and, for a constant
    --ema.decay, min_decay = decay = max_decay; its get_decay against ours, update by update."""
    theirs = lerobot_acts.json("decays.json")
    for name, cfg in CASES.items():
        ours = [ema_decay(cfg, n) for n in range(1, 21)]
        assert ours == pytest.approx(theirs[name], abs=1e-12), name


def _lerobot_main_kwargs(cfg: EMAConfig) -> dict:
    """EMAModel's arguments as LeRobot main's lerobot_train.py passes them (a constant decay
    pins both bounds)."""
    low = cfg.min_decay if cfg.decay is None else cfg.decay
    high = cfg.max_decay if cfg.decay is None else cfg.decay
    return {
        "decay": high,
        "min_decay": low,
        "update_after_step": cfg.update_after_step,
        "inv_gamma": cfg.inv_gamma,
        "power": cfg.power,
    }
