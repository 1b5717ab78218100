"""Our commands under our own name: `lerobot-pipe train|eval|convert-dcp` are lerobot-train,
lerobot-eval and lerobot-convert-dcp, flags passed on unchanged. lerobot_pipe itself installs
only `lerobot-pipe`; the LeRobot-named commands come from lerobot_pipe_commands/, which our own
venv installs and LeRobot's never gets (tests/beside/test_install_beside_lerobot.py)."""

from __future__ import annotations

import tomllib

import pytest
from upstream import REPO

from lerobot_pipe.scripts import cli

LEROBOT_NAMED = {
    "lerobot-train": "train",
    "lerobot-eval": "eval",
    "lerobot-convert-dcp": "convert-dcp",
}


def _scripts(pyproject: str) -> dict[str, str]:
    return tomllib.loads((REPO / pyproject).read_text())["project"]["scripts"]


def test_the_project_installs_only_lerobot_pipe():
    assert _scripts("pyproject.toml") == {"lerobot-pipe": "lerobot_pipe.scripts.cli:main"}


def test_the_lerobot_named_commands_are_the_lerobot_pipe_ones():
    scripts = _scripts("lerobot_pipe_commands/pyproject.toml")
    assert scripts.keys() == LEROBOT_NAMED.keys()
    for command, name in LEROBOT_NAMED.items():
        assert scripts[command] == f"{cli.DELEGATED[name][0]}:main"


@pytest.mark.parametrize(
    ("name", "usage"),
    [
        ("train", "usage: lerobot-train "),
        ("eval", "usage: lerobot-eval "),
        ("convert-dcp", "usage: lerobot-convert-dcp "),
    ],
)
def test_lerobot_pipe_runs_each_command(name, usage, capsys):
    assert cli.main([name, "--help"]) == 0
    assert capsys.readouterr().out.startswith(usage)


def test_a_bad_flag_is_the_commands_own_error(capsys):
    assert cli.main(["convert-dcp", "--checkpoint_dirr=x"]) == 2
    assert "lerobot-convert-dcp: error: " in capsys.readouterr().err


def test_the_overview_lists_them_and_the_pipelines_job_is_eval_checkpoint(capsys):
    assert cli.main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"\n  {name} " in listed for name in (*LEROBOT_NAMED.values(), "eval-checkpoint"))
    assert cli.main(["evaluate"]) == 2
    assert "unknown command 'evaluate'" in capsys.readouterr().err
