"""config.json and train_config.json across the two: LeRobot's own decoder (draccus) reads ours,
the same flags write the same files, and the defaults are LeRobot's (the differences named)."""

from __future__ import annotations

import json

import pytest
from interop_helpers import EXTENSION_KEYS, json_diff, pretrained

pytestmark = pytest.mark.interop

# What LeRobot fills in while decoding (its __post_init__ picks them for this machine).
RESOLVED_BY_LEROBOT = {"policy.device", "eval.batch_size"}


@pytest.mark.parametrize("name", ["our_single", "our_ddp", "our_fsdp", "our_lora"])
def test_lerobot_decodes_our_train_config(name, lerobot_reads):
    """TrainPipelineConfig.from_pretrained (what --config_path runs) decodes our train_config.json
    once the three documented extra keys are removed, and every value comes through unchanged."""
    decoded = lerobot_reads.results.json(f"{name}.tc.json")
    ours = json.loads(lerobot_reads.stripped[name].read_text())
    differences = json_diff(ours, decoded)
    assert set(differences) <= RESOLVED_BY_LEROBOT, differences


def test_lerobot_061_refuses_the_documented_extra_keys(lerobot_reads):
    """The three top-level keys from LeRobot's current docs stay in our train_config.json; LeRobot
    0.6.1's decoder refuses them (docs/compatibility.md says to remove them for it)."""
    for name in lerobot_reads.resumable:
        error = lerobot_reads.results.error(f"{name}.tc_unstripped.json")
        assert error is not None and "DecodingError" in error, name
        assert all(f"`{key}`" in error for key in EXTENSION_KEYS), error


def test_same_flags_same_files(lerobot_ckpts, our_ckpts):
    """The same flags (incl. --optimizer.* that the policy preset replaces in both) write the same
    train_config.json, config.json and processor files as LeRobot, but for the paths, what LeRobot
    resolves for this machine, and our documented extension keys."""
    theirs, ours = pretrained(lerobot_ckpts.single), pretrained(our_ckpts.single)

    def load(folder, name):
        return json.loads((folder / name).read_text())

    config = json_diff(load(ours, "train_config.json"), load(theirs, "train_config.json"))
    expected = {"output_dir", "dataset.repo_id", *RESOLVED_BY_LEROBOT, *EXTENSION_KEYS}
    assert set(config) == expected, config
    assert all(config[k][1] == "<absent>" for k in EXTENSION_KEYS)
    assert load(ours, "train_config.json")["optimizer"]["lr"] == 1e-3  # the preset, not 0.5
    assert set(json_diff(load(ours, "config.json"), load(theirs, "config.json"))) == {"device"}
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        assert load(ours, name) == load(theirs, name)
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())


def test_defaults_are_lerobots(lerobot_reads):
    """Every field of LeRobot's ACTConfig and TrainPipelineConfig exists here with LeRobot's
    default, except the differences docs/compatibility.md lists."""
    from lerobot_pipe.configs.parser import to_dict
    from lerobot_pipe.configs.train import TrainConfig
    from lerobot_pipe.policies.act import ACTConfig

    theirs = lerobot_reads.results.json("defaults.json")
    # draccus leaves the type out when encoding a policy config class itself.
    policy = json_diff(to_dict(ACTConfig()), {"type": "act", **theirs["policy"]})
    assert set(policy) == {"device", "push_to_hub"}, policy
    assert policy["device"][0] is None  # picked at run time here; LeRobot resolves it at once
    # Ours defaults to False, so that a run without --policy.repo_id does not fail.
    assert policy["push_to_hub"] == (False, True)
    train = json_diff(to_dict(TrainConfig()), theirs["train"])
    # Required by LeRobot (no default), optional beside --dataset.root here.
    assert train.pop("dataset.repo_id") == (None, "any/name")
    for key in RESOLVED_BY_LEROBOT | {"dataset.video_backend"}:  # what imports on this machine
        train.pop(key, None)
    assert set(train) == set(EXTENSION_KEYS), train
    assert all(theirs == "<absent>" for _, theirs in train.values())
