"""Refuse configuration that would reach accelerate through ACCELERATE_* variables.

The config is the single source of truth. A plain ``accelerate launch`` exports a few neutral
variables (dynamo settings, ``ACCELERATE_MIXED_PRECISION=no``); those are accepted. Variables that
would switch on FSDP, a parallelism layout, mixed precision or gradient accumulation behind the
config's back are refused, naming the flags to use instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from lerobot_pipe.constants import ENV_ALLOW_ACCELERATE

# Variable (or prefix ending in "_") -> the lerobot-train flags that express the same thing.
_CONFIG_CARRYING: dict[str, str] = {
    "ACCELERATE_USE_FSDP": "--parallelism.dp_shard=N and --accelerator.fsdp.*",
    "FSDP_": "--accelerator.fsdp.*",
    "ACCELERATE_USE_PARALLELISM_CONFIG": "--parallelism.dp_replicate / --parallelism.dp_shard",
    "PARALLELISM_CONFIG_": "--parallelism.dp_replicate / --parallelism.dp_shard",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "--accelerator.gradient_accumulation.steps",
    "ACCELERATE_MIXED_PRECISION": "--accelerator.mixed_precision",
    "ACCELERATE_DOWNCAST_BF16": "--accelerator.mixed_precision",
    "ACCELERATE_USE_DEEPSPEED": "--parallelism.* (DeepSpeed is not supported)",
    "ACCELERATE_DEEPSPEED_": "--parallelism.* (DeepSpeed is not supported)",
    "ACCELERATE_USE_MEGATRON_LM": "--parallelism.* (Megatron-LM is not supported)",
    "ACCELERATE_TORCH_DYNAMO_": "(torch.compile is not configurable yet)",
}

# Values a plain `accelerate launch` exports that configure nothing.
_NEUTRAL_VALUES: dict[str, set[str]] = {
    "ACCELERATE_MIXED_PRECISION": {"no"},
    "ACCELERATE_USE_FSDP": {"false", "0"},
    "ACCELERATE_USE_DEEPSPEED": {"false", "0"},
    "ACCELERATE_USE_MEGATRON_LM": {"false", "0"},
    "ACCELERATE_USE_PARALLELISM_CONFIG": {"false", "0"},
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": {"1"},
    "ACCELERATE_DOWNCAST_BF16": {"false", "0", "no"},
}


class AccelerateEnvError(RuntimeError):
    pass


def find_config_carrying_vars(env: Mapping[str, str]) -> dict[str, str]:
    """Return {variable: flags to use instead} for every configuration-carrying variable."""
    found: dict[str, str] = {}
    for name, value in env.items():
        for key, instead in _CONFIG_CARRYING.items():
            matches = name.startswith(key) if key.endswith("_") else name == key
            if matches and value.strip().lower() not in _NEUTRAL_VALUES.get(name, set()):
                found[name] = instead
                break
    return found


def check_accelerate_env(env: Mapping[str, str]) -> list[str]:
    """Raise AccelerateEnvError if the environment carries configuration; return the names of
    acknowledged variables when LEROBOT_ALLOW_ACCELERATE_ENV=1 lets them through."""
    found = find_config_carrying_vars(env)
    if not found:
        return []
    if env.get(ENV_ALLOW_ACCELERATE, "").strip().lower() in {"1", "true", "yes"}:
        return sorted(found)
    lines = "\n".join(f"  {name}={env[name]}  ->  use {found[name]}" for name in sorted(found))
    raise AccelerateEnvError(
        "the environment carries accelerate configuration that lerobot-train would not see in "
        f"its config:\n{lines}\nPass the flags instead (e.g. drop the accelerate config file or "
        f"launch with a plain `accelerate launch`), or set {ENV_ALLOW_ACCELERATE}=1 to acknowledge "
        "and continue; the config's flags still decide what runs."
    )
