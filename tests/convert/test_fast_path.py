"""The converter's direct-copy path: record templates, the CRC implementation, durability.

Runs on the real 2-rank FSDP2 checkpoint of conftest.py.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from lerobot_pipe import constants as C
from lerobot_pipe.convert import convert_checkpoint, read_dcp_metadata
from lerobot_pipe.convert import dcp_to_safetensors as mod


def _dcp(step: Path) -> Path:
    return step / C.PRETRAINED_MODEL_DIR / C.MODEL_DCP_DIR


def _layout(step: Path):
    metadata = read_dcp_metadata(_dcp(step))
    layout = mod._direct_layout(metadata, {k: k for k in mod._tensor_entries(metadata)})
    assert layout is not None
    return layout


def _inspect_all(step: Path, cache) -> list:
    out = []
    for record, dtype, _ in _layout(step).records:
        fd = os.open(_dcp(step) / record.relative_path, os.O_RDONLY)
        try:
            with mod._map_readonly(fd) as mm:
                out.append(mod._inspect_record(fd, mm, record, dtype, cache))
        finally:
            os.close(fd)
    return out


def test_templates_give_the_full_parse_results(dcp_step, monkeypatch):
    """Records recognised by a template get exactly what a full zip parse of each gives, and
    only the first record of each structure is parsed in full."""
    step, _ = dcp_step
    full = _inspect_all(step, mod._InspectCache(templates=_NeverStores()))
    parses = []
    real = mod._zip_members
    monkeypatch.setattr(mod, "_zip_members", lambda *a: parses.append(1) or real(*a))
    cache = mod._InspectCache()
    fast = _inspect_all(step, cache)
    assert None not in full
    assert fast == full
    assert len(parses) == len(cache.templates) < len(full)


class _NeverStores(dict):
    def __setitem__(self, key, value) -> None:
        pass


def test_a_template_never_accepts_a_record_the_full_parse_would_not(dcp_step, tmp_path):
    """Flip each byte outside the data of a record that a template recognises, one at a time:
    the template path must give what a full parse of the damaged record gives (usually None,
    i.e. the generic path, which then names the corrupt file)."""
    step, _ = dcp_step
    records = _layout(step).records
    seen, pick = set(), None
    for record, dtype, _ in records:  # the second record of the smallest repeated structure
        key = (record.length, dtype, record.chunk_sizes)
        if key in seen and (pick is None or record.length < pick[0].length):
            pick = (record, dtype)
        seen.add(key)
    assert pick is not None
    record, dtype = pick
    warm = mod._InspectCache()
    _inspect_all(step, warm)
    assert (record.length, dtype, record.chunk_sizes) in warm.templates

    with open(_dcp(step) / record.relative_path, "rb") as f:
        f.seek(record.offset)
        blob = f.read(record.length)
    alone = tmp_path / "record.bin"
    alone.write_bytes(blob)
    solo = mod._Record(
        record.fqn, record.chunk_offsets, record.chunk_sizes, "record.bin", 0, record.length, False
    )
    fd = os.open(alone, os.O_RDWR)
    try:
        with mod._map_readonly(fd) as mm:
            data_start, nbytes, _ = mod._inspect_record(fd, mm, solo, dtype, warm)
        accepted = 0
        for pos in range(record.length):
            if data_start <= pos < data_start + nbytes:
                continue
            os.pwrite(fd, bytes([blob[pos] ^ 0x20]), pos)
            try:
                with mod._map_readonly(fd) as mm:
                    templated = _attempt(fd, mm, solo, dtype, warm)
                    parsed = _attempt(fd, mm, solo, dtype, mod._InspectCache(dict(warm.layouts)))
            finally:
                os.pwrite(fd, bytes([blob[pos]]), pos)
            assert templated == parsed, f"byte {pos}"
            accepted += templated is not None
    finally:
        os.close(fd)
    # Bytes no reader looks at (alignment padding, timestamps, CRC fields torch leaves empty)
    # may change without the record being refused; the small members' bytes may not.
    assert 0 < accepted < record.length - nbytes


def _attempt(fd, mm, record, dtype, cache):
    """_inspect_record as _write_direct sees it: an exception means "not plain" too."""
    try:
        return mod._inspect_record(fd, mm, record, dtype, cache)
    except Exception:
        return None


def test_crc_is_zlibs_crc32():
    data = os.urandom(1 << 20) + b"tail"
    assert mod._crc32(data) & 0xFFFFFFFF == zlib.crc32(data)
    assert mod._crc32.__module__.startswith("isal")  # a dependency: the fast CRC is in use


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
    pretrained = step / C.PRETRAINED_MODEL_DIR
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
