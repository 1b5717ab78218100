"""Installed beside LeRobot, as its users would: this checkout (not editable) with its pipeline,
smolvla and pi extras into a venv holding LeRobot 0.6.1 (tests/upstream.py's, copied: hard
links, so the copy costs no disk and the original stays untouched) changes no version that venv
resolved, leaves ``pip check`` clean and every file LeRobot's venv installed as its RECORD says
(so LeRobot's lerobot-train and lerobot-eval stay LeRobot's), on install and on uninstall.
Installed there, the Hub tests (tests/hub) pass on LeRobot's huggingface_hub 1.x (httpx), as
they do on 2.x (httpx2) in our own venv, and LeRobot's own policies train on our trainer
(test_lerobot_policies_here.py).

CI runs this module with the rest of the suite (.ci/run); it is marked interop (it runs
LeRobot's venv) and beside (``pytest -m beside``, ``make test-beside``)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from upstream import REPO, Upstream, find_upstream

pytestmark = [pytest.mark.interop, pytest.mark.beside]

EXTRAS = "pipeline,smolvla,pi"
# What a source install of the project reads (pyproject.toml's readme and packages).
SOURCE = ("pyproject.toml", "README.md", "lerobot_pipe")
# The commands LeRobot installs under names we also use in our own venv.
LEROBOT_COMMANDS = ("lerobot-train", "lerobot-eval")
PIP_TIMEOUT_S = 600
IGNORED = shutil.ignore_patterns("__pycache__", "*.egg-info")


@pytest.fixture(scope="module")
def upstream() -> Upstream:
    found, why = find_upstream()
    if found is None:
        pytest.skip(why)
    return found


@pytest.fixture(scope="module")
def lerobot_venv(upstream, tmp_path_factory) -> Path:
    """A copy of LeRobot's venv (hard links where the file system allows, else a full copy)."""
    source = upstream.python.parent.parent
    copy = tmp_path_factory.mktemp("beside") / "venv"
    linked = subprocess.run(["cp", "-al", str(source), str(copy)], capture_output=True)
    if linked.returncode != 0:
        shutil.rmtree(copy, ignore_errors=True)
        subprocess.run(["cp", "-a", str(source), str(copy)], check=True)
    # Its console scripts (torchrun, ...) start the Python their shebang names: the copy's own,
    # as in the user's venv. Each rewritten one is a new file (a hard link would change the
    # original's); the snapshots below are taken after this.
    for script in (copy / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        head = script.read_bytes()[:200]
        shebang = f"#!{source}/bin/".encode()
        if head.startswith(shebang):
            text = script.read_bytes().replace(shebang, f"#!{copy}/bin/".encode(), 1)
            fresh = script.with_name(script.name + ".copy")
            fresh.write_bytes(text)
            fresh.chmod(script.stat().st_mode)
            fresh.replace(script)
    return copy


def site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def installed(venv: Path) -> dict[str, importlib.metadata.Distribution]:
    return {
        dist.metadata["Name"].lower().replace("_", "-"): dist
        for dist in importlib.metadata.distributions(path=[str(site_packages(venv))])
    }


def _sha256(path: Path) -> str | None:
    """The file's hash as RECORD writes it, None when it is gone."""
    try:
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").digest()
    except FileNotFoundError:
        return None
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def snapshot(venv: Path, names: set[str] | None = None) -> dict[str, object]:
    """Each distribution's version and, per file its RECORD hashes, the file's hash now (the
    whole venv, or the distributions ``names``). Compared before and after, not with RECORD
    itself: two of LeRobot's distributions (opencv-python and its headless twin) write the same
    cv2/ files, so some files differ from one RECORD already in LeRobot's own venv."""
    state: dict[str, object] = {}
    for name, dist in installed(venv).items():
        if names is not None and name not in names:
            continue
        state[name] = dist.version
        for file in dist.files or ():
            if file.hash is not None:
                state[f"{name}:{file}"] = _sha256(Path(dist.locate_file(file)))
    return state


def pip(venv: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", *args],
        capture_output=True,
        text=True,
        env={**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        timeout=PIP_TIMEOUT_S,
    )


def differences(before: dict[str, object], after: dict[str, object]) -> list[str]:
    changed = [k for k in before if after.get(k) != before[k]]
    return [f"{k}: {before[k]} -> {after.get(k, 'removed')}" for k in changed[:20]]


def assert_pip_check(venv: Path) -> None:
    checked = pip(venv, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.fixture(scope="module")
def beside(lerobot_venv, tmp_path_factory):
    """The project installed from a copy of this checkout (a source install builds in its
    folder); the venv's state before it."""
    before = snapshot(lerobot_venv)
    assert "lerobot" in before and "lerobot-pipe" not in before
    assert_pip_check(lerobot_venv)
    source = tmp_path_factory.mktemp("source")
    for name in SOURCE:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=IGNORED)
        else:
            shutil.copy2(REPO / name, source / name)
    done = pip(lerobot_venv, "install", "--no-compile", f"{source}[{EXTRAS}]")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return lerobot_venv, before


def test_installing_changes_nothing_lerobot_installed(beside):
    venv, before = beside
    after = snapshot(venv)
    assert not differences(before, after), differences(before, after)
    assert "lerobot-pipe" in after
    assert_pip_check(venv)


def test_our_commands_are_under_our_name_and_lerobots_stay_lerobots(beside):
    venv, _ = beside
    for command in LEROBOT_COMMANDS:
        assert "from lerobot.scripts." in (venv / "bin" / command).read_text(), command
    assert not (venv / "bin/lerobot-convert-dcp").exists()
    listed = subprocess.run(
        [str(venv / "bin/lerobot-pipe"), "--help"], capture_output=True, text=True, check=True
    )
    assert all(f"  {c} " in listed.stdout for c in ("train", "eval", "convert-dcp"))


def run_tests_in(venv: Path, tests: Path, *args: str) -> subprocess.CompletedProcess:
    """``tests`` run by pytest in ``venv`` against the lerobot_pipe installed there, not the
    checkout (run from outside it, without our PYTHONPATH)."""
    done = pip(venv, "install", "--no-compile", "pytest")
    assert done.returncode == 0, done.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [
            str(venv / "bin/python"),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(REPO),
            "-c",
            str(REPO / "pyproject.toml"),
            *args,
            str(tests),
        ],
        cwd=venv,
        env=env,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )


def test_the_hub_tests_pass_on_lerobots_huggingface_hub(beside):
    """tests/hub in LeRobot's venv (huggingface_hub 1.x, its client httpx)."""
    venv, _ = beside
    hub = installed(venv)["huggingface-hub"].version
    assert hub.startswith("1."), hub
    run = run_tests_in(venv, REPO / "tests/hub")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert (
        "/site-packages/lerobot_pipe/"
        in subprocess.run(
            [str(venv / "bin/python"), "-c", "import lerobot_pipe; print(lerobot_pipe.__file__)"],
            cwd=venv,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )


def test_lerobots_own_policies_train_here(beside):
    """tests/beside/test_lerobot_policies_here.py where it runs: LeRobot's vqbet and ACT on
    our trainer (DDP, FSDP2, resume), their checkpoints read by LeRobot's loaders."""
    venv, _ = beside
    run = run_tests_in(venv, REPO / "tests/beside/test_lerobot_policies_here.py", "--durations=8")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "5 passed" in run.stdout, run.stdout[-3000:]
    # Where the time went (shown with pytest -rP).
    print(run.stdout[run.stdout.find("slowest") :])


def test_uninstalling_changes_nothing_lerobot_installed(beside):
    venv, before = beside
    done = pip(venv, "uninstall", "-y", "lerobot_pipe")
    assert done.returncode == 0, done.stdout + done.stderr
    after = snapshot(venv)
    assert not differences(before, after), differences(before, after)
    assert "lerobot-pipe" not in after and not (venv / "bin/lerobot-pipe").exists()
    assert_pip_check(venv)
