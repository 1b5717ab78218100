"""Policy configs and checkpoints: config.json dispatch, validation, safetensors round trip."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.constants import CONFIG_NAME, MODEL_DCP_DIR, MODEL_SAFETENSORS
from lerobot_pipe.policies import ACTConfig, ACTPolicy, dataset_to_policy_features
from lerobot_pipe.policies.act import ACT_TINY_PRESET

INPUTS = {
    "observation.state": {"type": "STATE", "shape": [3]},
    "observation.environment_state": {"type": "ENV", "shape": [6]},
}
OUTPUTS = {"action": {"type": "ACTION", "shape": [2]}}


def make_config(**overrides) -> ACTConfig:
    return ACTConfig.tiny(input_features=INPUTS, output_features=OUTPUTS, **overrides)


def make_batch(cfg: ACTConfig) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "observation.state": torch.randn(4, 3, generator=gen),
        "observation.environment_state": torch.randn(4, 6, generator=gen),
        "action": torch.randn(4, cfg.chunk_size, 2, generator=gen),
        "action_is_pad": torch.zeros(4, cfg.chunk_size, dtype=torch.bool),
    }


def test_act_defaults_follow_lerobot() -> None:
    cfg = ACTConfig()
    assert (cfg.chunk_size, cfg.n_action_steps, cfg.dim_model, cfg.n_heads) == (100, 100, 512, 8)
    assert (cfg.dim_feedforward, cfg.n_encoder_layers, cfg.n_decoder_layers) == (3200, 4, 1)
    assert (cfg.use_vae, cfg.latent_dim, cfg.n_vae_encoder_layers) == (True, 32, 4)
    assert (cfg.dropout, cfg.kl_weight, cfg.vision_backbone) == (0.1, 10.0, "resnet18")
    preset = cfg.get_optimizer_preset()
    assert (preset.type, preset.lr, preset.weight_decay) == ("adamw", 1e-5, 1e-4)
    assert cfg.optimizer_lr_backbone == 1e-5 and cfg.replace_final_stride_with_dilation is False
    assert cfg.pretrained_backbone_weights == "ResNet18_Weights.IMAGENET1K_V1"
    # LeRobot's ACT leaves the environment state unnormalized.
    assert cfg.normalization_mapping == {
        "VISUAL": "MEAN_STD",
        "STATE": "MEAN_STD",
        "ACTION": "MEAN_STD",
    }
    assert cfg.get_scheduler_preset() is None
    assert cfg.action_delta_indices == list(range(100))
    assert cfg.observation_delta_indices is None
    assert ACTConfig.type == "act"
    tiny = ACTConfig.tiny(dim_model=64)
    assert tiny.dim_model == 64 and tiny.chunk_size == ACT_TINY_PRESET["chunk_size"]


def test_registry() -> None:
    assert "act" in PreTrainedConfig.known_choices()
    assert PreTrainedConfig.get_choice_class("act") is ACTConfig
    with pytest.raises(ValueError, match=r"unknown policy type 'nope'.*'act'"):
        PreTrainedConfig.get_choice_class("nope")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"n_action_steps": 11}, "n_action_steps"),
        ({"dim_model": 30, "n_heads": 4}, "dim_model"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"n_heads": 0}, "n_heads"),
        ({"latent_dim": -1}, "latent_dim"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"n_obs_steps": 2}, "n_obs_steps"),
        ({"feedforward_activation": "swish"}, "feedforward_activation"),
        ({"temporal_ensemble_coeff": 0.01}, "n_action_steps"),
        ({"normalization_mapping": {"STATE": "SOFTMAX"}}, "normalization_mapping"),
    ],
)
def test_validation_errors_name_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make_config(**overrides)


def test_feature_validation() -> None:
    cfg = ACTConfig.tiny(
        input_features={"observation.state": {"type": "STATE", "shape": [3]}},
        output_features=OUTPUTS,
    )
    with pytest.raises(ValueError, match="observation.environment_state"):
        cfg.validate_features()
    cfg = ACTConfig.tiny(input_features=INPUTS, output_features={})
    with pytest.raises(ValueError, match="output_features must contain 'action'"):
        cfg.validate_features()
    cfg = ACTConfig.tiny(input_features={"x": {"type": "JOINTS", "shape": [3]}})
    with pytest.raises(ValueError, match="JOINTS"):
        cfg.validate_features()


def test_image_features_are_validated() -> None:
    image = {"observation.images.top": {"type": "VISUAL", "shape": [3, 96, 96]}}
    cfg = ACTConfig.tiny(input_features={**INPUTS, **image}, output_features=OUTPUTS)
    cfg.validate_features()
    assert list(cfg.image_features) == ["observation.images.top"]
    cfg.input_features = {
        **INPUTS,
        "observation.images.top": {"type": "VISUAL", "shape": [1, 9, 9]},
    }
    with pytest.raises(ValueError, match=r"RGB frames: 'observation.images.top'.*\[3, height"):
        cfg.validate_features()


def test_config_round_trip_and_type_dispatch(tmp_path: Path) -> None:
    cfg = make_config(use_vae=False, tags=["a"], repo_id="user/act")
    cfg.save_pretrained(tmp_path)
    data = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert data["type"] == "act"
    assert data["dim_model"] == ACT_TINY_PRESET["dim_model"]
    loaded = PreTrainedConfig.from_pretrained(tmp_path)
    assert type(loaded) is ACTConfig
    assert loaded == cfg
    assert ACTConfig.from_pretrained(tmp_path) == cfg


def test_config_unknown_keys_and_type(tmp_path: Path) -> None:
    make_config().save_pretrained(tmp_path)
    path = tmp_path / CONFIG_NAME
    data = json.loads(path.read_text())
    # A key of another LeRobot release is kept and written back; a bad value is refused.
    path.write_text(json.dumps({**data, "use_amp": True, "bogus": 1}))
    loaded = PreTrainedConfig.from_pretrained(tmp_path)
    assert loaded.use_amp is True and loaded.to_dict()["bogus"] == 1
    path.write_text(json.dumps({**data, "dim_model": "wide"}))
    with pytest.raises(ValueError, match=r"--policy.dim_model='wide': expected an integer") as err:
        PreTrainedConfig.from_pretrained(tmp_path)
    assert str(path) in str(err.value)
    path.write_text(json.dumps({**data, "type": "nope"}))
    with pytest.raises(ValueError, match="type='nope': unknown policy type"):
        PreTrainedConfig.from_pretrained(tmp_path)
    del data["type"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="no 'type'"):
        PreTrainedConfig.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match=CONFIG_NAME):
        PreTrainedConfig.from_pretrained(tmp_path / "missing")


def test_policy_round_trip_gives_identical_outputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = make_config()
    policy = ACTPolicy(cfg)
    policy.save_pretrained(tmp_path)
    assert (tmp_path / CONFIG_NAME).is_file() and (tmp_path / MODEL_SAFETENSORS).is_file()
    loaded = ACTPolicy.from_pretrained(tmp_path)
    assert not loaded.training
    assert loaded.config == cfg
    batch = make_batch(cfg)
    policy.eval()
    assert torch.equal(policy.predict_action_chunk(batch), loaded.predict_action_chunk(batch))
    assert torch.equal(policy(batch)[0], loaded(batch)[0])
    saved = load_file(tmp_path / MODEL_SAFETENSORS)
    assert saved.keys() == policy.state_dict().keys()
    assert all(t.dtype == torch.float32 for t in saved.values())


def test_save_given_state_dict_with_shared_storage(tmp_path: Path) -> None:
    policy = ACTPolicy(make_config())
    state_dict = policy.state_dict()
    weight = state_dict["model.action_head.weight"]
    pos = state_dict["model.decoder_pos_embed.weight"]
    # An entry viewing another's storage (as a tied or gathered dict may have), and a
    # non-contiguous one.
    state_dict["model.encoder_latent_input_proj.bias"] = weight.view(-1)[:32]
    state_dict["model.decoder_pos_embed.weight"] = pos.t().contiguous().t()
    with pytest.raises(RuntimeError):
        save_file(state_dict, tmp_path / "raw.safetensors")
    policy.save_pretrained(tmp_path, state_dict=state_dict)
    saved = load_file(tmp_path / MODEL_SAFETENSORS)
    assert torch.equal(saved["model.action_head.weight"], weight)
    assert torch.equal(saved["model.decoder_pos_embed.weight"], pos)
    assert torch.equal(saved["model.encoder_latent_input_proj.bias"], weight.view(-1)[:32])


def test_dcp_only_checkpoint_error(tmp_path: Path) -> None:
    make_config().save_pretrained(tmp_path)
    (tmp_path / MODEL_DCP_DIR).mkdir()
    with pytest.raises(FileNotFoundError) as err:
        ACTPolicy.from_pretrained(tmp_path)
    message = str(err.value)
    assert "this checkpoint holds DCP shards only" in message
    assert f"lerobot-convert-dcp --checkpoint_dir={tmp_path}" in message


def test_missing_model_file(tmp_path: Path) -> None:
    make_config().save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match=MODEL_SAFETENSORS):
        ACTPolicy.from_pretrained(tmp_path)


def test_missing_and_unexpected_keys(tmp_path: Path) -> None:
    policy = ACTPolicy(make_config())
    policy.save_pretrained(tmp_path)
    path = tmp_path / MODEL_SAFETENSORS
    tensors = load_file(path)
    del tensors["model.action_head.bias"]
    tensors["model.extra"] = torch.zeros(1)
    save_file(tensors, path)
    with pytest.raises(RuntimeError, match=r"model\.action_head\.bias.*model\.extra"):
        ACTPolicy.from_pretrained(tmp_path)
    ACTPolicy.from_pretrained(tmp_path, strict=False)


def test_shape_mismatch_names_the_file(tmp_path: Path) -> None:
    ACTPolicy(make_config()).save_pretrained(tmp_path)
    other = make_config(dim_model=64)
    with pytest.raises(RuntimeError, match=MODEL_SAFETENSORS):
        ACTPolicy.from_pretrained(tmp_path, config=other)


def test_dataset_to_policy_features() -> None:
    info_features = {
        "observation.state": {"dtype": "float32", "shape": [2], "names": None},
        "observation.environment_state": {"dtype": "float32", "shape": [16], "names": None},
        "observation.images.top": {
            "dtype": "video",
            "shape": [96, 96, 3],
            "names": ["height", "width", "channel"],
        },
        "action": {"dtype": "float32", "shape": [2], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    assert dataset_to_policy_features(info_features) == {
        "observation.state": {"type": "STATE", "shape": [2]},
        "observation.environment_state": {"type": "ENV", "shape": [16]},
        "observation.images.top": {"type": "VISUAL", "shape": [3, 96, 96]},
        "action": {"type": "ACTION", "shape": [2]},
    }
