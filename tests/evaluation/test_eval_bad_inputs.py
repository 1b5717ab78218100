"""lerobot-eval refuses bad input before any rollout: exit status 2, one line saying what to
pass or install, no eval_info.json written."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from lerobot_pipe.scripts.eval import main

CASES = [
    ("eval-no-env", [], "--env.type is required; choose one of: aloha, pusht, synthetic"),
    ("eval-unknown-env", ["--env.type=xarm"], "--env.type='xarm': unknown env type"),
    ("eval-unknown-env-field", ["--env.type=pusht", "--env.episode_lenght=5"], "episode_lenght"),
    ("eval-env-field-before-type", ["--env.episode_length=5"], "pass --env.type first"),
    ("eval-no-policy", ["--env.type=synthetic", "--policy.path=null"], "--policy.path is required"),
    (
        "eval-missing-policy",
        ["--env.type=synthetic", "--policy.path={tmp}/nope"],
        "not a Hub repo id",
    ),
    ("eval-policy-field", ["--env.type=synthetic", "--policy.n_heads=4"], "--policy.n_heads"),
    ("eval-bad-episodes", ["--env.type=synthetic", "--eval.n_episodes=0"], "--eval.n_episodes=0"),
    (
        "eval-env-state-missing",
        ["--env.type=synthetic", "--env.pixels_only=true", '--env.cameras=["top"]'],
        "observation.environment_state [2] is not delivered",
    ),
    (
        "eval-renamed-away",
        ["--env.type=synthetic", '--rename_map={"observation.state": "observation.joints"}'],
        "observation.state [2] is not delivered",
    ),
]


@pytest.mark.parametrize(("argv", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_before_any_rollout(untrained_policy, tmp_path, capsys, argv, message):
    pytest.importorskip("gymnasium")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if not any(a.startswith("--policy.path") for a in argv):
        argv.append(f"--policy.path={untrained_policy}")
    out = tmp_path / "out"
    assert main([*argv, f"--output_dir={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_missing_simulator_says_what_to_install(untrained_policy, tmp_path, capsys, monkeypatch):
    """gym-pusht not importable (as where the [sim] extra is not installed)."""
    pytest.importorskip("gymnasium")
    monkeypatch.setitem(sys.modules, "gym_pusht", None)  # import gym_pusht -> ModuleNotFoundError
    argv = [f"--policy.path={untrained_policy}", "--env.type=pusht", f"--output_dir={tmp_path}/o"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--env.type=pusht needs the gym_pusht package" in err
    assert "pip install 'lerobot_pipe[sim]'" in err


def test_missing_gymnasium_says_what_to_install(untrained_policy, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    argv = [f"--policy.path={untrained_policy}", "--env.type=synthetic"]
    assert main([*argv, f"--output_dir={tmp_path}/o"]) == 2
    assert "pip install 'lerobot_pipe[sim]'" in capsys.readouterr().err


def test_policy_that_does_not_fit_pusht(untrained_policy, tmp_path, capsys):
    """The synthetic task's policy (state + environment_state) in PushT (image + state): which
    feature is missing, and what PushT really delivers (96x96, not the declared 384x384)."""
    pytest.importorskip("gym_pusht")
    argv = [f"--policy.path={untrained_policy}", "--env.type=pusht", f"--output_dir={tmp_path}/o"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "observation.environment_state [2] is not delivered" in err
    assert "'observation.image': [3, 96, 96]" in err


def test_help_lists_the_env_types(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--policy.path", "--eval.batch_size", "--env.type", "--rename_map", "pusht"):
        assert flag in text


def test_every_case_is_in_the_docs():
    doc = (Path(__file__).resolve().parents[2] / "docs/bad-inputs.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", doc, flags=re.M))
    ids = {c[0] for c in CASES} | {"eval-no-simulator", "eval-no-gymnasium", "eval-pusht-misfit"}
    assert ids <= documented, sorted(ids - documented)


@pytest.mark.parametrize(
    ("cores", "episodes", "expected"), [(2, 50, 1), (16, 50, 11), (16, 4, 4), (128, 500, 64)]
)
def test_auto_batch_size_is_lerobots_rule(monkeypatch, cores, episodes, expected):
    """--eval.batch_size=0: 70 % of the cores (at least 1), at most n_episodes and 64."""
    import os

    from lerobot_pipe.envs.factory import auto_batch_size

    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert auto_batch_size(episodes) == expected
