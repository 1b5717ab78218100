"""lerobot-train's flags -> :class:`TrainConfig`: a saved train_config.json (``--config_path``,
lerobot_pipe's older files upgraded), a pretrained policy's config (``--policy.path``), then the
flags over them. Values are checked afterwards (:meth:`TrainConfig.validate`)."""

from __future__ import annotations

import typing
from pathlib import Path

from lerobot_pipe import constants as C
from lerobot_pipe.configs.parser import (
    ConfigError,
    apply_flags,
    from_dict,
    read_json,
    split_flags,
    to_dict,
)
from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.configs.train import TrainConfig
from lerobot_pipe.utils.locate import (
    checkpoint_step_dir,
    download_latest_checkpoint,
    local_policy_folder,
    pretrained_dir,
)
from lerobot_pipe.utils.repo_id import looks_like_repo_id


def parse_train_config(argv: list[str]) -> tuple[TrainConfig, Path | None]:
    """Flags -> TrainConfig. ``--config_path`` (a train_config.json, a checkpoint folder or its
    pretrained_model/, or a Hub repo id holding ``checkpoints/<step>/``) loads a saved config
    first; flags override it, ``--field=null`` resets a field to its default. Returns the config
    and the checkpoint step folder ``--config_path`` pointed into (if any)."""
    flags = split_flags(argv)
    config_path = flags.pop("config_path", None)
    implementation = flags.pop("policy.implementation", None)
    if implementation == "lerobot" and flags.get("policy.type"):
        # LeRobot's class from the start, so that each --policy.* flag is one of its fields.
        flags["policy.type"] = f"lerobot:{flags['policy.type']}"
    source_step: Path | None = None
    if config_path is not None:
        path = _config_file(config_path, flags.get("output_dir"))
        data = read_json(path, "--config_path")
        cfg = from_dict(TrainConfig, _upgrade_legacy(data), lenient=True)
        source_step = checkpoint_step_dir(path.parent)
    else:
        cfg = TrainConfig()

    policy_path = flags.pop("policy.path", None)
    if policy_path is not None:
        revision = flags.get("policy.pretrained_revision")
        try:
            local = local_policy_folder(policy_path, revision=revision)
            loaded = PreTrainedConfig.from_pretrained(local)
        except (ValueError, OSError) as e:
            raise ConfigError(f"--policy.path={policy_path}: {e}") from None
        policy_type = flags.get("policy.type")
        if policy_type is not None and policy_type != loaded.type:
            raise ConfigError(
                f"--policy.type={policy_type} contradicts --policy.path={policy_path} "
                f"(a {loaded.type} policy); drop one of them"
            )
        cfg.policy = loaded
        cfg.policy.pretrained_path = str(local)
    apply_flags(cfg, flags)
    if implementation is not None:
        cfg.policy = _implemented_by(cfg.policy, implementation)
    if cfg.policy is not None and cfg.peft is None and policy_path is not None:
        # Fine-tuning a LoRA checkpoint without --peft trains its merged weights in full.
        cfg.policy.use_peft = False
    if cfg.policy is not None:
        try:
            cfg.policy.__post_init__()
        except ValueError as e:
            raise ConfigError(f"--policy.*: {e}") from None
    return cfg, source_step


def _implemented_by(policy: PreTrainedConfig | None, implementation: str) -> PreTrainedConfig:
    """``--policy.implementation``: ``lerobot_pipe`` (the default: ours where we implement the
    type, else LeRobot's) or ``lerobot`` (LeRobot's own class, installed beside us). Not a field
    of any config: it is never written, so a resumed or reloaded run names it again."""
    choices = ("lerobot_pipe", "lerobot")
    if implementation not in choices:
        raise ConfigError(
            f"--policy.implementation={implementation!r}: choose one of {', '.join(choices)}"
        )
    if policy is None:
        raise ConfigError("--policy.implementation needs --policy.type or --policy.path")
    is_lerobots = type(policy).__module__.startswith("lerobot_pipe.policies.lerobot_bridge")
    if (implementation == "lerobot") == is_lerobots:
        return policy
    name = f"lerobot:{policy.type}" if implementation == "lerobot" else policy.type
    try:
        cls = PreTrainedConfig.get_choice_class(name)
    except ValueError as e:
        raise ConfigError(f"--policy.implementation={implementation}: {e}") from None
    if implementation == "lerobot_pipe" and cls.__module__ == type(policy).__module__:
        raise ConfigError(
            f"--policy.implementation=lerobot_pipe: lerobot_pipe does not implement "
            f"{policy.type!r} (LeRobot's policy)"
        )
    data = to_dict(policy)
    data["type"] = name
    # A flag one class types bool and the other int (ACT's replace_final_stride_with_dilation:
    # LeRobot's int, ours bool) carries over as the other's type.
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        if isinstance(value, bool) and hints.get(key) in (int, int | None):
            data[key] = int(value)
    try:
        return from_dict(PreTrainedConfig, data, "policy.", lenient=True)
    except (ConfigError, ValueError) as e:
        raise ConfigError(f"--policy.implementation={implementation}: {e}") from None


def _upgrade_legacy(data: dict) -> dict:
    """lerobot_pipe's train_config.json before it was LeRobot's: ``resolved`` beside the config,
    disabled groups as objects with a null choice, optimizer values null for the preset."""
    data = dict(data)
    data.pop("resolved", None)
    if isinstance(data.get("scheduler"), dict) and data["scheduler"].get("type") is None:
        data["scheduler"] = None
    if isinstance(data.get("peft"), dict) and data["peft"].get("method_type", "LORA") is None:
        data["peft"] = None
    optimizer = data.get("optimizer")
    if isinstance(optimizer, dict) and None in (optimizer.get("lr"), optimizer.get("weight_decay")):
        data["optimizer"] = None
    return data


def _config_file(config_path: str, output_dir: str | None) -> Path:
    """The train_config.json that --config_path names. A Hub repo id (LeRobot's
    ``--save_checkpoint_to_hub`` layout) has its newest ``checkpoints/<step>/`` downloaded into
    the run's output folder first, as LeRobot does."""
    path = Path(config_path)
    if path.is_dir():
        return pretrained_dir(path) / C.TRAIN_CONFIG_NAME
    if not looks_like_repo_id(config_path):
        return path
    if output_dir is None:
        raise ConfigError(
            f"--config_path={config_path}: resuming from a Hub repository needs --output_dir "
            "(where its newest checkpoint is downloaded and the run continues)"
        )
    try:
        step_dir = download_latest_checkpoint(config_path, Path(output_dir))
    except (ValueError, OSError) as e:
        raise ConfigError(f"--config_path={config_path}: {e}") from None
    return step_dir / C.PRETRAINED_MODEL_DIR / C.TRAIN_CONFIG_NAME
