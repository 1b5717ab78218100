"""The memory planner's state bytes are exact (issue #40): per rank, the parameters (FSDP2's
padded shards), gradients, optimizer state and EMA shadow that the plan counts for the largest
rank equal the bytes of the tensors rank 0 of a real run holds (each storage once), for ACT
(full, LoRA, EMA with bf16 mixed precision), Diffusion, SmolVLA, pi0 and pi0.5 on 1, 2 and 4
gloo ranks. Every configuration of a world size runs in one process group
(tests/memory_runs.py)."""

from __future__ import annotations

import pytest
from launch import run_distributed
from memory_runs import measure_all, tiny_smolvla_flags
from pi_tiny import paligemma_tokenizer_cache
from tiny import run_train, tiny_act_flags, tiny_diffusion_flags

from lerobot_pipe.policies.pi0 import PI_TINY_PRESET

pytestmark = pytest.mark.slow

WORLDS = (1, 2, 4)


def _pi(root, kind: str) -> list[str]:
    preset = {k: v for k, v in PI_TINY_PRESET.items() if k != "image_resolution"}
    flags = {
        "policy.type": kind,
        **{f"policy.{k}": v for k, v in preset.items()},
        "policy.image_resolution": "[56,56]",
        "dataset.root": str(root),
    }
    return [f"--{k}={v}" for k, v in flags.items()]


def _smolvla(tmp) -> list[str]:
    return tiny_smolvla_flags(tmp, num_episodes=2)


@pytest.fixture(scope="module")
def configs(dataset_root, diffusion_camera_root, tmp_path_factory):
    pytest.importorskip("transformers", reason="SmolVLA and pi need transformers")
    from lerobot_pipe.datasets import write_synthetic_dataset

    tmp = tmp_path_factory.mktemp("memory_state")
    base_out = tmp / "base"
    run_train([*tiny_act_flags(**{"dataset.root": dataset_root, "steps": 1}),
               f"--output_dir={base_out}"])  # fmt: skip
    base = base_out / "checkpoints/000001/pretrained_model"
    pi_root = write_synthetic_dataset(
        tmp / "ds56", num_episodes=2, episode_length=10, cameras=["top"], image_size=56,
        pixels_only=True, num_tasks=2,
    )  # fmt: skip
    act = tiny_act_flags(**{"dataset.root": dataset_root})
    with paligemma_tokenizer_cache(tmp / "hf"):
        yield (
            tmp,
            {
                "act": act,
                "act_lora": [
                    *act,
                    f"--policy.path={base}",
                    "--peft.method_type=LORA",
                    "--peft.r=4",
                ],
                "act_ema_bf16": [*act, "--ema.enable=true", "--accelerator.mixed_precision=bf16"],
                "diffusion": tiny_diffusion_flags(**{"dataset.root": diffusion_camera_root}),
                "smolvla": _smolvla(tmp),
                "pi0": _pi(pi_root, "pi0"),
                "pi05": _pi(pi_root, "pi05"),
            },
        )


def _launch_flags(tmp, world: int, name: str) -> list[str]:
    shard = [f"--parallelism.dp_shard={world}"] if world > 1 else []
    return [*shard, "--batch_size=2", "--steps=2", "--save_checkpoint=false",
            f"--output_dir={tmp / f'{name}_{world}'}"]  # fmt: skip


@pytest.fixture(scope="module")
def measured(configs) -> dict[int, tuple[dict, dict]]:
    """Per world size: the argv of each configuration and what each rank of the run held."""
    tmp, base = configs
    out = {}
    for world in WORLDS:
        argv = {name: [*flags, *_launch_flags(tmp, world, name)] for name, flags in base.items()}
        ranks = run_distributed(measure_all, world, argv) if world > 1 else [measure_all(argv)]
        out[world] = (argv, ranks)
    return out


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize(
    "name", ["act", "act_lora", "act_ema_bf16", "diffusion", "smolvla", "pi0", "pi05"]
)
def test_state_bytes_equal_the_tensors_of_a_real_run(measured, world, name):
    from lerobot_pipe.training.memory_plan import plan_memory

    argv, ranks = measured[world]
    state = plan_memory(argv[name], world, suggest=False).estimate.state
    real = ranks[0][name]
    assert state.parameters == real["parameters"][0], name
    assert state.parameters_local == real["parameters"][1], name
    assert state.gradients == real["gradients"][0], name
    assert state.optimizer == real["optimizer"][0], name
    assert state.ema == real["ema"][0], name
    for other in ranks[1:]:  # every rank holds the padded shards: the same storage
        assert other[name]["parameters"][0] == state.parameters
        assert other[name]["parameters"][1] <= state.parameters_local
