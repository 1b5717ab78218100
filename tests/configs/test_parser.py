"""Dotted flags onto dataclasses, --config_path with overrides, JSON round trip."""

from __future__ import annotations

import json

import pytest

from lerobot_pipe.configs.parser import ConfigError, from_dict, split_flags, to_dict
from lerobot_pipe.configs.train import TrainConfig
from lerobot_pipe.training.plan import parse_train_config


def test_split_flags_forms():
    assert split_flags(["--a.b=1", "--c", "2", "--flag"]) == {"a.b": "1", "c": "2", "flag": "true"}


def test_nested_flags_and_policy_fields():
    cfg, _ = parse_train_config(
        [
            "--policy.type=act",
            "--policy.dim_model=64",
            '--accelerator.fsdp.wrap_modules=["ACTEncoderLayer"]',
            "--accelerator.gradient_accumulation.steps=2",
            "--parallelism.dp_shard=-1",
            "--optimizer.betas=[0.8,0.9]",
            "--steps=1_000",
        ]
    )
    assert cfg.policy.dim_model == 64 and cfg.policy.n_heads == 8
    assert cfg.accelerator.fsdp.wrap_modules == ["ACTEncoderLayer"]
    assert cfg.accelerator.gradient_accumulation.steps == 2
    assert (
        cfg.parallelism.dp_shard == -1 and cfg.optimizer.betas == [0.8, 0.9] and cfg.steps == 1000
    )


def test_config_path_then_flags_override(tmp_path):
    cfg, _ = parse_train_config(
        ["--policy.type=act", "--policy.dim_model=64", "--steps=10", "--batch_size=4"]
    )
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps({**to_dict(cfg), "resolved": {"world_size": 2}}))
    loaded, step = parse_train_config([f"--config_path={path}", "--steps=20"])
    assert loaded.steps == 20 and loaded.batch_size == 4 and loaded.policy.dim_model == 64
    assert loaded.resolved is None and step is None


def test_round_trip():
    cfg, _ = parse_train_config(
        ["--policy.type=act", "--peft.method_type=LORA", "--trackio.enable=false"]
    )
    again = from_dict(TrainConfig, json.loads(json.dumps(to_dict(cfg))))
    assert to_dict(again) == to_dict(cfg)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy.dim_model=3"], "pass --policy.type"),
        (["--policy.type=act", "--policy.dim_model=x"], "expected an integer"),
        (["--optimzer.lr=1"], "Did you mean --optimizer"),
        (["--accelerator.fsdp.nope=1"], "--accelerator.fsdp.nope: unknown flag"),
        (["--dataset=3"], "expected a JSON object"),
    ],
)
def test_errors_name_the_flag(argv, message):
    with pytest.raises(ConfigError) as err:
        parse_train_config(argv)
    assert message in str(err.value)


def test_null_is_the_default_and_overrides_a_loaded_config(tmp_path):
    cfg, _ = parse_train_config(
        ["--policy.type=act", "--steps=10", "--parallelism.dp_replicate=2", "--policy.dim_model=64"]
    )
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(to_dict(cfg)))
    loaded, _ = parse_train_config(
        [
            f"--config_path={path}",
            "--parallelism.dp_replicate=null",  # Optional: None, its default
            "--steps=null",  # not Optional: the dataclass default
            "--policy.dim_model=NULL",
            "--scheduler=null",  # a nested dataclass
        ]
    )
    defaults = TrainConfig()
    assert loaded.parallelism.dp_replicate is None and loaded.steps == defaults.steps
    assert loaded.policy.dim_model == type(loaded.policy)().dim_model
    assert loaded.scheduler == defaults.scheduler
    # In a JSON config too.
    data = {**to_dict(cfg), "batch_size": None, "optimizer": {"betas": None}}
    assert from_dict(TrainConfig, data).optimizer.betas == defaults.optimizer.betas
    with pytest.raises(ConfigError, match="expected an integer"):
        parse_train_config(["--steps=nul"])
