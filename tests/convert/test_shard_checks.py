"""What the converter checks before it writes or deletes anything, and when it makes the output
durable. Runs on the real 2-rank FSDP2 checkpoint of conftest.py (whose training_step.json lists
the size and SHA-256 of every file, as the trainer's does)."""

from __future__ import annotations

import logging
import os
import pickle
import resource
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lerobot_pipe import constants as C
from lerobot_pipe.convert import (
    ConversionError,
    convert_checkpoint,
    dcp_read,
    load_dcp_state_dict,
    verify,
    verify_against_dcp,
)
from lerobot_pipe.convert import dcp_to_safetensors as mod

pytestmark = pytest.mark.torch_range


def _pretrained(step: Path) -> Path:
    return step / C.PRETRAINED_MODEL_DIR


def _dcp(step: Path) -> Path:
    return _pretrained(step) / C.MODEL_DCP_DIR


def _contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _flip(path: Path, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))


def _drop_manifest(step: Path) -> None:
    (step / C.TRAINING_STATE_DIR / C.TRAINING_STEP).unlink()


def test_a_flipped_bit_anywhere_in_a_dcp_file_is_refused_before_anything_changes(
    dcp_step, tmp_path
):
    """Shards and .metadata: the first and last byte and 30 more spread over each file, one at a
    time; every time the conversion (with --output_dir and --delete_dcp) fails naming the file and
    leaves the checkpoint as it was and no output folder."""
    step, _ = dcp_step
    out = tmp_path / "export"
    before = _contents(_pretrained(step))
    files = sorted(_dcp(step).iterdir())
    assert len(files) == 3  # two ranks' shards + .metadata
    for path in files:
        size = path.stat().st_size
        for pos in sorted({0, size - 1, *range(0, size, max(1, size // 30))}):
            _flip(path, pos)
            with pytest.raises(ConversionError, match=f"{path.name} is corrupt"):
                convert_checkpoint(step, output_dir=out, delete_dcp=True)
            _flip(path, pos)
            assert not out.exists(), (path.name, pos)
            assert sorted(_contents(_pretrained(step))) == sorted(before), (path.name, pos)
    assert _contents(_pretrained(step)) == before


class _Touch:
    """A pickle that creates a file when loaded: what a hostile .metadata could do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_the_manifest_is_checked_before_metadata_is_unpickled(dcp_step, tmp_path):
    step, _ = dcp_step
    marker = tmp_path / "pickle-ran"
    (_dcp(step) / ".metadata").write_bytes(pickle.dumps(_Touch(marker)))
    with pytest.raises(ConversionError, match=r"\.metadata is corrupt"):
        convert_checkpoint(step)
    assert not marker.exists()
    _drop_manifest(step)  # without the manifest the pickle is loaded (local folders only)
    with pytest.raises(ConversionError, match=r"\.metadata is corrupt"):
        convert_checkpoint(step)
    assert marker.exists()


def test_without_a_manifest_damage_is_still_named_but_a_data_bit_flip_is_not_found(
    dcp_step, caplog
):
    step, reference = dcp_step
    _drop_manifest(step)
    caplog.set_level(logging.WARNING, logger=dcp_read.__name__)
    out = convert_checkpoint(step, delete_dcp=False)
    assert "No file manifest lists" in caplog.text and "flipped bit" in caplog.text
    assert load_file(str(out)).keys() == load_file(str(reference)).keys()
    out.unlink()

    shard = sorted(_dcp(step).glob("*.distcp"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    with pytest.raises(ConversionError, match=f"{shard} is truncated or corrupt"):
        convert_checkpoint(step, delete_dcp=True)
    shard.unlink()
    with pytest.raises(ConversionError, match=f"{shard} is missing"):
        convert_checkpoint(step, delete_dcp=True)
    assert not out.exists() and (_dcp(step) / ".metadata").is_file()

    # The limit the warning states: torch's reader does not check the records' CRC-32s.
    shard.write_bytes(data)
    state = load_dcp_state_dict(_dcp(step))
    _flip(shard, len(data) // 2)
    flipped = load_dcp_state_dict(_dcp(step))
    assert any(not torch.equal(state[k], flipped[k]) for k in state)


def test_a_malformed_training_step_json_is_named(dcp_step):
    step, _ = dcp_step
    info = step / C.TRAINING_STATE_DIR / C.TRAINING_STEP
    info.write_text('{"step": 1,')
    with pytest.raises(ConversionError, match=f"{info}.*not valid JSON"):
        convert_checkpoint(step)
    assert not (_pretrained(step) / C.MODEL_SAFETENSORS).exists()


def test_read_back_through_many_handles_still_compares_every_tensor(dcp_step, monkeypatch):
    step, reference = dcp_step
    monkeypatch.setattr(verify, "_READBACK_BYTES", 1)  # a new safe_open handle for every tensor
    state = load_dcp_state_dict(_dcp(step))
    verify_against_dcp(reference, state)
    last = sorted(state)[-1]
    changed = {**state, last: state[last].clone()}
    changed[last].view(-1)[-1] += 1
    with pytest.raises(ConversionError, match=f"{last}: values differ"):
        verify_against_dcp(reference, changed)


def test_a_real_write_failure_leaves_no_file(dcp_step):
    """A file size limit (RLIMIT_FSIZE) makes the writes fail half-way with EFBIG."""
    step, reference = dcp_step
    limit = reference.stat().st_size // 2
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        with pytest.raises(ConversionError, match="cannot write .*File too large"):
            convert_checkpoint(step, delete_dcp=True)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert [p.name for p in _pretrained(step).iterdir() if p.name.startswith(".")] == []
    assert not (_pretrained(step) / C.MODEL_SAFETENSORS).exists()
    assert (_dcp(step) / ".metadata").is_file()


# --------------------------------------------------------------------------------------------
# Durability: fsync exactly when the shards are about to go


def _spy(monkeypatch, events: list) -> None:
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.fspath(src), os.fspath(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(mod.os, "fsync", fsync)
    monkeypatch.setattr(mod.os, "replace", replace)


def test_plain_conversion_does_not_fsync(dcp_step, monkeypatch):
    """Without --delete_dcp the shards stay: the output is atomic (temp file + rename) but not
    fsynced, like save_file's; a damaged file is rewritten by the next run (test_convert_dcp)."""
    step, _ = dcp_step
    events: list = []
    _spy(monkeypatch, events)
    out = convert_checkpoint(step)
    assert [e for e in events if e[0] == "fsync"] == []
    assert [e[2] for e in events if e[0] == "replace"] == [str(out)]


@pytest.mark.parametrize("converted_before", [False, True])
def test_delete_dcp_makes_the_output_durable_before_deleting(
    dcp_step, monkeypatch, converted_before
):
    step, _ = dcp_step
    pretrained = _pretrained(step)
    if converted_before:
        convert_checkpoint(step)  # not fsynced: the deleting run must fsync it first
    events: list = []
    _spy(monkeypatch, events)
    out = convert_checkpoint(step, delete_dcp=True)
    assert not _dcp(step).exists()
    doomed = next(i for i, e in enumerate(events) if e[0] == "replace" and e[1] == str(_dcp(step)))
    before = events[:doomed]
    synced = [e[1] for e in before if e[0] == "fsync"]
    assert str(pretrained.resolve()) in synced  # the folder holding the renamed-in file
    if converted_before:
        assert str(out.resolve()) in synced
    else:
        tmp = next(e[1] for e in before if e[0] == "replace" and e[2] == str(out))
        assert str(Path(tmp).resolve()) in synced  # fsynced before its rename
