"""Security: the Hub token is written nowhere; no pickle is ever loaded; repo ids and names
cannot reach outside their folders."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_hub import hub_server  # noqa: F401 - fixture
from tiny import tiny_act_flags

from lerobot_pipe.hub.publish import PublishError, validate_repo_id

PACKAGE = Path(__file__).resolve().parents[2] / "lerobot_pipe"


def _scan(root: Path, secret: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.slow
def test_token_appears_in_no_written_file_or_log(hub_server, dataset_root, tmp_path):  # noqa: F811
    env = {
        **os.environ,
        **hub_server.env(),
        "HF_TOKEN": hub_server.token,
        "HF_HOME": str(tmp_path / "hf"),
        "OMP_NUM_THREADS": "1",
    }
    out = tmp_path / "run"
    train = subprocess.run(
        [
            sys.executable,
            "-m",
            "lerobot_pipe.scripts.train",
            *tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2, "save_freq": 1}),
            f"--output_dir={out}",
            "--policy.push_to_hub=true",
            "--policy.repo_id=alice/secret-test",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert train.returncode == 0, train.stderr[-2000:]
    publish = subprocess.run(
        [
            sys.executable,
            "-m",
            "lerobot_pipe.scripts.cli",
            "publish",
            f"--pretrained_dir={out}/checkpoints/000001/pretrained_model",
            "--repo_id=alice/secret-test",
            "--step=1",
            "--intermediate=true",
            f"--receipt={tmp_path / 'receipt.json'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert publish.returncode == 0, publish.stderr[-2000:]
    token = hub_server.token
    assert token not in train.stdout + train.stderr + publish.stdout + publish.stderr
    assert _scan(out, token) == []  # checkpoints, train_config.json, model card sources, metrics
    assert token not in (tmp_path / "receipt.json").read_text()
    for path in hub_server.list_files("alice/secret-test"):
        assert token.encode() not in hub_server.read_file("alice/secret-test", path), path


@pytest.mark.parametrize(
    "repo_id", ["../etc", "a/../../b", "/abs/path", "a/b/c", "a\\b", "", "a/", "./x"]
)
def test_repo_ids_that_could_traverse_are_refused(repo_id):
    with pytest.raises(PublishError):
        validate_repo_id(repo_id)


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            base = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
            yield base, name, node


def test_no_pickle_loading_in_the_package():
    """torch.load only with weights_only=True; never pickle.load(s), numpy allow_pickle, or
    torch.load's default. (DCP reads its own .metadata pickle: run output only, documented.)"""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for base, name, node in _calls(ast.parse(path.read_text())):
            kwargs = {k.arg: k.value for k in node.keywords}
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            if base == "pickle" and name in ("load", "loads", "Unpickler"):
                offenders.append(where)
            if base == "torch" and name == "load":
                flag = kwargs.get("weights_only")
                if not (isinstance(flag, ast.Constant) and flag.value is True):
                    offenders.append(where)
            if "allow_pickle" in kwargs:
                offenders.append(where)
    assert offenders == []


def test_job_name_cannot_escape_the_output_tree(dataset_root, tmp_path, capsys):
    from lerobot_pipe.scripts.train import main

    assert main([*tiny_act_flags(**{"dataset.root": dataset_root}), "--job_name=../../etc"]) == 2
    assert "--job_name" in capsys.readouterr().err
