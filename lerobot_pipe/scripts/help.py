"""``--help`` of every console script, generated from the dataclasses its flags are parsed into.

Each flag is listed with its type, its default and a description. The description is the
comment at the end of the field's line, or the comment lines right above it (draccus' rule,
which LeRobot's ``--help`` follows), so it sits beside the field it describes and cannot drift
from the parser.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import json
import textwrap
import tokenize
import typing
from collections.abc import Callable
from typing import Any

from lerobot_pipe.configs.choice import ChoiceRegistry
from lerobot_pipe.configs.parser import is_required, to_dict

_WIDTH = 100
_LONG_DEFAULT = 40
BOOLEANS = "booleans: true/false, yes/no, on/off, 1/0; --<flag>=null gives the flag's default"


@functools.cache
def _own_field_docs(klass: type) -> dict[str, str]:
    """The descriptions of the fields ``klass`` itself declares (from its source)."""
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):
        return {}
    comments: dict[int, tuple[bool, str]] = {}  # line -> (alone on its line, text)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            alone = not token.line[: token.start[1]].strip()
            comments[token.start[0]] = (alone, token.string.lstrip("#").strip())
    body = ast.parse(source).body[0]
    docs = {}
    for node in getattr(body, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        trailing = [
            comments[line][1]
            for line in (node.lineno, node.end_lineno)
            if line in comments and not comments[line][0]
        ]
        above: list[str] = []
        line = node.lineno - 1
        while line in comments and comments[line][0]:
            above.insert(0, comments[line][1])
            line -= 1
        text = " ".join(trailing[:1] or above)
        if text:
            docs[node.target.id] = text
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> description, a subclass's own comment winning over its base's."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def docstring(cls: type) -> str:
    """A class's own docstring ("" without one: dataclasses make one up from the signature)."""
    doc = inspect.getdoc(cls) or ""
    return "" if doc.startswith(f"{cls.__name__}(") else doc.replace("``", "")


def summary(cls: type) -> str:
    """The first paragraph of a class's docstring, on one line."""
    return " ".join(docstring(cls).split("\n\n")[0].split())


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _default_text(f: dataclasses.Field) -> str:
    if is_required(f):
        return "required"
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    try:
        return "default: " + json.dumps(to_dict(value))
    except TypeError:
        return f"default: {value!r}"


def _wrap(text: str, indent: int, then: int | None = None) -> list[str]:
    return textwrap.wrap(
        text,
        _WIDTH,
        initial_indent=" " * indent,
        subsequent_indent=" " * (indent if then is None else then),
        break_long_words=False,
        break_on_hyphens=False,
    )


def _entry(flag: str, what: str, description: str, default: str = "") -> list[str]:
    """A flag's lines: ``--flag  (type, default)`` then its description, indented. A default
    too long for the first line goes below the description."""
    if len(default) > _LONG_DEFAULT:
        return [f"  --{flag}  ({what})", *_wrap(description, 6), *_wrap(default, 6)]
    what = f"{what}, {default}" if default else what
    return [f"  --{flag}  ({what})", *_wrap(description, 6)]


def _group_class(tp: Any) -> type | None:
    members = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    inner = members[0] if len(members) == 1 else None
    return inner if isinstance(inner, type) and dataclasses.is_dataclass(inner) else None


def flag_lines(cls: type, prefix: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """One entry per flag of dataclass ``cls`` (nested groups as dotted flags). A group chosen by
    ``--<group>.type`` lists the type flag here; :func:`choice_sections` lists each type's fields."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        tp = hints[f.name]
        group = _group_class(tp)
        description = docs.get(f.name, "")
        if group is not None and issubclass(group, ChoiceRegistry) and group.is_choice_base():
            choices = ", ".join(group.known_choices())
            out += _entry(f"{prefix}{f.name}.type", f"one of: {choices}", description)
        elif group is not None:
            header = description or summary(group)
            if f.default is None:
                header += f" Unset by default: any --{prefix}{f.name}.* flag sets it."
            if header.strip():
                out += _wrap(f"--{prefix}{f.name}.*: {header.strip()}", 2, 4)
            out += flag_lines(group, f"{prefix}{f.name}.")
        else:
            out += _entry(f"{prefix}{f.name}", _type_name(tp), description, _default_text(f))
    return out


def choice_sections(base: type, flag: str, skip: tuple[str, ...] = ()) -> list[str]:
    """For each type of a choice group (``--policy.type``, ``--optimizer.type``, ...), its fields."""
    lines: list[str] = []
    for name in base.known_choices():
        choice = base.get_choice_class(name)
        about = summary(choice)
        lines += ["", f"Fields of --{flag}.type={name}" + (f": {about}" if about else "")]
        lines += flag_lines(choice, f"{flag}.", skip)
    return lines


def command_help(usage: str, cls: type, note: str = "") -> str:
    """The whole ``--help`` of a command whose options are dataclass ``cls``: usage, the class
    docstring, every flag, and ``note`` (e.g. which other flags it passes on)."""
    lines = [f"usage: {usage}", "", docstring(cls), "", f"Flags ({BOOLEANS}):"]
    lines += flag_lines(cls)
    lines += _entry("help", "or -h", "Print this text and exit.")
    if note:
        lines += ["", *textwrap.wrap(note, _WIDTH)]
    return "\n".join(lines)


def parse_command(
    prog: str, cls: type, argv: list[str], usage: Callable[[], str]
) -> tuple[Any, int | None]:
    """The prelude of a console script whose flags fill dataclass ``cls``: ``(options, None)``,
    or ``(None, status)`` when there is nothing more to do: ``--help`` printed (0), a bad flag
    reported in one line (2). Logging is set up before parsing, so the parser's warnings show."""
    from lerobot_pipe.configs.parser import ConfigError, parse_options
    from lerobot_pipe.scripts.logs import report_error, setup_logging

    if any(a in ("-h", "--help") for a in argv):
        print(usage())
        return None, 0
    setup_logging()
    try:
        options, _ = parse_options(cls, argv)
    except ConfigError as e:
        report_error(prog, e)
        return None, 2
    return options, None


def train_help() -> str:
    from lerobot_pipe import envs, policies  # noqa: F401 - register every --env and --policy type
    from lerobot_pipe.configs.envs import EnvConfig
    from lerobot_pipe.configs.optim import OptimizerConfig, SchedulerConfig
    from lerobot_pipe.configs.policies import PreTrainedConfig
    from lerobot_pipe.configs.train import TrainConfig

    lines = [
        "usage: lerobot-train --dataset.root=DIR --policy.type=act [--flag=value ...]",
        "       torchrun --nproc-per-node=N $(which lerobot-train) ...",
        "       lerobot-pipe train ...   (the same command; beside LeRobot, lerobot-train is LeRobot's)",
        "",
        docstring(TrainConfig),
        "",
        f"Flags (LeRobot's dotted names; {BOOLEANS}):",
        *_entry(
            "config_path",
            "path or Hub repo id",
            "A train_config.json, a checkpoint step folder or its pretrained_model/, or a Hub "
            "repo holding checkpoints/<step>/: its config is loaded first and the flags "
            "override it.",
        ),
        *_entry(
            "policy.path",
            "path or Hub repo id",
            "A pretrained policy (its folder, a checkpoint step folder or a Hub repo id) to "
            "fine-tune; its config is the policy's, --policy.* flags override it.",
        ),
        *flag_lines(TrainConfig),
        *_entry("help", "or -h", "Print this text and exit."),
    ]
    lines += choice_sections(PreTrainedConfig, "policy")
    lines += choice_sections(OptimizerConfig, "optimizer")
    lines += choice_sections(SchedulerConfig, "scheduler")
    lines += choice_sections(EnvConfig, "env")
    return "\n".join(lines)
