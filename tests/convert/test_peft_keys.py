"""adapter_model.safetensors holds exactly what peft.get_peft_model_state_dict gives, for every
PEFT variant: the converter builds the policy on the meta device, wraps it as adapter_config.json
says and asks peft for the names (nothing of peft's naming rules is repeated)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from lerobot_pipe import constants as C
from lerobot_pipe.convert import ConversionError, convert_checkpoint

peft = pytest.importorskip("peft")

TARGETS = ["linear1", "linear2", "encoder_env_state_input_proj"]


def _wrapped(make_act, config):
    from peft import get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(make_act(), config)
    with torch.no_grad():  # adapters start at zero (lora_B) or one (IA3): make every value count
        for p in model.parameters():
            p.normal_()
    return model


def _assert_converts_like_peft(model, step) -> None:
    from peft import get_peft_model_state_dict

    out = convert_checkpoint(step, delete_dcp=True)
    assert out.name == C.ADAPTER_SAFETENSORS
    got, want = load_file(str(out)), get_peft_model_state_dict(model)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


def _lora(**kwargs):
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, **kwargs)


@pytest.mark.parametrize(
    "make_config",
    [
        lambda: _lora(target_modules=TARGETS),
        lambda: _lora(target_modules=TARGETS, modules_to_save=["action_head"]),
        # One DCP tensor feeds two adapter entries (peft saves the modules_to_save bias twice).
        lambda: _lora(target_modules=TARGETS, bias="all", modules_to_save=["action_head"]),
        lambda: _lora(target_modules=TARGETS, bias="lora_only"),
        lambda: _lora(target_modules=TARGETS, use_dora=True),
        lambda: _lora(target_modules=TARGETS, lora_bias=True),
        lambda: peft.IA3Config(
            target_modules=["linear1", "linear2"], feedforward_modules=["linear2"]
        ),
        lambda: peft.LoHaConfig(r=4, target_modules=TARGETS),
    ],
    ids=[
        "plain",
        "modules_to_save",
        "bias_all",
        "bias_lora_only",
        "dora",
        "lora_bias",
        "ia3",
        "loha",
    ],
)
@pytest.mark.filterwarnings("ignore:.*invalid shape")  # peft's check of lora_B biases
def test_adapter_file_is_what_peft_saves(make_config, make_act, peft_step_of):
    model = _wrapped(make_act, make_config())
    _assert_converts_like_peft(model, peft_step_of(model))


def test_two_adapters_in_the_dcp_convert_the_configured_one(make_act, peft_step_of):
    model = _wrapped(make_act, _lora(target_modules=TARGETS, modules_to_save=["action_head"]))
    model.add_adapter("other", _lora(target_modules=["linear1"]))
    _assert_converts_like_peft(model, peft_step_of(model))


def _edit_json(path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_unknown_policy_type_is_named(make_act, peft_step_of):
    step = peft_step_of(_wrapped(make_act, _lora(target_modules=TARGETS)))
    config = step / C.PRETRAINED_MODEL_DIR / C.CONFIG_NAME
    _edit_json(config, type="tiny")
    with pytest.raises(ConversionError, match=f"cannot build the policy of {config}"):
        convert_checkpoint(step)
    assert not (step / C.PRETRAINED_MODEL_DIR / C.ADAPTER_SAFETENSORS).exists()


@pytest.mark.filterwarnings("ignore:Unexpected keyword arguments")  # LoRA keys, prompt config
def test_adapter_config_that_does_not_match_the_dcp(make_act, peft_step_of):
    step = peft_step_of(_wrapped(make_act, _lora(target_modules=["linear1"])))
    adapter_config = step / C.PRETRAINED_MODEL_DIR / C.ADAPTER_CONFIG_NAME
    _edit_json(adapter_config, target_modules=["linear1", "linear2"])
    with pytest.raises(ConversionError, match=r"has no entry .*linear2.*do not describe"):
        convert_checkpoint(step)
    _edit_json(adapter_config, peft_type="PROMPT_TUNING", num_virtual_tokens=4)
    with pytest.raises(ConversionError, match=f"cannot apply {adapter_config}"):
        convert_checkpoint(step)
    assert not (step / C.PRETRAINED_MODEL_DIR / C.ADAPTER_SAFETENSORS).exists()
