"""make_policy_config / get_policy_class / make_policy."""

from pathlib import Path

import pytest
import torch

from lerobot_pipe.policies import (
    ACTConfig,
    ACTPolicy,
    get_policy_class,
    make_policy,
    make_policy_config,
)
from lerobot_pipe.policies.act import ACT_TINY_PRESET

INFO_FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [2], "names": None},
    "observation.environment_state": {"dtype": "float32", "shape": [16], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": None},
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
}


def test_make_policy_config() -> None:
    cfg = make_policy_config("act", dim_model=64, n_heads=4)
    assert isinstance(cfg, ACTConfig) and cfg.dim_model == 64
    with pytest.raises(ValueError, match=r"known types: \['act'"):
        make_policy_config("nope")


def test_get_policy_class() -> None:
    assert get_policy_class("act") is ACTPolicy
    with pytest.raises(ValueError, match="act"):
        get_policy_class("nope")


def test_make_policy_fills_features_from_dataset() -> None:
    cfg = make_policy_config("act", **ACT_TINY_PRESET)
    policy = make_policy(cfg, INFO_FEATURES)
    assert isinstance(policy, ACTPolicy)
    assert cfg.output_features == {"action": {"type": "ACTION", "shape": [2]}}
    assert cfg.input_features == {
        "observation.state": {"type": "STATE", "shape": [2]},
        "observation.environment_state": {"type": "ENV", "shape": [16]},
    }


def test_make_policy_errors() -> None:
    with pytest.raises(ValueError, match="dataset_features"):
        make_policy(make_policy_config("act", **ACT_TINY_PRESET))
    no_env = {k: v for k, v in INFO_FEATURES.items() if k != "observation.environment_state"}
    with pytest.raises(ValueError, match="observation.environment_state"):
        make_policy(make_policy_config("act", **ACT_TINY_PRESET), no_env)


def test_make_policy_loads_pretrained_weights(tmp_path: Path) -> None:
    source = make_policy(make_policy_config("act", **ACT_TINY_PRESET), INFO_FEATURES)
    source.save_pretrained(tmp_path)
    cfg = make_policy_config("act", pretrained_path=str(tmp_path), **ACT_TINY_PRESET)
    loaded = make_policy(cfg, INFO_FEATURES)
    for (name, a), b in zip(source.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_make_policy_with_a_camera() -> None:
    image = {"observation.images.top": {"dtype": "image", "shape": [3, 8, 8], "names": None}}
    cfg = make_policy_config("act", pretrained_backbone_weights=None, **ACT_TINY_PRESET)
    policy = make_policy(cfg, {**INFO_FEATURES, **image})
    assert list(policy.config.image_features) == ["observation.images.top"]
    assert policy.model.backbone is not None
    # A camera is enough without the environment state (LeRobot's rule).
    no_env = {k: v for k, v in INFO_FEATURES.items() if k != "observation.environment_state"}
    cfg = make_policy_config("act", pretrained_backbone_weights=None, **ACT_TINY_PRESET)
    assert make_policy(cfg, {**no_env, **image}).model.encoder_env_state_input_proj is None
