"""PEFT (LoRA) fine-tuning under single process, DDP, FSDP2 and HSDP: the frozen base stays
unchanged, the adapters train, checkpoints hold the adapter only, and resume works."""

from __future__ import annotations

import json
import os

import pytest
import torch
from launch import run_distributed
from safetensors.torch import load_file
from tiny import losses, run_train, tiny_act_flags

from lerobot_pipe.distributed.runtime import destroy, init_distributed
from lerobot_pipe.policies.peft import load_pretrained_policy
from lerobot_pipe.training.loop import run_loop
from lerobot_pipe.training.preflight import make_plan
from lerobot_pipe.training.session import prepare_session

pytestmark = pytest.mark.torch_range

TOPOLOGIES = {
    "single": (1, 8, []),
    "ddp2": (2, 4, []),
    "fsdp2": (2, 4, ["--parallelism.dp_shard=2"]),
    "hsdp": (4, 2, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"]),
}


@pytest.fixture(scope="module")
def base_policy(dataset_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("base") / "out"
    run_train(
        [
            *tiny_act_flags(**{"dataset.root": dataset_root, "steps": 4, "save_freq": 4}),
            f"--output_dir={out}",
        ]
    )
    return out / "checkpoints/000004/pretrained_model"


def train_and_gather(argv):
    plan = make_plan(argv, int(os.environ.get("WORLD_SIZE", "1")), os.environ)
    env = init_distributed()
    try:
        session = prepare_session(plan, env)
        run_loop(env, session)
        state = {k: v.clone() for k, v in session.state.model.full_state_dict().items()}
    finally:
        destroy()
    return state if env.is_main else None


def _peft_flags(dataset_root, base, out, batch):
    return [
        *tiny_act_flags(
            **{
                "dataset.root": dataset_root,
                "steps": 4,
                "save_freq": 4,
                "batch_size": batch,
                "policy.optimizer_lr": 1e-2,
            }
        ),
        f"--policy.path={base}",
        "--peft.method_type=LORA",
        "--peft.r=4",
        f"--output_dir={out}",
    ]


@pytest.mark.parametrize(
    "topology",
    # HSDP (sharded and replicated) on the torch range's ends; the others on the pinned torch
    [pytest.param(t, marks=() if t == "hsdp" else pytest.mark.one_torch) for t in TOPOLOGIES],
)
def test_peft_trains_adapters_only(dataset_root, base_policy, tmp_path, topology):
    world, batch, extra = TOPOLOGIES[topology]
    argv = [*_peft_flags(dataset_root, base_policy, tmp_path / "out", batch), *extra]
    states = (
        [train_and_gather(argv)] if world == 1 else run_distributed(train_and_gather, world, argv)
    )
    state = states[0]
    base = load_file(base_policy / "model.safetensors")
    for key, value in base.items():
        module, _, leaf = key.rpartition(".")
        candidates = [f"base_model.model.{key}", f"base_model.model.{module}.base_layer.{leaf}"]
        found = [c for c in candidates if c in state]
        assert found, key
        assert torch.equal(state[found[0]], value), f"frozen base weight {key} changed"
    lora_b = [k for k in state if ".lora_B." in k]
    assert lora_b and any(state[k].abs().sum() > 0 for k in lora_b), "adapters did not train"

    ckpt = tmp_path / "out/checkpoints/000004/pretrained_model"
    assert (ckpt / "adapter_model.safetensors").is_file() and not (
        ckpt / "model.safetensors"
    ).exists()
    adapter_config = json.loads((ckpt / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(base_policy)
    assert all("lora_" in k for k in load_file(ckpt / "adapter_model.safetensors"))
    merged = load_pretrained_policy(ckpt)
    assert not merged.training


def test_peft_resume_continues(dataset_root, base_policy, tmp_path):
    argv = _peft_flags(dataset_root, base_policy, tmp_path / "out", 4)
    run_distributed(run_train, 2, [*argv, "--parallelism.dp_shard=2"])
    run_distributed(
        run_train,
        2,
        [
            "--resume=true",
            f"--config_path={tmp_path / 'out/checkpoints/last'}",
            "--steps=8",
            "--save_freq=8",
        ],
    )
    curve = losses(tmp_path / "out")
    assert set(curve) == set(range(1, 9))
    assert (
        tmp_path / "out/checkpoints/000008/pretrained_model/adapter_model.safetensors"
    ).is_file()


def test_peft_needs_a_base_policy(dataset_root, tmp_path, capsys):
    from lerobot_pipe.scripts.train import main

    assert (
        main(
            [
                *tiny_act_flags(**{"dataset.root": dataset_root}),
                "--peft.method_type=LORA",
                f"--output_dir={tmp_path}/o",
            ]
        )
        == 2
    )
    assert "pass --policy.path" in capsys.readouterr().err


def test_peft_unknown_target_module(dataset_root, base_policy, tmp_path, capsys):
    from lerobot_pipe.scripts.train import main

    argv = [
        *_peft_flags(dataset_root, base_policy, tmp_path / "o", 8),
        '--peft.target_modules=["q_proj"]',
    ]
    assert main(argv) == 2
    assert "q_proj match no module name" in capsys.readouterr().err
