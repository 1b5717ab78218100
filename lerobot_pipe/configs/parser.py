"""LeRobot-style dotted CLI flags onto nested dataclasses, and configs to and from JSON.

``--a.b=value`` and ``--a.b value`` both work. A flag names a dataclass field by its dotted path;
the value is converted to the field's annotated type. ``--a.b=null`` resets a field to its
default (``None`` for optional fields). A config chosen by type (policy, optimizer, scheduler)
takes ``--a.type=<name>`` first; an optional group that is unset (``--peft.*``, ``--scheduler.*``)
is created by the first flag that names one of its fields. Unknown flags, wrong types and
impossible choices raise :class:`ConfigError`, whose message names the flag and what is allowed.

Files are decoded leniently where flags are not: a key of a config file that names no field here
(a field of another LeRobot release) is kept as it is and written back, so nothing a user's file
holds is lost; the flags a user types must all be known.

Every console script parses its flags here: lerobot-train into :class:`TrainConfig`, the other
commands into a flat dataclass of their options (:func:`parse_options`), so the same booleans
(true/false, yes/no, on/off, 1/0), the same ``=null`` and the same messages hold everywhere.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import logging
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union

from lerobot_pipe import fsutil
from lerobot_pipe.configs.choice import ChoiceRegistry, UnknownChoice

log = logging.getLogger(__name__)

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad flag, config file or config value. The message is meant for the user as it is."""


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_NONE = {"none", "null"}
# Keys of a config file that name no field, kept per config object and written back.
_EXTRA = "_extra_fields"
# Field metadata of a command option that has no default (see required()).
_REQUIRED = "required"
# A level with at most this many flags lists them all in an unknown-flag error.
_LIST_KNOWN_UP_TO = 12


def _flag_items(argv: list[str]) -> list[tuple[str, str, list[str]]]:
    """Each flag of ``argv`` as (key, value, the arguments it was typed as)."""
    items = []
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
            typed = [arg]
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            key, value = body, argv[i + 1]
            typed = [arg, value]
            i += 1
        else:
            key, value = body, "true"
            typed = [arg]
        items.append((key.replace("-", "_") if "." not in key else key, value, typed))
        i += 1
    return items


def split_flags(argv: list[str]) -> dict[str, str]:
    """``["--a.b=1", "--c", "2"]`` -> ``{"a.b": "1", "c": "2"}``. Repeated flags: last one wins."""
    return {key: value for key, value, _ in _flag_items(argv)}


def required() -> Any:
    """The default of a command option that must be given: :func:`parse_options` refuses to go
    on without it (``--<name> is required``)."""
    return dataclasses.field(default=None, metadata={_REQUIRED: True})


def is_required(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get(_REQUIRED))


def parse_options(cls: type[T], argv: list[str], *, others: bool = False) -> tuple[T, list[str]]:
    """A command's options: ``cls`` is a flat dataclass whose fields are its flags. Returns the
    options and, with ``others``, the flags that name none of its fields, as they were typed
    (the lerobot-train flags a pipeline command passes on); without it those are unknown flags."""
    own = set(_fields(cls))
    mine: dict[str, str] = {}
    rest: list[str] = []
    for key, value, typed in _flag_items(argv):
        if others and key not in own:
            rest += typed
        else:
            mine[key] = value
    options = cls()
    apply_flags(options, mine)
    for f in dataclasses.fields(cls):
        if is_required(f) and getattr(options, f.name) is None:
            raise ConfigError(f"--{f.name} is required")
    return options, rest


def is_null(raw: Any) -> bool:
    return raw is None or (isinstance(raw, str) and raw.strip().lower() in _NONE)


def _union_args(tp: Any) -> tuple[list[Any], bool]:
    """The non-None members of a Union (or ``[tp]``) and whether None is one of them."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = typing.get_args(tp)
        return [a for a in args if a is not type(None)], type(None) in args
    return [tp], False


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    members, optional = _union_args(tp)
    return (members[0] if len(members) == 1 else tp), optional


def _describe(tp: Any) -> str:
    members, optional = _union_args(tp)
    names = []
    for member in members:
        name = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
            member
        )
        if name is None:
            origin = typing.get_origin(member)
            name = {list: "a JSON list", tuple: "a JSON list", dict: "a JSON object"}.get(
                origin or member, str(member)
            )
        names.append(name)
    return " or ".join(names) + (" or null" if optional else "")


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    # JSON 0/1, as LeRobot's draccus writes a flag it types int (e.g. ACT's
    # replace_final_stride_with_dilation), like the strings "0"/"1" of a CLI flag.
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
        return raw.strip().lower() in _TRUE
    raise ValueError


def _to_int(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return int(str(raw).replace("_", ""))


def _to_float(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError
    return float(raw)


def _to_str(raw: Any) -> str:
    if not isinstance(raw, str | int | float):
        raise ValueError
    return str(raw)


def _to_any(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str, Any: _to_any}


def _as_sequence(raw: Any) -> Any:
    """A JSON list, or a comma list, as a CLI flag types one."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    return json.loads(text) if text.startswith("[") else [s for s in text.split(",") if s]


def _to_tuple(raw: Any, tp: Any, flag: str) -> tuple:
    """A JSON list (or comma list) of the tuple's item types, as LeRobot's draccus reads
    tuple[int, ...], tuple[int, int] and a bare tuple."""
    value = _as_sequence(raw)
    if not isinstance(value, list | tuple):
        raise ValueError
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        args = (args[0],) * len(value)
    elif args and len(args) != len(value):
        raise ValueError
    if not args:
        return tuple(value)
    return tuple(convert_value(v, t, flag) for v, t in zip(value, args, strict=True))


def _to_list(raw: Any, tp: Any, flag: str) -> list:
    value = _as_sequence(raw)
    if not isinstance(value, list):
        raise ValueError
    (item_type,) = typing.get_args(tp) or (Any,)
    if item_type is Any:
        return value
    return [convert_value(v, item_type, flag) for v in value]


def _to_dict(raw: Any) -> dict:
    value = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(value, dict):
        raise ValueError
    return value


def _to_enum(raw: Any, tp: type[enum.Enum], flag: str) -> enum.Enum:
    try:
        return tp(raw)
    except ValueError:
        choices = ", ".join(str(member.value) for member in tp)
        raise ConfigError(f"--{flag}={raw!r}: choose one of {choices}") from None


def convert_value(raw: Any, tp: Any, flag: str) -> Any:
    """Convert a CLI string (or a JSON value) to the annotated type ``tp``. Null is handled by
    the caller (it means the field's default)."""
    members, _ = _union_args(tp)
    if len(members) > 1:  # e.g. list[str] | str: a JSON list, else the string itself
        as_list = isinstance(raw, list) or (isinstance(raw, str) and raw.strip().startswith("["))
        for member in members:
            if (typing.get_origin(member) is list) == as_list:
                return convert_value(raw, member, flag)
        raise ConfigError(f"--{flag}={raw!r}: expected {_describe(tp)}")
    inner = members[0]
    origin = typing.get_origin(inner) or inner
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return _to_enum(raw, inner, flag)
    try:
        if inner in _SCALARS:
            return _SCALARS[inner](raw)
        if origin is tuple:
            return _to_tuple(raw, inner, flag)
        if origin is list:
            return _to_list(raw, inner, flag)
        if origin is dict:
            return _to_dict(raw)
    except (ValueError, TypeError, json.JSONDecodeError):
        raise ConfigError(f"--{flag}={raw!r}: expected {_describe(tp)}") from None
    raise ConfigError(f"--{flag}: unsupported field type {tp}")


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {name: hints[name] for name in _fields(cls)}


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _unknown_key_error(key: str, prefix: str, known: list[str], where: str) -> ConfigError:
    flag = f"{prefix}{key}"
    close = difflib.get_close_matches(key, known, n=3)
    hint = f" Did you mean {', '.join('--' + prefix + c for c in close)}?" if close else ""
    if not close or len(known) <= _LIST_KNOWN_UP_TO:
        hint += f" Known: {', '.join('--' + prefix + k for k in sorted(known))}."
    return ConfigError(f"--{flag}: unknown {where}.{hint}")


def _dataclass_type(tp: Any) -> type | None:
    inner, _ = _unwrap_optional(tp)
    return inner if isinstance(inner, type) and dataclasses.is_dataclass(inner) else None


def _choice_class(base: type, name: Any, prefix: str) -> type:
    known = base.known_choices()
    what = prefix.rstrip(".").rsplit(".", 1)[-1]  # policy, optimizer, scheduler
    if is_null(name):
        raise ConfigError(f"--{prefix}type is required; choose one of: {', '.join(known)}")
    try:
        return base.get_choice_class(name)
    except UnknownChoice:
        raise ConfigError(
            f"--{prefix}type={name!r}: unknown {what} type; choose one of: {', '.join(known)}"
        ) from None
    except ValueError as e:
        raise ConfigError(f"--{prefix}type={name!r}: {e}") from None


def _new_group(cls: type, prefix: str, first_key: str) -> Any:
    """A new instance of an unset dataclass field, for a flag naming one of its fields."""
    if issubclass(cls, ChoiceRegistry) and cls.is_choice_base():
        if cls.default_choice is None:
            raise ConfigError(
                f"--{prefix}{first_key}: pass --{prefix}type first; choose one of: "
                f"{', '.join(cls.known_choices())}"
            )
        return cls.get_choice_class(cls.default_choice)()
    return cls()


def _is_dict(tp: Any) -> bool:
    inner, _ = _unwrap_optional(tp)
    return inner is dict or typing.get_origin(inner) is dict


def _set_dict_key(obj: Any, name: str, tp: Any, keys: list[str], raw: Any, flag: str) -> None:
    """``--env.type=pusht`` into a JSON-object field, as ``--env='{"type": "pusht"}'`` would
    set it (LeRobot's users type both). A field of ``dict[str, Any]`` nests by the dots
    (``--env.task.x=1``); one of typed values takes the rest of the flag as one key, since the
    keys are LeRobot feature names holding dots (``--rename_map.observation.images.cam=...``)."""
    inner, _ = _unwrap_optional(tp)
    _, value_type = typing.get_args(inner) or (str, Any)
    current = getattr(obj, name)
    mapping = dict(current) if isinstance(current, dict) else {}
    if value_type is not Any:
        mapping[".".join(keys)] = None if is_null(raw) else convert_value(raw, value_type, flag)
    else:
        level = mapping
        for key in keys[:-1]:
            child = level.get(key)
            level[key] = dict(child) if isinstance(child, dict) else {}
            level = level[key]
        level[keys[-1]] = None if is_null(raw) else convert_value(raw, Any, flag)
    setattr(obj, name, mapping)


def set_field(obj: Any, path: list[str], raw: Any, flag: str, prefix: str = "") -> None:
    """Set ``obj.<path>`` from ``raw``, descending into nested dataclasses."""
    fields = _fields(type(obj))
    types_ = _field_types(type(obj))
    name = path[0]
    if name not in types_:
        raise _unknown_key_error(name, prefix, list(types_), "flag")
    tp = types_[name]
    group = _dataclass_type(tp)
    if len(path) > 1:
        if _is_dict(tp):
            _set_dict_key(obj, name, tp, path[1:], raw, flag)
            return
        if group is None:
            raise ConfigError(f"--{flag}: {prefix}{name} has no sub-option {'.'.join(path[1:])}")
        current = getattr(obj, name)
        sub_prefix = f"{prefix}{name}."
        if path[1] == "type" and len(path) == 2 and issubclass(group, ChoiceRegistry):
            choice = _choice_class(group, raw, sub_prefix)
            if type(current) is not choice:
                setattr(obj, name, choice())
            return
        if current is None:
            current = _new_group(group, sub_prefix, path[1])
            setattr(obj, name, current)
        set_field(current, path[1:], raw, flag, sub_prefix)
        return
    if is_null(raw):
        _, optional = _unwrap_optional(tp)
        setattr(obj, name, None if optional else _default(fields[name]))
        return
    if group is not None:
        value = raw if isinstance(raw, dict) else convert_value(raw, dict, flag)
        setattr(obj, name, from_dict(group, value, f"{prefix}{name}."))
        return
    setattr(obj, name, convert_value(raw, tp, flag))


def _flag_order(key: str) -> tuple[int, bool]:
    """Set shallow keys first and, at one depth, ``.type`` before the fields it chooses."""
    return key.count("."), not key.endswith(".type")


def apply_flags(obj: Any, flags: dict[str, Any]) -> None:
    """Set every dotted ``flags`` key on ``obj`` (types first, then their fields)."""
    for key in sorted(flags, key=_flag_order):
        set_field(obj, key.split("."), flags[key], key)


def replace(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` that keeps what a config file held beyond this project's fields
    (written back by :func:`to_dict`)."""
    new = dataclasses.replace(obj, **changes)
    if hasattr(obj, _EXTRA):
        setattr(new, _EXTRA, dict(getattr(obj, _EXTRA)))
    return new


def from_dict(cls: type, data: dict, prefix: str = "", *, lenient: bool = False) -> Any:
    """Build dataclass ``cls`` from a JSON dict. Unknown keys fail, naming them, unless
    ``lenient`` (config files): then they are kept on the object and written back by
    :func:`to_dict`."""
    if not isinstance(data, dict):
        raise ConfigError(f"--{prefix.rstrip('.')}: expected a JSON object, got {data!r}")
    data = dict(data)
    if issubclass(cls, ChoiceRegistry) and cls.is_choice_base():
        cls = _choice_class(cls, data.pop("type", None) or cls.default_choice, prefix)
    elif issubclass(cls, ChoiceRegistry):
        data.pop("type", None)
    obj = cls()
    fields = _fields(cls)
    types_ = _field_types(cls)
    extra = {}
    for key, value in data.items():
        if key not in fields:
            if not lenient:
                raise _unknown_key_error(key, prefix, list(fields), "flag")
            extra[key] = value
            continue
        group = _dataclass_type(types_[key])
        if group is not None and isinstance(value, dict):
            setattr(obj, key, from_dict(group, value, f"{prefix}{key}.", lenient=lenient))
        else:
            set_field(obj, [key], value, f"{prefix}{key}", prefix)
    if extra:
        log.info(
            "%s: kept keys this version does not use: %s", prefix.rstrip(".") or "config", extra
        )
        setattr(obj, _EXTRA, extra)
    return obj


def to_dict(obj: Any) -> Any:
    """Dataclass tree -> JSON-able dict, as LeRobot writes it: chosen configs carry their
    ``type``; extension fields at their default are left out; kept unknown keys come back."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        if isinstance(obj, ChoiceRegistry):
            out["type"] = obj.type
        for f in dataclasses.fields(obj):
            if not f.init:
                continue
            value = getattr(obj, f.name)
            if f.metadata.get("omit_at_default") and value == _default(f):
                continue
            out[f.name] = to_dict(value)
        out.update(getattr(obj, _EXTRA, {}))
        return out
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj


def read_json(path: str | Path, what: str) -> dict:
    """The JSON object in ``path``; ConfigError naming ``what`` and the file otherwise."""
    return fsutil.read_json(path, what, error=ConfigError)
