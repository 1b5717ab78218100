"""LeRobot-style dotted CLI flags onto nested dataclasses, and configs to and from JSON.

``--a.b=value`` and ``--a.b value`` both work. A flag names a dataclass field by its dotted path;
the value is converted to the field's annotated type. ``null`` (or ``none``) is None for a field
that accepts None (as in LeRobot: ``--policy.pretrained_backbone_weights=null``) and the field's
default for any other, so ``--steps=null`` undoes a value loaded with ``--config_path``. Unknown
flags, wrong types and impossible choices raise :class:`ConfigError`, whose message names the
flag and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from pathlib import Path
from typing import Any, Union

from lerobot_pipe.policies.pretrained import PreTrainedConfig


class ConfigError(ValueError):
    """A bad flag, config file or config value. The message is meant for the user as it is."""


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_NONE = {"none", "null"}


def split_flags(argv: list[str]) -> dict[str, str]:
    """``["--a.b=1", "--c", "2"]`` -> ``{"a.b": "1", "c": "2"}``. Repeated flags: last one wins."""
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(
                f"unexpected argument {arg!r}: every option is a flag like --steps=1000"
            )
        body = arg[2:]
        if "=" in body:
            key, value = body.split("=", 1)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            key, value = body, argv[i + 1]
            i += 1
        else:
            key, value = body, "true"
        flags[key.replace("-", "_") if "." not in key else key] = value
        i += 1
    return flags


def _is_null(raw: Any) -> bool:
    return raw is None or (isinstance(raw, str) and raw.strip().lower() in _NONE)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _describe(tp: Any) -> str:
    tp, optional = _unwrap_optional(tp)
    name = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp)
    if name is None:
        origin = typing.get_origin(tp)
        name = {list: "a JSON list", dict: "a JSON object"}.get(origin or tp, str(tp))
    return name + (" or null" if optional else "")


def convert_value(raw: Any, tp: Any, flag: str) -> Any:
    """Convert a CLI string (or a JSON value) to the annotated type ``tp``."""
    inner, optional = _unwrap_optional(tp)
    if _is_null(raw):
        if optional:
            return None
        raise ConfigError(f"--{flag}: cannot be null; expected {_describe(tp)}")
    try:
        if inner is bool:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
                return raw.strip().lower() in _TRUE
            raise ValueError
        if inner is int:
            if isinstance(raw, bool):
                raise ValueError
            if isinstance(raw, int):
                return raw
            if isinstance(raw, float) and raw.is_integer():
                return int(raw)
            return int(str(raw).replace("_", ""))
        if inner is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if inner is str:
            if not isinstance(raw, str | int | float):
                raise ValueError
            return str(raw)
        origin = typing.get_origin(inner)
        if origin is list:
            value = raw
            if isinstance(raw, str):
                text = raw.strip()
                value = (
                    json.loads(text) if text.startswith("[") else [s for s in text.split(",") if s]
                )
            if not isinstance(value, list):
                raise ValueError
            (item_type,) = typing.get_args(inner) or (Any,)
            if item_type is Any:
                return value
            return [convert_value(v, item_type, flag) for v in value]
        if origin is dict or inner is dict:
            value = json.loads(raw) if isinstance(raw, str) else raw
            if not isinstance(value, dict):
                raise ValueError
            return value
        if inner is Any:
            if isinstance(raw, str):
                try:
                    return json.loads(raw)
                except json.JSONDecodeError:
                    return raw
            return raw
    except (ValueError, TypeError, json.JSONDecodeError):
        raise ConfigError(f"--{flag}={raw!r}: expected {_describe(tp)}") from None
    raise ConfigError(f"--{flag}: unsupported field type {tp}")


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _field_default(cls: type, name: str) -> Any:
    (spec,) = (f for f in dataclasses.fields(cls) if f.name == name)
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def _unknown_key_error(key: str, prefix: str, known: list[str], where: str) -> ConfigError:
    flag = f"{prefix}{key}"
    close = difflib.get_close_matches(key, known, n=3)
    hint = (
        f" Did you mean {', '.join('--' + prefix + c for c in close)}?"
        if close
        else f" Known: {', '.join(sorted(known))}."
    )
    return ConfigError(f"--{flag}: unknown {where}.{hint}")


def set_field(obj: Any, path: list[str], raw: Any, flag: str, prefix: str = "") -> None:
    """Set ``obj.<path>`` from ``raw``, descending into nested dataclasses."""
    types_ = _field_types(type(obj))
    name = path[0]
    if name not in types_:
        raise _unknown_key_error(name, prefix, list(types_), "flag")
    current = getattr(obj, name)
    if len(path) > 1:
        if current is None or not dataclasses.is_dataclass(current):
            raise ConfigError(f"--{flag}: {prefix}{name} has no sub-option {'.'.join(path[1:])}")
        set_field(current, path[1:], raw, flag, f"{prefix}{name}.")
        return
    tp = types_[name]
    inner, optional = _unwrap_optional(tp)
    if _is_null(raw):
        setattr(obj, name, None if optional else _field_default(type(obj), name))
        return
    if dataclasses.is_dataclass(inner):
        value = raw if isinstance(raw, dict) else convert_value(raw, dict, flag)
        setattr(obj, name, from_dict(inner, value, f"{prefix}{name}."))
        return
    setattr(obj, name, convert_value(raw, tp, flag))


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a JSON dict; unknown keys fail, naming them."""
    if not isinstance(data, dict):
        raise ConfigError(f"--{prefix.rstrip('.')}: expected a JSON object, got {data!r}")
    if cls is PreTrainedConfig or (isinstance(cls, type) and issubclass(cls, PreTrainedConfig)):
        data = dict(data)
        policy_type = data.pop("type", None)
        cls = policy_config_class(policy_type, prefix)
    obj = cls()
    for key, value in data.items():
        set_field(obj, [key], value, f"{prefix}{key}", prefix)
    return obj


def policy_config_class(policy_type: str | None, prefix: str = "policy.") -> type[PreTrainedConfig]:
    known = PreTrainedConfig.known_choices()
    if policy_type is None:
        raise ConfigError(f"--{prefix}type is required; choose one of: {', '.join(known)}")
    if policy_type not in known:
        raise ConfigError(
            f"--{prefix}type={policy_type!r}: unknown policy type; choose one of: {', '.join(known)}"
        )
    return PreTrainedConfig.get_choice_class(policy_type)


def to_dict(obj: Any) -> Any:
    """Dataclass tree -> JSON-able dict; policy configs carry their ``type``."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        if isinstance(obj, PreTrainedConfig):
            out["type"] = obj.type
        for f in dataclasses.fields(obj):
            if f.init:
                out[f.name] = to_dict(getattr(obj, f.name))
        return out
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def read_json(path: str | Path, what: str) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{what} {path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a JSON object")
    return data
