"""One CLI layer: every console script parses its flags with the dotted-flag parser, answers a
bad flag the same way, and lists every flag it accepts in a generated --help."""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from lerobot_pipe.configs.choice import ChoiceRegistry
from lerobot_pipe.configs.envs import EnvConfig
from lerobot_pipe.configs.optim import OptimizerConfig, SchedulerConfig
from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.configs.train import TrainConfig
from lerobot_pipe.scripts import cli, convert_dcp
from lerobot_pipe.scripts import train as train_script

COMMANDS = {f"lerobot-pipe {name}": command.options for name, command in cli.COMMANDS.items()}
COMMANDS["lerobot-convert-dcp"] = convert_dcp.ConvertOptions


def _main(command: str):
    if command == "lerobot-convert-dcp":
        return convert_dcp.main
    name = command.split()[1]
    return lambda argv: cli.main([name, *argv])


def _leaf_flags(cls: type, prefix: str = "") -> list[str]:
    """Every flag a dataclass accepts, nested groups as dotted flags, a chosen group's type
    flag in place of its fields."""
    hints = typing.get_type_hints(cls)
    flags = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        members = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        group = members[0] if len(members) == 1 and dataclasses.is_dataclass(members[0]) else None
        if group is not None and issubclass(group, ChoiceRegistry) and group.is_choice_base():
            flags.append(f"{prefix}{f.name}.type")
        elif group is not None:
            flags += _leaf_flags(group, f"{prefix}{f.name}.")
        else:
            flags.append(f"{prefix}{f.name}")
    return flags


def _described(help_text: str, flag: str) -> bool:
    """``--flag  (type, default)`` followed by an indented description line."""
    lines = help_text.splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"^  --{re.escape(flag)}  \(.+\)$", line):
            following = lines[i + 1] if i + 1 < len(lines) else ""
            return following.startswith("      ") and not following.strip().startswith("default:")
    return False


def test_train_help_describes_every_flag(capsys):
    assert train_script.main(["--help"]) == 0
    text = capsys.readouterr().out
    flags = _leaf_flags(TrainConfig)
    for base, group in (
        (PreTrainedConfig, "policy"),
        (OptimizerConfig, "optimizer"),
        (SchedulerConfig, "scheduler"),
        (EnvConfig, "env"),
    ):
        for name in base.known_choices():
            flags += _leaf_flags(base.get_choice_class(name), f"{group}.")
            assert f"Fields of --{group}.type={name}" in text
    missing = sorted({f for f in flags if not _described(text, f)})
    assert missing == [], f"flags without a type, default and description in --help: {missing}"
    assert len(set(flags)) > 100


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_command_help_describes_every_flag(command, capsys):
    assert _main(command)(["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: {command} ")
    flags = _leaf_flags(COMMANDS[command])
    assert flags and all(_described(text, f) for f in flags), text
    assert "true/false, yes/no, on/off, 1/0" in text


def test_pipe_overview_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert all(f"  {name} " in text for name in cli.COMMANDS)
    assert "list-checkpoints" not in cli.COMMANDS


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_unknown_flag_and_bad_values_read_the_same_everywhere(command, capsys, tmp_path):
    """One vocabulary: the parser's unknown-flag message, booleans and required flags."""
    run = _main(command)
    options = COMMANDS[command]
    hints = typing.get_type_hints(options)
    required = [f.name for f in dataclasses.fields(options) if f.metadata.get("required")]
    booleans = [f.name for f in dataclasses.fields(options) if hints[f.name] in (bool, bool | None)]
    given = [f"--{name}={tmp_path / name}" for name in required if hints[name] is str]
    given += [f"--{name}=1" for name in required if hints[name] is int]
    # validate and launch-train pass flags that are not theirs on to lerobot-train's parser.
    assert run([*given, "--bogus_flag=1"]) == 2
    err = capsys.readouterr().err
    assert "--bogus_flag: unknown flag" in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1
    if command not in ("lerobot-pipe validate", "lerobot-pipe launch-train"):
        assert "Known: --" in err  # a short list of flags is named in full
    if booleans:
        assert run([*given, f"--{booleans[0]}=maybe"]) == 2
        assert f"--{booleans[0]}='maybe': expected true or false" in capsys.readouterr().err
    if required:
        missing = [a for a in given if not a.startswith(f"--{required[0]}=")]
        assert run([*missing, f"--{required[0]}=null"]) == 2
        assert f"--{required[0]} is required" in capsys.readouterr().err


def test_lerobot_train_reads_booleans_and_unknown_flags_the_same(capsys):
    assert train_script.main(["--policy.type=act", "--resume=maybe"]) == 2
    assert "--resume='maybe': expected true or false" in capsys.readouterr().err
    assert train_script.main(["--bogus_flag=1"]) == 2
    assert "--bogus_flag: unknown flag" in capsys.readouterr().err


def test_pass_through_keeps_the_other_flags_as_typed():
    from lerobot_pipe.configs.parser import parse_options

    options, rest = parse_options(
        cli.LaunchTrainOptions,
        ["--log", "x.log", "--policy.type", "act", "--steps=3", "--nproc-per-node=2"],
        others=True,
    )
    assert (options.log, options.nproc_per_node) == ("x.log", 2)
    assert rest == ["--policy.type", "act", "--steps=3"]
