"""The accelerate environment guard: neutral variables pass, configuration is refused."""

from __future__ import annotations

import pytest

from lerobot_pipe.distributed.env_guard import AccelerateEnvError, check_accelerate_env

# What a plain `accelerate launch` exports (measured with accelerate 1.15).
PLAIN_LAUNCH = {
    "ACCELERATE_DYNAMO_BACKEND": "NO",
    "ACCELERATE_DYNAMO_MODE": "default",
    "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False",
    "ACCELERATE_MIXED_PRECISION": "no",
}


def test_plain_launch_environment_is_accepted():
    assert check_accelerate_env(PLAIN_LAUNCH) == []


@pytest.mark.parametrize(
    ("var", "value", "flag"),
    [
        ("ACCELERATE_USE_FSDP", "true", "--parallelism.dp_shard"),
        ("FSDP_SHARDING_STRATEGY", "FULL_SHARD", "--accelerator.fsdp"),
        ("ACCELERATE_USE_PARALLELISM_CONFIG", "true", "--parallelism.dp_replicate"),
        (
            "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
            "4",
            "--accelerator.gradient_accumulation.steps",
        ),
        ("ACCELERATE_MIXED_PRECISION", "bf16", "--accelerator.mixed_precision"),
    ],
)
def test_config_carrying_variable_is_refused_with_the_flag(var, value, flag):
    with pytest.raises(AccelerateEnvError) as err:
        check_accelerate_env({**PLAIN_LAUNCH, var: value})
    assert f"{var}={value}" in str(err.value) and flag in str(err.value)
    assert "LEROBOT_ALLOW_ACCELERATE_ENV=1" in str(err.value)


def test_override_acknowledges():
    env = {**PLAIN_LAUNCH, "ACCELERATE_USE_FSDP": "true", "LEROBOT_ALLOW_ACCELERATE_ENV": "1"}
    assert check_accelerate_env(env) == ["ACCELERATE_USE_FSDP"]
