"""convert_checkpoint on real 2-rank FSDP2 DCP checkpoints (see conftest.py)."""

from __future__ import annotations

import filecmp
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lerobot_pipe import constants as C
from lerobot_pipe.convert import (
    ConversionError,
    convert_checkpoint,
    load_dcp_state_dict,
    read_dcp_metadata,
    verify_against_dcp,
)
from lerobot_pipe.convert import dcp_to_safetensors as mod
from lerobot_pipe.utils.locate import pretrained_dir

pytestmark = pytest.mark.torch_range


def _assert_same_tensors(path: Path, reference: Path) -> None:
    got, want = load_file(str(path)), load_file(str(reference))
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert got[key].shape == want[key].shape, key
        assert torch.equal(got[key], want[key]), key


def _snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _pretrained(step: Path) -> Path:
    return step / C.PRETRAINED_MODEL_DIR


def _dcp(step: Path) -> Path:
    return _pretrained(step) / C.MODEL_DCP_DIR


def _data_member_span(
    dcp_dir: Path, fqn_part: str, member_part: str = "/data/"
) -> tuple[Path, int, int]:
    """(shard file, start, length) of one zip member (default: the raw tensor bytes) of the
    largest torch.save record of a tensor."""
    metadata = read_dcp_metadata(dcp_dir)
    index, info = max(
        ((i, s) for i, s in metadata.storage_data.items() if fqn_part in i.fqn),
        key=lambda kv: kv[1].length,
    )
    path = dcp_dir / info.relative_path
    with open(path, "rb") as f:
        f.seek(info.offset)
        blob = f.read(info.length)
    import io
    import struct

    zf = zipfile.ZipFile(io.BytesIO(blob))
    member = next(zi for zi in zf.infolist() if member_part in zi.filename)
    header = blob[member.header_offset : member.header_offset + 30]
    n, m = struct.unpack("<HH", header[26:30])
    start = info.offset + member.header_offset + 30 + n + m
    return path, start, member.file_size


def _flip_byte(path: Path, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x5A]))


# ---------------------------------------------------------------------------------------------


def test_converted_tensors_equal_full_state_dict(dcp_step):
    step, reference = dcp_step
    out = convert_checkpoint(step)
    assert out == _pretrained(step) / C.MODEL_SAFETENSORS
    _assert_same_tensors(out, reference)
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        names = f.keys()
        assert {f.get_slice(k).get_dtype() for k in names} == {"F32"}
    # Byte-identical to what save_file writes for the gathered state dict.
    expected = out.with_name("expected.safetensors")
    save_file(load_file(str(reference)), str(expected), metadata={"format": "pt"})
    assert out.read_bytes() == expected.read_bytes()
    umask = os.umask(0o022)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
    # The DCP is kept by default and nothing else appears.
    assert (_dcp(step) / ".metadata").is_file()
    assert not [p for p in _pretrained(step).iterdir() if p.name.startswith(".")]


def test_load_dcp_state_dict_matches_reference(dcp_step):
    step, reference = dcp_step
    state = load_dcp_state_dict(_dcp(step))
    want = load_file(str(reference))
    assert sorted(state) == sorted(want)
    assert all(torch.equal(state[k], want[k]) for k in want)
    partial = load_dcp_state_dict(_dcp(step), keys=["model.action_head.weight"])
    assert list(partial) == ["model.action_head.weight"]
    assert torch.equal(partial["model.action_head.weight"], want["model.action_head.weight"])


def test_pretrained_dir_accepts_step_pretrained_and_dcp_dirs(dcp_step):
    """The one resolver of "a step folder or its pretrained_model/" (policies.locate), which the
    converter uses."""
    step, _ = dcp_step
    pretrained = _pretrained(step)
    assert pretrained_dir(step) == pretrained
    assert pretrained_dir(pretrained) == pretrained
    assert pretrained_dir(_dcp(step)) == pretrained
    last = step.parent / C.LAST_CHECKPOINT_LINK
    last.symlink_to(step.name)
    assert pretrained_dir(last) == last / C.PRETRAINED_MODEL_DIR
    assert convert_checkpoint(_dcp(step)) == pretrained / C.MODEL_SAFETENSORS


def test_second_run_changes_nothing(dcp_step, caplog):
    step, _ = dcp_step
    caplog.set_level("INFO")
    convert_checkpoint(step)
    before = _snapshot(step)
    caplog.clear()
    convert_checkpoint(_pretrained(step))
    assert "Already converted" in caplog.text
    assert _snapshot(step) == before


def test_output_dir_is_a_complete_folder(dcp_step, tmp_path):
    step, reference = dcp_step
    out_dir = tmp_path / "export" / "000001"
    weights = convert_checkpoint(step, output_dir=out_dir)
    assert weights == out_dir / C.MODEL_SAFETENSORS
    src = _pretrained(step)
    expected = {p.name for p in src.iterdir() if p.name != C.MODEL_DCP_DIR} | {C.MODEL_SAFETENSORS}
    assert {p.name for p in out_dir.iterdir()} == expected
    for name in expected - {C.MODEL_SAFETENSORS}:
        assert filecmp.cmp(src / name, out_dir / name, shallow=False), name
    assert {C.CONFIG_NAME, C.TRAIN_CONFIG_NAME, "policy_preprocessor.json"} <= expected
    _assert_same_tensors(weights, reference)
    # The source keeps its DCP and gets no weights file.
    assert _dcp(step).is_dir() and not (src / C.MODEL_SAFETENSORS).exists()
    before = _snapshot(out_dir)
    convert_checkpoint(step, output_dir=out_dir)
    assert _snapshot(out_dir) == before


def test_output_dir_copies_weights_of_a_step_without_dcp(dcp_step, tmp_path, caplog):
    step, reference = dcp_step
    convert_checkpoint(step, delete_dcp=True)  # now a "safetensors" step
    assert not _dcp(step).exists()
    caplog.set_level("INFO")
    out_dir = tmp_path / "export"
    weights = convert_checkpoint(step, output_dir=out_dir)
    assert filecmp.cmp(weights, _pretrained(step) / C.MODEL_SAFETENSORS, shallow=False)
    assert (out_dir / C.CONFIG_NAME).is_file()
    _assert_same_tensors(weights, reference)
    # Without --output_dir there is nothing to do, and that is not an error.
    assert convert_checkpoint(step) == _pretrained(step) / C.MODEL_SAFETENSORS


def test_delete_dcp_after_verification(dcp_step, caplog):
    step, reference = dcp_step
    caplog.set_level("INFO")
    out = convert_checkpoint(step, delete_dcp=True)
    assert "Verified" in caplog.text and "Deleted" in caplog.text
    assert not _dcp(step).exists()
    assert not [p for p in _pretrained(step).iterdir() if p.name.startswith(".")]
    _assert_same_tensors(out, reference)
    # The optimizer DCP is not the converter's business.
    assert (step / C.TRAINING_STATE_DIR / C.OPTIMIZER_DCP_DIR / ".metadata").is_file()


def test_delete_dcp_on_an_already_converted_step(dcp_step):
    step, reference = dcp_step
    convert_checkpoint(step)
    mtime = (_pretrained(step) / C.MODEL_SAFETENSORS).stat().st_mtime_ns
    out = convert_checkpoint(step, delete_dcp=True)
    assert not _dcp(step).exists()
    assert out.stat().st_mtime_ns == mtime
    _assert_same_tensors(out, reference)


def test_delete_dcp_keeps_shards_when_the_written_file_differs(dcp_step, monkeypatch):
    step, _ = dcp_step
    real = mod.save_file

    def buggy(tensors, filename, **kwargs):  # a writer that damages what it writes
        real(tensors, filename, **kwargs)
        with open(filename, "r+b") as f:
            f.seek(-4, os.SEEK_END)
            f.write(b"\x00\x00\x80\x7f")  # last float -> inf

    monkeypatch.setattr(mod, "save_file", buggy)
    before = _snapshot(_dcp(step))
    with pytest.raises(ConversionError, match="does not match the DCP shards.*values differ"):
        convert_checkpoint(step, delete_dcp=True)
    assert _snapshot(_dcp(step)) == before
    assert not (_pretrained(step) / C.MODEL_SAFETENSORS).exists()
    assert not [p for p in _pretrained(step).iterdir() if p.name.startswith(".")]


def test_verify_against_dcp_reports_mismatches(dcp_step, tmp_path):
    step, reference = dcp_step
    state = load_dcp_state_dict(_dcp(step))
    verify_against_dcp(reference, state)
    changed = dict(state)
    key = "model.action_head.bias"
    changed[key] = state[key].clone()
    changed[key][0] = -changed[key][0]
    with pytest.raises(ConversionError, match=f"{key}: values differ"):
        verify_against_dcp(reference, changed)
    with pytest.raises(ConversionError, match="missing 1 tensors"):
        verify_against_dcp(reference, {**state, "extra.weight": torch.zeros(2)})
    with pytest.raises(ConversionError, match="dtype"):
        verify_against_dcp(reference, {**state, key: state[key].double()})
    nan_file = tmp_path / "nan.safetensors"
    save_file({"x": torch.tensor([float("nan"), 1.0])}, str(nan_file))
    verify_against_dcp(nan_file, {"x": torch.tensor([float("nan"), 1.0])})


@pytest.mark.parametrize("where", ["data", "pickle", "truncate", "missing", "metadata"])
def test_corrupt_dcp_fails_and_keeps_everything(dcp_step, where):
    step, _ = dcp_step
    dcp_dir = _dcp(step)
    path, start, length = _data_member_span(dcp_dir, "linear1.weight")
    if where == "data":
        _flip_byte(path, start + length // 2)
        match = f"{path.name} is corrupt"
    elif where == "pickle":
        path, start, length = _data_member_span(dcp_dir, "linear1.weight", "data.pkl")
        _flip_byte(path, start + length // 2)
        match = f"{path.name} is corrupt"
    elif where == "truncate":
        os.truncate(path, path.stat().st_size - 100)
        match = f"{path.name} is truncated"
    elif where == "missing":
        path.unlink()
        match = f"{path.name} is missing"
    else:
        (dcp_dir / ".metadata").write_bytes(b"\x80\x04not a pickle")
        match = ".metadata is corrupt"
    before_dcp = _snapshot(dcp_dir)
    before = sorted(p.name for p in _pretrained(step).iterdir())
    for delete in (False, True):
        with pytest.raises(ConversionError, match=match):
            convert_checkpoint(step, delete_dcp=delete)
        assert _snapshot(dcp_dir) == before_dcp
        assert sorted(p.name for p in _pretrained(step).iterdir()) == before


def test_load_dcp_state_dict_detects_a_bit_flip(dcp_step):
    step, _ = dcp_step
    path, start, length = _data_member_span(_dcp(step), "in_proj_weight")
    _flip_byte(path, start + length - 1)
    with pytest.raises(ConversionError, match=f"{path.name} is corrupt: its SHA-256"):
        load_dcp_state_dict(_dcp(step))
    with pytest.raises(ConversionError, match=f"{path.name} is corrupt"):
        convert_checkpoint(step)
    assert not (_pretrained(step) / C.MODEL_SAFETENSORS).exists()


def test_missing_metadata_is_named(dcp_step):
    step, _ = dcp_step
    (_dcp(step) / ".metadata").unlink()
    with pytest.raises(ConversionError, match=r"\.metadata is missing"):
        convert_checkpoint(step)


def test_corrupt_dcp_with_existing_output_keeps_the_output(dcp_step):
    step, _ = dcp_step
    out = convert_checkpoint(step)
    before = _snapshot(_pretrained(step))
    path, start, length = _data_member_span(_dcp(step), "linear2.weight")
    _flip_byte(path, start + 3)
    with pytest.raises(ConversionError, match="corrupt"):
        convert_checkpoint(step, delete_dcp=True)
    after = _snapshot(_pretrained(step))
    assert after[C.MODEL_SAFETENSORS] == before[C.MODEL_SAFETENSORS]
    assert out.is_file() and _dcp(step).is_dir()


@pytest.mark.parametrize("damage", ["truncate", "other_values"])
def test_damaged_output_is_detected_and_rewritten(dcp_step, damage, caplog):
    step, reference = dcp_step
    out = convert_checkpoint(step)
    if damage == "truncate":
        os.truncate(out, out.stat().st_size - 1000)
    else:
        state = load_file(str(out))
        state["model.action_scale"] = state["model.action_scale"] + 1
        save_file(state, str(out), metadata={"format": "pt"})
    caplog.set_level("INFO")
    convert_checkpoint(step)
    assert "rewriting" in caplog.text
    _assert_same_tensors(out, reference)


def test_output_not_writable(dcp_step, tmp_path):
    step, _ = dcp_step
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ConversionError, match="not writable"):
        convert_checkpoint(step, output_dir=blocker / "out")


def test_write_failure_leaves_no_temp_file(dcp_step, monkeypatch):
    step, _ = dcp_step

    def no_space(tensors, filename, **kwargs):
        Path(filename).write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mod, "save_file", no_space)
    with pytest.raises(ConversionError, match="cannot write .*No space left"):
        convert_checkpoint(step)
    assert sorted(p.name for p in _pretrained(step).iterdir() if p.name.startswith(".")) == []
    assert not (_pretrained(step) / C.MODEL_SAFETENSORS).exists()


def test_nothing_to_convert(tmp_path):
    pretrained = tmp_path / "step" / C.PRETRAINED_MODEL_DIR
    pretrained.mkdir(parents=True)
    (pretrained / C.CONFIG_NAME).write_text("{}")
    with pytest.raises(ConversionError, match="nothing to convert"):
        convert_checkpoint(tmp_path / "step")
    with pytest.raises(ConversionError, match="nothing to convert"):
        convert_checkpoint(tmp_path)
    with pytest.raises(ConversionError, match="nothing to convert"):
        convert_checkpoint(tmp_path / "step", output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "bad, match",
    [
        ("https://huggingface.co/me/policy", "URL"),
        ("hf://me/policy", "URL"),
        ("s3://bucket/run/checkpoints/005000", "URL"),
        ("me/policy", "Hub repo id"),
    ],
)
def test_remote_locations_are_refused(bad, match, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConversionError, match=match):
        convert_checkpoint(bad)


def test_missing_checkpoint_dir(tmp_path):
    with pytest.raises(ConversionError, match="does not exist"):
        convert_checkpoint(tmp_path / "nope")


def test_peft_dcp_converts_to_adapter_file(peft_step, tmp_path):
    step, reference = peft_step
    out = convert_checkpoint(step)
    assert out == _pretrained(step) / C.ADAPTER_SAFETENSORS
    assert not (_pretrained(step) / C.MODEL_SAFETENSORS).exists()
    _assert_same_tensors(out, reference)
    keys = set(load_file(str(out)))
    assert any(".lora_A.weight" in k for k in keys)
    assert "base_model.model.model.action_head.weight" in keys  # modules_to_save
    assert not any(".default." in k or "base_layer" in k for k in keys)
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    # --output_dir + --delete_dcp: complete adapter folder, then the shards go.
    export = tmp_path / "export"
    weights = convert_checkpoint(step, output_dir=export, delete_dcp=True)
    assert (export / C.ADAPTER_CONFIG_NAME).is_file()
    assert not (export / C.MODEL_SAFETENSORS).exists()
    _assert_same_tensors(weights, reference)
    assert not _dcp(step).exists()


def test_copy_tree_skips_output_inside_source(dcp_step):
    step, _ = dcp_step
    inner = _pretrained(step) / "converted"
    convert_checkpoint(step, output_dir=inner)
    assert not (inner / "converted").exists()
    assert (inner / C.MODEL_SAFETENSORS).is_file()
    shutil.rmtree(inner)


def test_convert_mixed_dtypes(tmp_path):
    import warnings

    import torch.distributed.checkpoint as dcp

    state = {
        "a.weight": torch.randn(5, 3),
        "b.weight": torch.randn(4, 2).to(torch.bfloat16),
        "c.count": torch.tensor(7, dtype=torch.int64),
        "d.mask": torch.tensor([True, False, True]),
        "e.half": torch.randn(3).half(),
        "f.empty": torch.zeros(0, 4),
        "g.scalar": torch.tensor(1.5),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(tmp_path / C.MODEL_DCP_DIR), no_dist=True)
    out = convert_checkpoint(tmp_path, delete_dcp=True)
    got = load_file(str(out))
    assert sorted(got) == sorted(state)
    for k, v in state.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
