"""Dotted flags onto dataclasses, --config_path with overrides, JSON round trip."""

from __future__ import annotations

import json

import pytest

from lerobot_pipe.configs.loading import parse_train_config
from lerobot_pipe.configs.optim import AdamConfig
from lerobot_pipe.configs.parser import ConfigError, from_dict, split_flags, to_dict
from lerobot_pipe.configs.train import TrainConfig
from lerobot_pipe.training.config_checks import validate_config


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
    # lerobot_pipe's earlier files kept "resolved" beside the config: dropped, not kept.
    assert "resolved" not in to_dict(loaded) and step is None


def test_choices_and_optional_groups():
    cfg, _ = parse_train_config(
        [
            "--policy.type=act",
            "--scheduler.num_warmup_steps=7",  # given before its type: types are set first
            "--scheduler.type=cosine_decay_with_warmup",
            "--optimizer.type=sgd",
            "--optimizer.momentum=0.9",
            "--peft.r=4",
        ]
    )
    assert type(cfg.scheduler).__name__ == "CosineDecayWithWarmupSchedulerConfig"
    assert cfg.scheduler.num_warmup_steps == 7
    assert cfg.optimizer.type == "sgd" and cfg.optimizer.momentum == 0.9
    assert cfg.peft.r == 4 and cfg.peft.method_type == "LORA"
    assert to_dict(cfg)["scheduler"]["type"] == "cosine_decay_with_warmup"
    with pytest.raises(ConfigError, match="pass --scheduler.type first"):
        parse_train_config(["--policy.type=act", "--scheduler.num_warmup_steps=7"])
    with pytest.raises(ConfigError, match="unknown optimizer type"):
        parse_train_config(["--optimizer.type=lion"])


def test_unknown_keys_of_a_file_are_kept(tmp_path):
    cfg, _ = parse_train_config(["--policy.type=act"])
    data = to_dict(cfg)
    data["some_future_field"] = {"x": 1}
    data["policy"]["another_one"] = 3
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(data))
    loaded, _ = parse_train_config([f"--config_path={path}"])
    again = to_dict(loaded)
    assert again["some_future_field"] == {"x": 1} and again["policy"]["another_one"] == 3
    # ... but a flag nobody knows is still an error.
    with pytest.raises(ConfigError, match="--some_future_field: unknown flag"):
        parse_train_config([f"--config_path={path}", "--some_future_field=1"])


def test_lerobot_int_flags_read_as_bools():
    """LeRobot declares ACT's replace_final_stride_with_dilation an int and writes 0 / 1 once
    draccus decoded it; other integers stay an error."""
    cfg, _ = parse_train_config(["--policy.type=act"])
    data = to_dict(cfg)
    data["policy"]["replace_final_stride_with_dilation"] = 0
    assert from_dict(TrainConfig, data).policy.replace_final_stride_with_dilation is False
    data["policy"]["replace_final_stride_with_dilation"] = 2
    with pytest.raises(ConfigError, match="expected true or false"):
        from_dict(TrainConfig, data)


def test_optimizer_flags_are_replaced_by_the_preset_with_a_warning(caplog):
    """LeRobot's rule (use_policy_training_preset=true): --optimizer.* gives way to the policy's
    preset; LeRobot does it silently, we say so."""

    argv = ["--policy.type=act", "--policy.optimizer_lr=0.002", "--dataset.root=x"]
    cfg, _ = parse_train_config([*argv, "--optimizer.type=adamw", "--optimizer.lr=0.5"])
    cfg = validate_config(cfg)
    assert cfg.optimizer.lr == 0.002 and cfg.scheduler is None
    assert "replaced by the policy's presets" in caplog.text


def test_extension_fields_are_written_only_when_set():
    cfg, _ = parse_train_config(["--policy.type=act", "--peft.r=4"])
    data = to_dict(cfg)
    assert "trackio" not in data and "lora_dropout" not in data["peft"] and "ema" not in data
    cfg, _ = parse_train_config(
        [
            "--policy.type=act",
            "--peft.lora_dropout=0.1",
            "--trackio.enable=true",
            "--ema.enable=true",
            "--ema.decay=0.99",
        ]
    )
    data = to_dict(cfg)
    assert data["trackio"]["enable"] is True and data["peft"]["lora_dropout"] == 0.1
    assert data["ema"] == {
        "enable": True,
        "decay": 0.99,
        "update_after_step": 0,
        "inv_gamma": 1.0,
        "power": 0.75,
        "min_decay": 0.0,
        "max_decay": 0.9999,
        "use_for_eval": True,
    }
    assert to_dict(from_dict(TrainConfig, json.loads(json.dumps(data)))) == data


def test_round_trip():
    cfg, _ = parse_train_config(
        ["--policy.type=act", "--peft.method_type=LORA", "--trackio.enable=true"]
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
    # (an optimizer without a type is LeRobot's default choice, adam)
    assert from_dict(TrainConfig, data).optimizer.betas == AdamConfig().betas
    with pytest.raises(ConfigError, match="expected an integer"):
        parse_train_config(["--steps=nul"])


def test_resolving_a_config_keeps_the_fields_its_file_held_beyond_ours():
    """A LeRobot 0.4.4 train_config.json's own fields (eval_freq, ...) survive validation: the
    resolved config is a new value, and it writes them back."""
    from lerobot_pipe.configs.parser import from_dict, to_dict
    from lerobot_pipe.configs.train import TrainConfig
    from lerobot_pipe.training.config_checks import resolve_config

    cfg = from_dict(
        TrainConfig,
        {"eval_freq": 20_000, "policy": {"type": "act", "use_rabc": False}, "output_dir": "o"},
        lenient=True,
    )
    cfg.dataset.root = "x"
    resolved = to_dict(resolve_config(cfg))
    assert resolved["eval_freq"] == 20_000 and resolved["policy"]["use_rabc"] is False
    assert resolved["job_name"] == "act" and to_dict(cfg)["job_name"] is None


@pytest.mark.parametrize(
    ("dotted", "as_json", "field"),
    [
        (["--reward_model.type=x"], ['--reward_model={"type": "x"}'], "reward_model"),
        (["--sample_weighting.type=x"], ['--sample_weighting={"type": "x"}'], "sample_weighting"),
    ],
)
def test_dotted_flag_into_a_json_field_reads_as_its_json_form(dotted, as_json, field):
    """LeRobot's users type --reward_model.type=x; it gets the same value, and so the same
    message, as --reward_model='{"type": "x"}' (not "reward_model has no sub-option type")."""
    messages = []
    for flags in (dotted, as_json):
        cfg, _ = parse_train_config(["--policy.type=act", "--dataset.root=x", *flags])
        assert getattr(cfg, field) == {"type": "x"}
        with pytest.raises(ConfigError) as err:
            validate_config(cfg)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and messages[0].startswith(f"--{field}: ")


def test_dotted_flags_into_json_fields_nest_or_keep_feature_names():
    cfg, _ = parse_train_config(
        [
            "--policy.type=act",
            '--reward_model={"type": "classifier"}',
            "--reward_model.head.hidden_dim=400",
            "--rename_map.observation.images.cam=observation.images.top",
        ]
    )
    assert cfg.reward_model == {"type": "classifier", "head": {"hidden_dim": 400}}
    assert cfg.rename_map == {"observation.images.cam": "observation.images.top"}


def test_checkpoint_format_is_an_enum_written_as_the_same_string():
    """train_config.json holds the string LeRobot's docs name; the config holds the member."""
    from lerobot_pipe.configs.checkpoint_format import CheckpointFormat

    cfg, _ = parse_train_config(["--policy.type=act", "--checkpoint_format=safetensors_dcp"])
    assert cfg.checkpoint_format is CheckpointFormat.SAFETENSORS_DCP
    written = json.loads(json.dumps(to_dict(cfg)))
    assert written["checkpoint_format"] == "safetensors_dcp"
    assert from_dict(TrainConfig, written).checkpoint_format is CheckpointFormat.SAFETENSORS_DCP
    with pytest.raises(ConfigError, match="choose one of safetensors, dcp, safetensors_dcp"):
        parse_train_config(["--checkpoint_format=zip"])


def test_each_section_validates_itself():
    from lerobot_pipe.configs.train import DatasetConfig, EMAConfig, PeftConfig

    with pytest.raises(ConfigError, match="--dataset.eval_split=1.0: must be in"):
        DatasetConfig(root="x", eval_split=1.0).validate()
    with pytest.raises(ConfigError, match="--ema.power=0: must be > 0"):
        EMAConfig(power=0).validate()
    with pytest.raises(ConfigError, match=r"--peft.lora_dropout=1.0: must be in \[0, 1\)"):
        PeftConfig(lora_dropout=1.0).validate()
