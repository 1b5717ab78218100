"""Policies and processors across the two: every checkpoint, whoever wrote it, loads in the other
the way lerobot-eval loads it and acts the same; the same weights and batch give the same seeded
training loss and gradients; the same LoRA flags give the same adapter."""

from __future__ import annotations

import json

import pytest
import torch
from interop_helpers import RENAME_MAP, our_actions, our_loss, pretrained

pytestmark = pytest.mark.interop

ATOL = 1e-5
CHECKPOINTS = ["le_single", "le_ddp", "le_lora", "our_single", "our_ddp", "our_fsdp", "our_lora"]


def _close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_same_actions_with_lerobot_eval_processors(name, lerobot_reads, inputs):
    """LeRobot (make_policy + make_pre_post_processors with lerobot-eval's overrides) and
    lerobot_pipe load the checkpoint and turn one raw observation into the same actions."""
    theirs = lerobot_reads.results.tensors(f"{name}.actions.safetensors")
    meta = lerobot_reads.results.meta(f"{name}.actions.safetensors")
    ours = our_actions(lerobot_reads.loadable[name], inputs.observation)

    assert meta["preprocessor_steps"] == [
        "RenameObservationsProcessorStep",
        "AddBatchDimensionProcessorStep",
        "DeviceProcessorStep",
        "NormalizerProcessorStep",
    ]
    assert meta["postprocessor_steps"] == ["UnnormalizerProcessorStep", "DeviceProcessorStep"]
    for key, value in ours.pre.items():
        _close(value, theirs[f"pre/{key}"], f"preprocessed {key}")
    _close(ours.chunk, theirs["chunk"], "predict_action_chunk")
    _close(ours.action, theirs["action"], "select_action")
    _close(ours.action_unnormalized, theirs["action_unnormalized"], "postprocessed action")
    if name.endswith("lora"):
        # LeRobot took the PEFT path (config.json's use_peft) and the adapter changes the actions,
        # so equality above means both sides applied it.
        assert meta["policy_class"] == "PeftModel" and meta["use_peft"]
        assert (theirs["chunk"] - theirs["chunk_without_adapter"]).abs().max() > 100 * ATOL


@pytest.mark.parametrize("name", ["le_single", "our_single"])
def test_rename_map_override_renames_the_same(name, lerobot_reads, inputs):
    """lerobot-eval's --rename_map (the rename step's override) maps a robot's own key names onto
    the policy's in both, with the same actions as the policy's own names give."""
    theirs = lerobot_reads.results.tensors(f"{name}.renamed_actions.safetensors")
    ours = our_actions(lerobot_reads.loadable[name], inputs.renamed_observation, RENAME_MAP)
    assert set(ours.pre) == set(RENAME_MAP.values())
    _close(ours.chunk, theirs["chunk"], "predict_action_chunk")
    plain = lerobot_reads.results.tensors(f"{name}.actions.safetensors")
    _close(ours.chunk, plain["chunk"], "renamed vs plain observation")


@pytest.mark.parametrize("name", ["le_single", "our_single"])
def test_same_seeded_training_loss_and_gradients(name, lerobot_reads, inputs):
    """Same weights, same raw batch (padded action steps included), same seed before the forward
    pass (dropout and VAE sampling on): LeRobot's ACT and ours give the same loss, loss parts and
    gradient of every parameter."""
    theirs = lerobot_reads.results.tensors(f"{name}.loss.safetensors")
    loss, parts, grads = our_loss(lerobot_reads.loadable[name], inputs.batch)

    _close(loss, theirs["loss"], "loss")
    assert {f"part/{k}" for k in parts} == {k for k in theirs if k.startswith("part/")}
    for key, value in parts.items():
        assert value == pytest.approx(float(theirs[f"part/{key}"]), abs=ATOL), key
    their_grads = {k.removeprefix("grad/"): v for k, v in theirs.items() if k.startswith("grad/")}
    assert set(grads) == set(their_grads)
    for key, value in grads.items():
        _close(value, their_grads[key], f"gradient of {key}")


def test_same_lora_flags_same_adapter(lerobot_ckpts, our_ckpts):
    """`--policy.path=<base> --peft.r=4` (LeRobot needs the targets named) builds the same LoRA
    adapter in both: rank, alpha (peft's default when --peft.lora_alpha is unset), targets,
    dropout, initialization."""
    keys = ("r", "lora_alpha", "lora_dropout", "bias", "modules_to_save", "init_lora_weights")
    theirs = json.loads((pretrained(lerobot_ckpts.lora) / "adapter_config.json").read_text())
    ours = json.loads((pretrained(our_ckpts.lora) / "adapter_config.json").read_text())
    assert {k: ours[k] for k in keys} == {k: theirs[k] for k in keys}
    assert sorted(ours["target_modules"]) == sorted(theirs["target_modules"])
    assert ours["peft_type"] == theirs["peft_type"] == "LORA"
