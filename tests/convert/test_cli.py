"""lerobot-convert-dcp: flags, exit codes and one-line errors."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lerobot_pipe import constants as C
from lerobot_pipe.configs.parser import convert_value, parse_options
from lerobot_pipe.scripts.convert_dcp import ConvertOptions, main

FLAGS = [f"--{f.name}" for f in dataclasses.fields(ConvertOptions)]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "lerobot_pipe.scripts.convert_dcp", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(
    "text, value",
    [("true", True), ("1", True), ("YES", True), ("false", False), ("0", False), ("no", False)],
)
def test_parse_bool(text, value):
    """The booleans of every console script (the dotted-flag parser's)."""
    assert convert_value(text, bool, "delete_dcp") is value


def test_both_flag_forms():
    argv = ["--checkpoint_dir=x", "--delete_dcp=yes", "--output_dir", "o"]
    a, _ = parse_options(ConvertOptions, argv)
    assert (a.checkpoint_dir, a.delete_dcp, a.output_dir, a.private) == ("x", True, "o", False)
    b, _ = parse_options(
        ConvertOptions, ["--checkpoint_dir", "x", "--delete_dcp", "--private", "0"]
    )
    assert (b.delete_dcp, b.private, b.push_to_hub) == (True, False, None)


def test_unknown_flag_exits_2_naming_it(capsys):
    assert main(["--checkpoint_dir=x", "--delete_dcp_now=true"]) == 2
    err = capsys.readouterr().err
    assert "--delete_dcp_now: unknown flag" in err
    for flag in FLAGS:
        assert flag in err


def test_bad_bool_and_missing_required_exit_2(capsys):
    assert main(["--checkpoint_dir=x", "--delete_dcp=maybe"]) == 2
    assert "expected true or false" in capsys.readouterr().err
    assert main([]) == 2
    assert "--checkpoint_dir" in capsys.readouterr().err


def test_help_mentions_local_only(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "LOCAL" in out and "pickle" in out


@pytest.mark.parametrize(
    "arg, message",
    [
        ("{tmp}/missing", "does not exist"),
        ("https://huggingface.co/me/act", "URL"),
        ("me/act", "Hub repo id"),
        ("{tmp}", "nothing to convert"),
    ],
)
def test_errors_exit_1_with_one_line(arg, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([f"--checkpoint_dir={arg.format(tmp=tmp_path)}"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and message in err[0]


def test_output_not_writable_exit_1(dcp_step, tmp_path, capsys):
    step, _ = dcp_step
    (tmp_path / "file").write_text("x")
    assert main([f"--checkpoint_dir={step}", f"--output_dir={tmp_path / 'file' / 'out'}"]) == 1
    assert "not writable" in capsys.readouterr().err


def test_cli_process_converts_then_reports_already_converted(dcp_step):
    step, reference = dcp_step
    first = _run([f"--checkpoint_dir={step}"])
    assert first.returncode == 0, first.stderr
    out = step / C.PRETRAINED_MODEL_DIR / C.MODEL_SAFETENSORS
    assert first.stdout.strip() == str(out)
    assert "Loading DCP from" in first.stderr and "Wrote" in first.stderr
    got, want = load_file(str(out)), load_file(str(reference))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    stat = out.stat()
    second = _run(["--checkpoint_dir", str(step / C.PRETRAINED_MODEL_DIR), "--delete_dcp=false"])
    assert second.returncode == 0, second.stderr
    assert "Already converted" in second.stderr
    assert out.stat().st_mtime_ns == stat.st_mtime_ns


def test_cli_process_corrupt_shard_one_line_no_traceback(dcp_step):
    step, _ = dcp_step
    shard = next((step / C.PRETRAINED_MODEL_DIR / C.MODEL_DCP_DIR).glob("*.distcp"))
    os.truncate(shard, shard.stat().st_size // 2)
    result = _run([f"--checkpoint_dir={step}", "--delete_dcp=true"])
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and shard.name in errors[0] and "truncated" in errors[0]
    assert shard.exists() and not Path(shard.parent.parent / C.MODEL_SAFETENSORS).exists()


def test_push_to_hub_calls_publish_folder(dcp_step, tmp_path, monkeypatch):
    """Only the wiring: publish_folder itself is tested by the hub suite."""
    import lerobot_pipe.hub.publish as publish

    calls = []

    class Receipt:
        repo_id, commit_id = "me/act", "abc123"

    def fake_publish(folder, repo_id, **kwargs):
        calls.append((Path(folder), repo_id, kwargs))
        return Receipt()

    monkeypatch.setattr(publish, "publish_folder", fake_publish)
    step, _ = dcp_step
    out = tmp_path / "export"
    args = [f"--checkpoint_dir={step}", f"--output_dir={out}", "--push_to_hub=me/act"]
    assert main([*args, "--private=yes"]) == 0
    assert calls == [(out, "me/act", {"private": True})]

    def failing(folder, repo_id, **kwargs):
        raise publish.PublishError("401 Unauthorized: log in with `hf auth login`")

    monkeypatch.setattr(publish, "publish_folder", failing)
    assert main(args) == 1


def test_ctrl_c_while_reading_the_shards_exits_130(dcp_step, monkeypatch, capsys):
    """DCP wraps what its reader raises into a CheckpointException; Ctrl-C must still be one."""
    step, _ = dcp_step

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "load", interrupted)  # what DCP's reader calls per stored chunk
    assert main([f"--checkpoint_dir={step}", "--delete_dcp=true"]) == 130
    assert "interrupted; nothing was deleted" in capsys.readouterr().err
    pretrained = step / C.PRETRAINED_MODEL_DIR
    assert (pretrained / C.MODEL_DCP_DIR / ".metadata").is_file()
    assert not (pretrained / C.MODEL_SAFETENSORS).exists()
