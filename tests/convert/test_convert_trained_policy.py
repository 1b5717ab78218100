"""Conversion of real lerobot-train checkpoints (2-rank FSDP2, plain and PEFT): the converted
folder loads with from_pretrained / load_pretrained_policy and predicts the same actions as the
weights gathered by the trainer itself."""

from __future__ import annotations

import pytest
import torch
from launch import run_distributed
from safetensors.torch import load_file
from tiny import run_train, tiny_act_flags

from lerobot_pipe.convert.dcp_to_safetensors import convert_checkpoint
from lerobot_pipe.policies.act import ACTPolicy
from lerobot_pipe.policies.factory import make_pre_post_processors
from lerobot_pipe.policies.peft import load_pretrained_policy

pytestmark = pytest.mark.torch_range


def _batch(dataset_root):
    from lerobot_pipe.datasets import LeRobotDataset

    dataset = LeRobotDataset(dataset_root)
    return {
        k: v
        for k, v in dataset.get_batch(list(range(0, 40, 5))).items()
        if k.startswith("observation.")
    }


@pytest.fixture(scope="module")
def trained(dataset_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    flags = tiny_act_flags(
        **{"dataset.root": dataset_root, "steps": 3, "save_freq": 3, "batch_size": 4}
    )
    sharded = ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp"]
    run_distributed(run_train, 2, [*flags, *sharded, f"--output_dir={root / 'plain'}"])
    base = root / "plain/checkpoints/000003/pretrained_model"
    run_distributed(
        run_train,
        2,
        [
            *flags,
            *sharded,
            f"--policy.path={base}",
            "--peft.method_type=LORA",
            "--peft.r=4",
            "--policy.optimizer_lr=1e-2",
            f"--output_dir={root / 'peft'}",
        ],
    )
    return root


def _predict(policy, pre, post, batch):
    policy.eval()
    with torch.no_grad():
        return post(policy.predict_action_chunk(pre(batch)))


def test_converted_policy_predicts_like_the_trained_one(trained, dataset_root, tmp_path):
    step = trained / "plain/checkpoints/000003"
    out = tmp_path / "converted"
    convert_checkpoint(step, output_dir=out)
    gathered = load_file(step / "pretrained_model/model.safetensors")  # written by the trainer
    converted = load_file(out / "model.safetensors")
    assert converted.keys() == gathered.keys()
    assert all(torch.equal(converted[k], gathered[k]) for k in gathered)
    pre, post = make_pre_post_processors(ACTPolicy.config_class(), pretrained_path=out)
    batch = _batch(dataset_root)
    reference = ACTPolicy.from_pretrained(step / "pretrained_model")
    assert torch.equal(
        _predict(ACTPolicy.from_pretrained(out), pre, post, batch),
        _predict(reference, pre, post, batch),
    )


def test_converted_peft_adapter_equals_the_trainers_and_merges(trained, dataset_root, tmp_path):
    step = trained / "peft/checkpoints/000003"
    out = tmp_path / "converted"
    convert_checkpoint(step, output_dir=out)
    written = load_file(step / "pretrained_model/adapter_model.safetensors")
    converted = load_file(out / "adapter_model.safetensors")
    assert converted.keys() == written.keys()
    assert all(torch.equal(converted[k], written[k]) for k in written)
    pre, post = make_pre_post_processors(ACTPolicy.config_class(), pretrained_path=out)
    batch = _batch(dataset_root)
    merged = load_pretrained_policy(out)
    base = ACTPolicy.from_pretrained(trained / "plain/checkpoints/000003/pretrained_model")
    assert torch.allclose(
        _predict(merged, pre, post, batch),
        _predict(load_pretrained_policy(step / "pretrained_model"), pre, post, batch),
    )
    assert not torch.allclose(_predict(merged, pre, post, batch), _predict(base, pre, post, batch))
