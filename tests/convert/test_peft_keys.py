"""adapter_key_map selects and renames exactly what peft.get_peft_model_state_dict does."""

from __future__ import annotations

import pytest
import torch

from lerobot_pipe.convert import ConversionError, adapter_key_map
from lerobot_pipe.convert import dcp_to_safetensors as mod

peft = pytest.importorskip("peft")


def _config_dict(config) -> dict:
    d = config.to_dict()
    d["peft_type"] = str(getattr(config.peft_type, "value", config.peft_type))
    return d


def _check(model, config, adapter_name=None):
    from peft import get_peft_model_state_dict

    state = model.state_dict()
    want = get_peft_model_state_dict(model, adapter_name=adapter_name or "default")
    mapping = adapter_key_map(state, _config_dict(config), adapter_name=adapter_name)
    assert sorted(mapping) == sorted(want)
    for dst, src in mapping.items():
        assert torch.equal(state[src], want[dst]), (src, dst)


TARGETS = ["linear1", "linear2", "input_proj"]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(target_modules=TARGETS),
        dict(target_modules=TARGETS, modules_to_save=["action_head"]),
        dict(target_modules=TARGETS, bias="all", modules_to_save=["action_head"]),
        dict(target_modules=TARGETS, bias="lora_only"),
        dict(target_modules=TARGETS, use_dora=True),
        dict(target_modules=TARGETS, lora_bias=True),
    ],
    ids=["plain", "modules_to_save", "bias_all", "bias_lora_only", "dora", "lora_bias"],
)
@pytest.mark.filterwarnings("ignore:.*invalid shape")  # peft's check of lora_B biases
def test_lora_key_map_matches_peft(kwargs, tiny_policy_cls):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, **kwargs)
    _check(get_peft_model(tiny_policy_cls(), config), config)


def test_two_adapters_pick_default_or_the_named_one(tiny_policy_cls):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, target_modules=TARGETS, modules_to_save=["action_head"])
    model = get_peft_model(tiny_policy_cls(), config)
    model.add_adapter("other", LoraConfig(r=2, target_modules=["linear1"]))
    _check(model, config)
    _check(model, model.peft_config["other"], adapter_name="other")


@pytest.mark.parametrize("kind", ["IA3", "LOHA"])
def test_other_tuner_types_use_peft_layer_names(kind, tiny_policy_cls):
    from peft import IA3Config, LoHaConfig, get_peft_model

    torch.manual_seed(0)
    if kind == "IA3":
        config = IA3Config(target_modules=["linear1", "linear2"], feedforward_modules=["linear2"])
    else:
        config = LoHaConfig(r=4, target_modules=TARGETS)
    _check(get_peft_model(tiny_policy_cls(), config), config)


def test_lora_layer_names_match_peft():
    from peft.tuners.lora import LoraLayer

    assert tuple(LoraLayer.adapter_layer_names) == mod._LORA_LAYER_NAMES


def test_no_adapter_tensors_is_an_error():
    state = {"model.a.weight": torch.zeros(1)}
    with pytest.raises(ConversionError, match="no LORA adapter tensors"):
        adapter_key_map(state, {"peft_type": "LORA"})
    with pytest.raises(ConversionError, match="not supported"):
        adapter_key_map(state, {"peft_type": "PROMPT_TUNING"})


def _save_single_process_dcp(state: dict, dcp_dir) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(dcp_dir), no_dist=True)


@pytest.mark.parametrize("generic", [False, True], ids=["direct", "generic"])
def test_convert_peft_with_shared_sources(tmp_path, tiny_policy_cls, monkeypatch, caplog, generic):
    """bias="all" + modules_to_save: one DCP tensor feeds two adapter entries."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import load_file

    from lerobot_pipe import constants as C
    from lerobot_pipe.convert import convert_checkpoint

    torch.manual_seed(0)
    config = LoraConfig(r=4, target_modules=TARGETS, bias="all", modules_to_save=["action_head"])
    model = get_peft_model(tiny_policy_cls(), config)
    pretrained = tmp_path / C.PRETRAINED_MODEL_DIR
    _save_single_process_dcp(model.state_dict(), pretrained / C.MODEL_DCP_DIR)
    config.save_pretrained(str(pretrained))
    if generic:
        monkeypatch.setattr(mod, "_direct_layout", lambda *a, **k: None)
    caplog.set_level("INFO")
    out = convert_checkpoint(tmp_path, delete_dcp=True)
    assert ("generic DCP loader" in caplog.text) == generic
    got, want = load_file(str(out)), get_peft_model_state_dict(model)
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("generic", [False, True], ids=["direct", "generic"])
def test_convert_mixed_dtypes(tmp_path, monkeypatch, caplog, generic):
    from safetensors.torch import load_file

    from lerobot_pipe import constants as C
    from lerobot_pipe.convert import convert_checkpoint

    state = {
        "a.weight": torch.randn(5, 3),
        "b.weight": torch.randn(4, 2).to(torch.bfloat16),
        "c.count": torch.tensor(7, dtype=torch.int64),
        "d.mask": torch.tensor([True, False, True]),
        "e.half": torch.randn(3).half(),
        "f.empty": torch.zeros(0, 4),
        "g.scalar": torch.tensor(1.5),
    }
    _save_single_process_dcp(state, tmp_path / C.MODEL_DCP_DIR)
    if generic:
        monkeypatch.setattr(mod, "_direct_layout", lambda *a, **k: None)
    caplog.set_level("INFO")
    out = convert_checkpoint(tmp_path, delete_dcp=True)
    assert ("generic DCP loader" in caplog.text) == generic
    got = load_file(str(out))
    assert sorted(got) == sorted(state)
    for k, v in state.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
