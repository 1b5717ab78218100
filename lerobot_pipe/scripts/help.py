"""``--help`` text generated from the config dataclasses, so it never drifts from the parser."""

from __future__ import annotations

import dataclasses
import typing

from lerobot_pipe.configs.train import TrainConfig


def _flags(cls: type, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name in ("resolved", "policy"):
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _flags(tp, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        name = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
        out.append(f"  --{prefix}{f.name}  ({name}, default: {default!r})")
    return out


def train_help() -> str:
    from lerobot_pipe.policies import PreTrainedConfig

    lines = [
        "usage: lerobot-train --dataset.root=DIR --policy.type=act [--flag=value ...]",
        "",
        "Flags (LeRobot's dotted names):",
        "  --config_path  (train_config.json or a checkpoint folder; flags override it)",
        "  --resume=true  (with --config_path: that checkpoint; without: the newest complete one",
        "                  of --output_dir, the flags deciding everything else)",
        "  --<flag>=null  (None where the flag allows it, else its default: undoes a value",
        "                  loaded from --config_path)",
        "  --policy.type  (one of: " + ", ".join(PreTrainedConfig.known_choices()) + ")",
        "  --policy.path  (pretrained policy folder or Hub repo id)",
        *_flags(TrainConfig),
    ]
    for name in PreTrainedConfig.known_choices():
        lines += ["", f"Policy fields for --policy.type={name}:"]
        lines += _flags(PreTrainedConfig.get_choice_class(name), "policy.")
    return "\n".join(lines)
