"""Offline conversion of a model DCP checkpoint (``pytorch_model_fsdp_0/``) into safetensors.

A sharded run (``--checkpoint_format=dcp`` or ``safetensors_dcp``) saves the model with
``torch.distributed.checkpoint.save(get_model_state_dict(model), checkpoint_id=...)`` into
``<step>/pretrained_model/pytorch_model_fsdp_0/``. This module merges those shards into the file a
``safetensors`` run would have written, on one CPU process with no process group:

* ``model.safetensors``: the full fp32 state dict, same keys and bit-identical tensors;
* for a PEFT run (``adapter_config.json`` present): ``adapter_model.safetensors`` with only the
  adapter (and ``modules_to_save``) tensors, named as ``peft.get_peft_model_state_dict`` names them.

Only the model DCP folder is read (never the optimizer state). Every shard record is checked against
the CRC-32 that ``torch.save`` stored with it, so a bit flip or a truncated ``.distcp`` file fails
the conversion instead of producing wrong weights (CRC-32 from ISA-L when ``isal`` is installed, a
dependency of this package: ~6x zlib's speed). The output is written atomically (temporary file in
the same folder, ``os.replace``): a killed conversion never leaves a partial file under the final
name. It is also made durable (fsync of the file and the folder) exactly when the shards are about
to go, i.e. with ``delete_dcp``: without it the shards stay the source of truth, and a file that a
power cut damaged is found and rewritten by the next run (see below), like any file that
``save_file`` or ``save_pretrained`` wrote. An existing output that already holds exactly the DCP's
tensors is left untouched ("already converted").

Security: DCP's ``.metadata`` file is a Python pickle, and unpickling runs code. Load DCP only from
a local folder your own run wrote. Anything that looks like a URL or a Hub repo id is refused.

Fast path: for the usual layout (row shards of contiguous tensors stored uncompressed by
``torch.save``, little-endian) the raw bytes of each shard record are copied straight into their
place in the output file (safetensors header written by this module, in safetensors' own tensor
order) while their CRC-32 is checked on a second thread (with ``delete_dcp`` the disk writeback
also starts as soon as each range is written). Records of an already seen structure are recognised
by comparing bytes (``_Template``) instead of a full zip parse. Peak memory stays below the size of
the largest shard file. Any other
layout falls back to ``torch.distributed.checkpoint.load`` into freshly allocated tensors followed
by ``safetensors.torch.save_file``. Either way the result is bit-identical.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import json
import logging
import mmap
import os
import re
import shutil
import struct
import sys
import time
import uuid
import warnings
import zipfile
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch

from lerobot_pipe import constants as C
from lerobot_pipe.fsutil import fsync_path
from lerobot_pipe.training.faults import fault_point

logger = logging.getLogger(__name__)

try:  # ISA-L's CRC-32 (carry-less multiply): ~13 GB/s against zlib 1.2's ~2 GB/s; same values
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
    from zlib import crc32 as _crc32

DCP_METADATA_FILE = ".metadata"
SAFETENSORS_METADATA = {"format": "pt"}
# Files of the source folder that are never copied into --output_dir.
_NOT_COPIED = frozenset({C.MODEL_DCP_DIR, C.PUBLISH_RECEIPT, C.CONVERT_RECEIPT})
_TMP_MARKERS = (".tmp-", ".deleting-")
# Bytes read at each end of a torch.save record: its members list and small members sit there.
_ZIP_WINDOW = 8 * 1024

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
}

# peft's LoraLayer.adapter_layer_names (checked against peft in the tests); other PEFT types ask peft.
_LORA_LAYER_NAMES = (
    "lora_A",
    "lora_B",
    "lora_embedding_A",
    "lora_embedding_B",
    "lora_magnitude_vector",
)
_PROMPT_LEARNING_TYPES = frozenset(
    {"PROMPT_TUNING", "MULTITASK_PROMPT_TUNING", "P_TUNING", "PREFIX_TUNING", "CPT"}
)


class ConversionError(RuntimeError):
    """The conversion cannot proceed; the message says why in one line. Nothing was deleted."""


# --------------------------------------------------------------------------------------------
# Locating the checkpoint


def _local_dir(checkpoint_dir: str | os.PathLike[str]) -> Path:
    text = os.fspath(checkpoint_dir)
    if _URL_RE.match(text) or text.startswith(("hf:", "hf.co/", "huggingface.co/")):
        raise ConversionError(
            f"refusing to read a checkpoint from a URL ({text}): DCP metadata is a pickle, so only "
            "a local folder written by your own run is accepted"
        )
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConversionError(f"checkpoint_dir {path} is not a directory")
        return path
    if _HUB_ID_RE.match(text) and not text.startswith("."):
        raise ConversionError(
            f"checkpoint_dir {text} does not exist locally and looks like a Hub repo id: "
            "DCP metadata is a pickle, so only a local folder written by your own run is accepted"
        )
    raise ConversionError(f"checkpoint_dir {path} does not exist")


def find_pretrained_dir(checkpoint_dir: str | os.PathLike[str]) -> Path:
    """Return the ``pretrained_model/`` folder of a step folder.

    Accepts the step folder (``checkpoints/005000``, ``checkpoints/last``), its ``pretrained_model/``
    or the ``pytorch_model_fsdp_0/`` DCP folder itself. Only local folders: URLs and Hub ids are
    refused (DCP metadata is a pickle).
    """
    path = _local_dir(checkpoint_dir)
    if path.name == C.MODEL_DCP_DIR and (path / DCP_METADATA_FILE).exists():
        path = path.parent
    if (path / C.PRETRAINED_MODEL_DIR).is_dir():
        return path / C.PRETRAINED_MODEL_DIR
    markers = (
        C.MODEL_DCP_DIR,
        C.MODEL_SAFETENSORS,
        C.ADAPTER_SAFETENSORS,
        C.CONFIG_NAME,
        C.ADAPTER_CONFIG_NAME,
    )
    if any((path / m).exists() for m in markers):
        return path
    raise ConversionError(
        f"nothing to convert: {path} has no {C.PRETRAINED_MODEL_DIR}/, {C.MODEL_DCP_DIR}/ "
        f"or {C.MODEL_SAFETENSORS}"
    )


# --------------------------------------------------------------------------------------------
# Reading DCP


def _one_line(exc: BaseException) -> str:
    """A one-line description of ``exc`` (the innermost failure of a CheckpointException)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        if isinstance(inner, BaseException):
            exc = inner
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def read_dcp_metadata(dcp_dir: str | os.PathLike[str]):
    """Read (unpickle) the ``.metadata`` of a local DCP folder. Local folders only."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata

    dcp_dir = Path(dcp_dir)
    meta_file = dcp_dir / DCP_METADATA_FILE
    if not dcp_dir.is_dir():
        raise ConversionError(f"DCP folder {dcp_dir} does not exist")
    if not meta_file.is_file():
        raise ConversionError(f"DCP metadata file {meta_file} is missing")
    try:
        metadata = FileSystemReader(str(dcp_dir)).read_metadata()
    except Exception as e:
        raise ConversionError(f"DCP metadata file {meta_file} is corrupt: {_one_line(e)}") from e
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise ConversionError(f"DCP metadata file {meta_file} is corrupt: not a DCP Metadata")
    return metadata


class _Record(NamedTuple):
    """One stored chunk of one tensor: a ``torch.save`` blob inside a ``.distcp`` file."""

    fqn: str
    chunk_offsets: tuple[int, ...]
    chunk_sizes: tuple[int, ...]
    relative_path: str
    offset: int
    length: int
    transformed: bool


def _records(metadata, fqns: Iterable[str]) -> list[_Record]:
    """The storage records of the tensors ``fqns``, in file order. The only place that reads
    DCP's storage layout (``Metadata.storage_data``: MetadataIndex -> storage info)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    wanted = set(fqns)
    out = []
    for index, info in metadata.storage_data.items():
        if index.fqn not in wanted:
            continue
        tmeta = metadata.state_dict_metadata[index.fqn]
        if not isinstance(tmeta, TensorStorageMetadata):
            raise ConversionError(f"DCP entry {index.fqn} is not a tensor")
        offsets = tuple(index.offset) if index.offset is not None else (0,) * len(tmeta.size)
        chunk = None
        if index.index is not None and index.index < len(tmeta.chunks):
            chunk = tmeta.chunks[index.index]
        if chunk is None or tuple(chunk.offsets) != offsets:
            chunk = next((c for c in tmeta.chunks if tuple(c.offsets) == offsets), None)
        if chunk is None:
            raise ConversionError(f"DCP metadata has no chunk at {offsets} for {index.fqn}")
        out.append(
            _Record(
                fqn=index.fqn,
                chunk_offsets=offsets,
                chunk_sizes=tuple(chunk.sizes),
                relative_path=str(info.relative_path),
                offset=int(info.offset),
                length=int(info.length),
                transformed=bool(getattr(info, "transform_descriptors", None)),
            )
        )
    out.sort(key=lambda r: (r.relative_path, r.offset))
    return out


def _tensor_entries(metadata, fqns: Iterable[str] | None = None) -> dict[str, tuple]:
    """fqn -> (dtype, size) for the tensor entries of the checkpoint (all, or ``fqns``)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    entries = metadata.state_dict_metadata
    keys = list(entries) if fqns is None else list(fqns)
    out = {}
    for key in keys:
        if key not in entries:
            raise ConversionError(f"DCP checkpoint has no entry {key}")
        value = entries[key]
        if not isinstance(value, TensorStorageMetadata):
            raise ConversionError(
                f"DCP entry {key} is not a tensor ({type(value).__name__}); safetensors stores "
                "tensors only"
            )
        out[key] = (value.properties.dtype, torch.Size(value.size))
    return out


def _check_shard_files(dcp_dir: Path, records: list[_Record]) -> None:
    """Every shard file exists and is long enough for the records it holds (names the file)."""
    needed: dict[str, int] = {}
    for r in records:
        needed[r.relative_path] = max(needed.get(r.relative_path, 0), r.offset + r.length)
    for rel, end in sorted(needed.items()):
        path = dcp_dir / rel
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise ConversionError(f"DCP shard file {path} is missing") from None
        if size < end:
            raise ConversionError(
                f"DCP shard file {path} is truncated ({size} bytes, metadata needs {end})"
            )


class _FileSlice(io.RawIOBase):
    """A read-only, seekable view of ``length`` bytes at ``offset`` of an open file descriptor.

    ``window`` > 0 reads that many bytes at each end of the slice once and serves reads that fall
    inside from memory (a zip's members list and small members sit there; not its big data).
    """

    def __init__(self, fd: int, offset: int, length: int, window: int = 0):
        super().__init__()
        self._fd, self._offset, self._length, self._pos = fd, offset, length, 0
        self._windows: list[tuple[int, bytes]] = []
        if window > 0:
            if length <= 2 * window:
                self._windows.append((0, os.pread(fd, length, offset)))
            else:
                self._windows.append((0, os.pread(fd, window, offset)))
                tail = length - window
                self._windows.append((tail, os.pread(fd, window, offset + tail)))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self._length - self._pos))
        if n == 0:
            return 0
        for start, blob in self._windows:
            if start <= self._pos and self._pos + n <= start + len(blob):
                buffer[:n] = blob[self._pos - start : self._pos - start + n]
                self._pos += n
                return n
        data = os.pread(self._fd, n, self._offset + self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _check_records_crc(dcp_dir: Path, records: list[_Record]) -> None:
    """Check every member of every record against its zip CRC-32 (torch.save stores one).

    Records written through a storage transform (e.g. compression) are not zip blobs on disk and
    are left to torch's reader."""
    fds: dict[str, int] = {}
    try:
        for r in records:
            if r.transformed:
                continue
            path = dcp_dir / r.relative_path
            if r.relative_path not in fds:
                fds[r.relative_path] = os.open(path, os.O_RDONLY)
            try:
                view = _FileSlice(fds[r.relative_path], r.offset, r.length, window=_ZIP_WINDOW)
                with zipfile.ZipFile(view) as zf:
                    bad = zf.testzip()
            except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
                raise ConversionError(
                    f"DCP shard file {path} is corrupt (the torch.save record of {r.fqn} is not a "
                    f"valid zip: {_one_line(e)})"
                ) from e
            if bad is not None:
                raise ConversionError(
                    f"DCP shard file {path} is corrupt: CRC mismatch in the record of {r.fqn}"
                )
    finally:
        for fd in fds.values():
            os.close(fd)


def load_dcp_state_dict(
    dcp_dir: str | os.PathLike[str], *, keys: Iterable[str] | None = None
) -> dict[str, torch.Tensor]:
    """Load a local model DCP folder into plain CPU tensors, offline (no process group).

    The tensors are allocated from the checkpoint's metadata and filled by the public
    ``torch.distributed.checkpoint.load`` (``no_dist=True``); every record is first checked against
    its stored CRC-32. ``keys`` restricts the load to those entries. Local folders only: the
    metadata is a pickle.
    """
    import torch.distributed.checkpoint as dcp

    dcp_dir = Path(dcp_dir)
    metadata = read_dcp_metadata(dcp_dir)
    entries = _tensor_entries(metadata, keys)
    records = _records(metadata, entries)
    _check_shard_files(dcp_dir, records)
    _check_records_crc(dcp_dir, records)
    state = {k: torch.empty(size, dtype=dtype) for k, (dtype, size) in entries.items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
            dcp.load(
                state,
                storage_reader=dcp.FileSystemReader(str(dcp_dir)),
                planner=dcp.DefaultLoadPlanner(allow_partial_load=True),
                no_dist=True,
            )
    except Exception as e:
        raise ConversionError(f"cannot read DCP shards in {dcp_dir}: {_one_line(e)}") from e
    return state


# --------------------------------------------------------------------------------------------
# PEFT: which DCP entries make up adapter_model.safetensors, and under which names


def _peft_layer_names(peft_type: str) -> tuple[str, ...]:
    if peft_type == "LORA":
        return _LORA_LAYER_NAMES
    if peft_type in _PROMPT_LEARNING_TYPES:
        raise ConversionError(f"PEFT type {peft_type} (prompt learning) is not supported")
    try:
        from peft.mapping import PEFT_TYPE_TO_TUNER_MAPPING

        layer_cls = PEFT_TYPE_TO_TUNER_MAPPING[peft_type].tuner_layer_cls
        return tuple(layer_cls.adapter_layer_names)
    except Exception as e:
        raise ConversionError(f"PEFT type {peft_type} is not supported: {_one_line(e)}") from e


def _remove_adapter_name(key: str, adapter_name: str) -> str:
    # Same rule as peft's _remove_adapter_name_from_state_dict_key.
    if "." not in key:
        return key
    if key.endswith(f".{adapter_name}"):
        return key.removesuffix(f".{adapter_name}")
    head, _, suffix = key.rpartition(".")
    head = re.sub(re.escape(f".{adapter_name}") + r"$", "", head)
    return f"{head}.{suffix}"


def adapter_key_map(
    keys: Iterable[str], adapter_config: Mapping, *, adapter_name: str | None = None
) -> dict[str, str]:
    """Map ``adapter_model.safetensors`` names to the PEFT-wrapped model's state-dict keys.

    Selects what ``peft.get_peft_model_state_dict`` selects, from key names alone: the tuner
    layers' parameters (everything of a tuner layer but its ``base_layer``), the learnable biases
    (``bias`` = ``all`` / ``*_only``), ``modules_to_save`` copies and trainable-token deltas;
    then renames them the same way (adapter name removed, DoRA's ``.weight`` suffix dropped).
    Returns {output name: source key}; one source key may feed several outputs (peft saves a
    ``modules_to_save`` bias twice under ``bias="all"``). ``adapter_name`` defaults to the only
    adapter present (or ``default``).
    """
    keys = list(keys)
    peft_type = str(adapter_config.get("peft_type", "")).upper()
    if not peft_type:
        raise ConversionError(f"{C.ADAPTER_CONFIG_NAME} has no peft_type")
    layer_names = set(_peft_layer_names(peft_type))
    containers = layer_names | {"modules_to_save"}

    found = set()
    for key in keys:
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            if part in containers:
                found.add(parts[i + 1])
        if ".token_adapter.trainable_tokens_delta." in key:
            found.add(parts[-1])
    if adapter_name is None:
        if len(found) == 1:
            adapter_name = next(iter(found))
        elif "default" in found or not found:
            adapter_name = "default"
        else:
            raise ConversionError(f"several adapters in the checkpoint: {sorted(found)}")
    unwanted = found - {adapter_name}
    keys = [
        k
        for k in keys
        if not any(f".{u}." in k or k.endswith(f".{u}") for u in unwanted)  # other adapters
    ]

    # Tuner layers: module paths P with a key P.<adapter layer>.<adapter>...
    tuner_paths = set()
    for key in keys:
        parts = key.split(".")
        for i in range(1, len(parts) - 1):
            if parts[i] in layer_names and parts[i + 1] == adapter_name:
                tuner_paths.add(".".join(parts[:i]))
    # 1. The tuner's own entries (adapter name still in the key), as the tuner class selects them.
    tuner: dict[str, str] = {}  # key as peft names it before renaming -> DCP key
    for key in keys:
        if ".modules_to_save." in key or ".token_adapter.trainable_tokens_delta." in key:
            continue  # auxiliary modules are handled below, as peft does
        if key.startswith("base_model.") and not key.startswith("base_model.model."):
            tuner[key] = key  # model-level tuner containers (e.g. VeRA's shared matrices)
            continue
        for path in tuner_paths:
            if key.startswith(f"{path}.") and not key.startswith(f"{path}.base_layer."):
                tuner[key] = key
                break
    bias = str(adapter_config.get("bias", "none") or "none")
    if bias == "all":
        tuner.update({k: k for k in keys if k == "bias" or k.endswith(".bias")})
    elif bias.endswith("_only"):
        key_set = set(keys)
        for path in sorted(tuner_paths):
            if f"{path}.base_layer.bias" in key_set:
                tuner[f"{path}.base_layer.bias"] = f"{path}.base_layer.bias"
    if peft_type == "LORA" and adapter_config.get("use_dora", False):
        dora_suffix = f"lora_magnitude_vector.{adapter_name}.weight"
        tuner = {
            (k.removesuffix(".weight") if k.endswith(dora_suffix) else k): v
            for k, v in tuner.items()
        }

    # 2. Auxiliary modules: modules_to_save copies and trainable-token deltas, module-relative.
    selected = dict(tuner)
    for key in keys:
        if ".modules_to_save." in key:
            wrapper, _, rest = key.partition(".modules_to_save.")
            name, _, param = rest.partition(".")
            if name == adapter_name and param:
                selected[f"{wrapper}.{param}"] = key
        elif key.endswith(f".token_adapter.trainable_tokens_delta.{adapter_name}"):
            selected[key.removesuffix(f".{adapter_name}")] = key

    # 3. Remove the adapter name (later entries win on a collision, like peft's dict).
    out: dict[str, str] = {}
    for name, key in selected.items():
        out[_remove_adapter_name(name, adapter_name)] = key
    if not out:
        raise ConversionError(f"no {peft_type} adapter tensors found in the DCP checkpoint")
    return out


def _read_adapter_config(pretrained: Path) -> dict:
    path = pretrained / C.ADAPTER_CONFIG_NAME
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConversionError(f"cannot read {path}: {_one_line(e)}") from e
    if not isinstance(config, dict):
        raise ConversionError(f"{path} is not a JSON object")
    return config


# --------------------------------------------------------------------------------------------
# Writing


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems refuse a folder's fsync
        fsync_path(path)


def _file_mode() -> int:
    """The mode a new regular file gets here (0o666 less the umask)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _tmp_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _remove_dead_temporaries(folder: Path, final_name: str) -> None:
    """Temporary weights files of conversions whose process is gone (killed mid-write)."""
    for tmp in folder.glob(f".{final_name}.tmp-*"):
        pid = tmp.name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)
            logger.info("Removed %s, left by an interrupted conversion", tmp.name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_tmp_name(name: str) -> bool:
    return name.startswith(".") and any(m in name for m in _TMP_MARKERS)


_DATA_MEMBER_RE = re.compile(r"^[^/]+/data/[^/]+$")
_U32, _U16 = 0xFFFFFFFF, 0xFFFF
_U32_LE = struct.Struct("<I")


class _ZipMember(NamedTuple):
    name: str
    method: int
    crc: int
    size: int
    compressed_size: int
    local_offset: int
    cd_entry: int  # offset of its central-directory entry in the zip


_EOCD = struct.Struct("<4sHHHHIIH")
_CD_ENTRY = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LOCAL_NAME_EXTRA = struct.Struct("<HH")


def _zip_members(read, length: int) -> list[_ZipMember] | None:
    """The members of a zip held in ``length`` bytes readable with ``read(offset, n)``.

    A minimal central-directory reader (zip64 included) for torch.save blobs; None when the
    bytes do not look like one (the caller then falls back to the generic path)."""
    tail = read(length - 22, 22) if length >= 22 else b""
    if tail[:4] == b"PK\x05\x06":  # no zip comment (torch.save writes none): the usual case
        tail = read(length - min(length, 42), min(length, 42))
        i = len(tail) - 22
    else:
        tail_len = min(length, _ZIP_WINDOW)
        tail = read(length - tail_len, tail_len)
        i = tail.rfind(b"PK\x05\x06")
    if i < 0 or i + 22 > len(tail):
        return None
    _, _, _, _, count, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, i)
    if count == _U16 or cd_size == _U32 or cd_offset == _U32:
        j = i - 20
        if j < 0 or tail[j : j + 4] != b"PK\x06\x07":
            return None
        _, _, eocd64, _ = struct.unpack("<4sIQI", tail[j : j + 20])
        rec = read(eocd64, 56)
        if len(rec) != 56 or rec[:4] != b"PK\x06\x06":
            return None
        count, cd_size, cd_offset = struct.unpack("<QQQ", rec[32:56])
    if cd_offset + cd_size > length:
        return None
    cd = read(cd_offset, cd_size)
    members, pos = [], 0
    for _ in range(count):
        if cd[pos : pos + 4] != b"PK\x01\x02":
            return None
        fields = _CD_ENTRY.unpack_from(cd, pos)
        method, crc, csize, usize = fields[4], fields[7], fields[8], fields[9]
        name_len, extra_len, comment_len, local = fields[10], fields[11], fields[12], fields[16]
        name = cd[pos + 46 : pos + 46 + name_len].decode("utf-8", "replace")
        extra = cd[pos + 46 + name_len : pos + 46 + name_len + extra_len]
        if _U32 in (usize, csize, local):
            k = 0
            while k + 4 <= len(extra):
                tag, size = struct.unpack("<HH", extra[k : k + 4])
                if tag == 1:
                    values = list(struct.unpack(f"<{size // 8}Q", extra[k + 4 : k + 4 + size]))
                    if usize == _U32:
                        usize = values.pop(0)
                    if csize == _U32:
                        csize = values.pop(0)
                    if local == _U32:
                        local = values.pop(0)
                    break
                k += 4 + size
        members.append(_ZipMember(name, method, crc, usize, csize, local, cd_offset + pos))
        pos += 46 + name_len + extra_len + comment_len
    return members


class _RecordBytes:
    """Reads within one record of a mapped shard file (no system call per read)."""

    def __init__(self, mm: mmap.mmap, record: _Record):
        self.mm, self.base, self.length = mm, record.offset, record.length

    def __call__(self, offset: int, n: int) -> bytes:
        if offset < 0 or offset + n > self.length:
            return b""
        start = self.base + offset
        return self.mm[start : start + n]


def _member_start(read, member: _ZipMember) -> int | None:
    header = read(member.local_offset, 30)
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        return None
    name_len, extra_len = _LOCAL_NAME_EXTRA.unpack_from(header, 26)
    return member.local_offset + 30 + name_len + extra_len


@dataclass(frozen=True)
class _Template:
    """A plain record already inspected in full, to recognise records of the same structure.

    torch.save writes identical bytes for tensors of the same dtype and shape except for the
    data and the per-record ``serialization_id`` member, and their CRC-32s (central directory,
    local header, data descriptor). A record of the same length whose other bytes (``segments``)
    all equal this template's is therefore plain with the same layout, and its small members are
    intact (they are byte-identical to the ones checked here). Only the serialization id's CRC
    is left to check.
    """

    segments: tuple[tuple[int, int, bytes], ...]  # (start, end in the record, expected bytes)
    data_start: int
    data_size: int
    data_crc_field: int  # offset of the data member's CRC in its central-directory entry
    ids: tuple[tuple[int, int, int], ...]  # (content, size, CD CRC field) offsets

    @staticmethod
    def build(read, length: int, members: list[_ZipMember], starts: dict[str, int], data):
        varying = [(starts[data.name], data.size)]
        ids = []
        for m in members:
            if m is data or m.name.endswith("/serialization_id"):
                end = starts[m.name] + m.size  # a data descriptor may follow: its CRC varies too
                descriptor_crc = end + 4 if read(end, 4) == b"PK\x07\x08" else end
                varying += [(m.local_offset + 14, 4), (m.cd_entry + 16, 4), (descriptor_crc, 4)]
            if m.name.endswith("/serialization_id"):
                varying.append((starts[m.name], m.size))
                ids.append((starts[m.name], m.size, m.cd_entry + 16))
        segments, pos = [], 0
        for start, size in [*sorted(varying), (length, 0)]:
            if start > pos:
                segments.append((pos, start, read(pos, start - pos)))
            pos = max(pos, start + size)
        return _Template(
            tuple(segments), starts[data.name], data.size, data.cd_entry + 16, tuple(ids)
        )

    def match(self, mm: mmap.mmap, offset: int) -> int | None:
        """The data CRC-32 of the record at ``offset`` of ``mm`` if it has this structure, else
        None. (Hot: runs once per record; the record's length was checked by the caller.)"""
        for start, end, expected in self.segments:
            if mm[offset + start : offset + end] != expected:
                return None
        for start, size, cd_crc in self.ids:
            crc = _U32_LE.unpack_from(mm, offset + cd_crc)[0]
            if _crc32(mm[offset + start : offset + start + size]) != crc:
                return None
        return _U32_LE.unpack_from(mm, offset + self.data_crc_field)[0]


@dataclass
class _InspectCache:
    """What ``_inspect_record`` learns once per checkpoint: ``layouts`` holds what
    ``torch.load(map_location="meta")`` says per distinct set of small members, ``templates``
    one ``_Template`` per (record length, dtype, chunk sizes)."""

    layouts: dict[bytes, tuple | None] = field(default_factory=dict)
    templates: dict[tuple, _Template] = field(default_factory=dict)


def _inspect_record(
    fd: int,
    mm: mmap.mmap,
    record: _Record,
    dtype: torch.dtype,
    cache: _InspectCache,
) -> tuple[int, int, int] | None:
    """(data offset in the file, nbytes, crc) of a plain record, or None when not plain.
    ``mm``: the whole shard file, mapped; ``fd``: the same file, open.

    Plain: a torch.save zip blob whose single storage is stored uncompressed, little-endian,
    holding exactly the chunk as a contiguous tensor at storage offset 0. The small members
    (pickle, byteorder, ...) are CRC-checked here, or found byte-identical to those of a checked
    record of the same structure (``_Template``); the data member is CRC-checked while copying.
    """
    if record.transformed:
        return None
    template_key = (record.length, dtype, record.chunk_sizes)
    template = cache.templates.get(template_key)
    if template is not None and record.offset + record.length <= len(mm):
        crc = template.match(mm, record.offset)
        if crc is not None:
            return record.offset + template.data_start, template.data_size, crc
    read = _RecordBytes(mm, record)
    members = _zip_members(read, record.length)
    if not members:
        return None
    data = [m for m in members if _DATA_MEMBER_RE.match(m.name)]
    if len(data) != 1:
        return None
    info = data[0]
    key_parts = [str(info.size).encode()]
    starts = {}
    for m in members:
        if m.method != 0 or m.size != m.compressed_size:  # torch.save stores, never deflates
            return None
        start = _member_start(read, m)
        if start is None or start + m.size > record.length:
            return None
        starts[m.name] = start
        if m is info:
            continue
        content = read(start, m.size)
        if _crc32(content) != m.crc:
            return None  # corrupt: the generic path reports it with the file name
        if m.name.endswith("/byteorder") and content != b"little":
            return None
        if not m.name.endswith("/serialization_id"):  # unique per record
            key_parts.append(m.name.encode() + b"\0" + content)
    if len(starts) != len(members):
        return None
    key = b"\0\0".join(key_parts)
    if key not in cache.layouts:
        tensor = torch.load(
            _FileSlice(fd, record.offset, record.length, window=_ZIP_WINDOW),
            map_location="meta",
            weights_only=True,
        )
        cache.layouts[key] = (
            (
                tensor.dtype,
                tuple(tensor.shape),
                tensor.is_contiguous(),
                tensor.storage_offset(),
                tensor.untyped_storage().nbytes(),
                tensor.numel() * tensor.element_size(),
            )
            if isinstance(tensor, torch.Tensor)
            else None
        )
    if cache.layouts[key] != (dtype, record.chunk_sizes, True, 0, info.size, info.size):
        return None
    cache.templates[template_key] = _Template.build(read, record.length, members, starts, info)
    return record.offset + starts[info.name], info.size, info.crc


def _rows_tile(size: torch.Size, chunks: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> bool:
    """The chunks are full-width row blocks that tile the tensor exactly once."""
    if len(size) == 0:
        return len(chunks) == 1
    row = 0
    for offsets, sizes in sorted(chunks):
        if offsets[0] != row or any(offsets[1:]) or tuple(sizes[1:]) != tuple(size[1:]):
            return False
        row += sizes[0]
    return row == size[0]


@dataclass(frozen=True)
class _DirectLayout:
    """What the metadata alone fixes for a direct byte copy: the safetensors header, the output
    size, and for each stored record (file order) where its rows go in the output."""

    header: bytes
    total: int
    records: list[tuple[_Record, torch.dtype, tuple[int, ...]]]  # (record, dtype, dst offsets)


class _NotPlain(Exception):
    """A record the direct copy cannot handle: the caller falls back to the generic path."""


def _direct_layout(metadata, key_map: dict[str, str]) -> _DirectLayout | None:
    """The direct-copy layout, or None (generic path) when the metadata already rules it out
    (dtype, byte order, chunks that are not full-width row blocks). ``key_map``: output name ->
    DCP key. The records themselves are inspected while copying (``_write_direct``)."""
    entries = _tensor_entries(metadata, set(key_map.values()))
    records = _records(metadata, entries)
    if sys.byteorder != "little" or any(d not in _SAFETENSORS_DTYPES for d, _ in entries.values()):
        return None
    by_fqn: dict[str, list[_Record]] = {}
    for r in records:
        by_fqn.setdefault(r.fqn, []).append(r)
    for fqn, (_, size) in entries.items():
        chunks = [(r.chunk_offsets, r.chunk_sizes) for r in by_fqn.get(fqn, [])]
        if size.numel() and not _rows_tile(size, chunks):
            return None

    # Header in safetensors' own order: larger element size first, then by name.
    order = sorted(key_map, key=lambda name: (-entries[key_map[name]][0].itemsize, name))
    header: dict[str, object] = {"__metadata__": SAFETENSORS_METADATA}
    starts: dict[str, list[int]] = {}  # DCP key -> data offsets of its output tensors
    pos = 0
    for name in order:
        dtype, size = entries[key_map[name]]
        nbytes = size.numel() * dtype.itemsize
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[dtype],
            "shape": list(size),
            "data_offsets": [pos, pos + nbytes],
        }
        starts.setdefault(key_map[name], []).append(pos)
        pos += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    base = 8 + len(blob)

    placed = []
    for r in records:
        dtype, size = entries[r.fqn]
        if size.numel() == 0:
            continue
        row_bytes = dtype.itemsize * (size[1:].numel() if len(size) else 1)
        first_row = r.chunk_offsets[0] if len(size) else 0
        dsts = tuple(base + start + first_row * row_bytes for start in starts[r.fqn])
        placed.append((r, dtype, dsts))
    return _DirectLayout(struct.pack("<Q", len(blob)) + blob, base + pos, placed)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        with data[done:] as rest:
            done += os.pwrite(fd, rest, offset + done)


def _write_direct(dcp_dir: Path, layout: _DirectLayout, out_fd: int, *, durable: bool) -> None:
    """Copy each record's raw bytes into its place in the output and check their CRC-32.

    Per shard file: map it read-only, inspect all its records (Python: zip members,
    small-member CRCs, dtype/shape), then copy their data into place from this thread while one
    checker thread verifies the data CRCs (``os.pwrite`` and the CRC release the GIL). Measured
    on 2 cores: the writes are steadiest from the main thread, and running the inspection
    concurrently with them costs more in GIL hand-offs than it saves. Peak memory: one mapped
    shard file.

    Raises ``_NotPlain`` on the first record it cannot copy directly (the caller then uses the
    generic path). ``durable``: start each range's writeback as soon as it is written, so that
    the final fsync has little left to wait for.
    """
    _check_shard_files(dcp_dir, [r for r, _, _ in layout.records])
    if hasattr(os, "posix_fallocate"):  # ENOSPC now rather than half-way through
        try:
            os.posix_fallocate(out_fd, 0, layout.total)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
    os.ftruncate(out_fd, layout.total)
    _pwrite_all(out_fd, memoryview(layout.header), 0)
    by_file: dict[str, list[tuple[_Record, torch.dtype, tuple[int, ...]]]] = {}
    for item in layout.records:
        by_file.setdefault(item[0].relative_path, []).append(item)
    cache = _InspectCache()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="convert-crc") as checker:
        for rel, items in by_file.items():
            path = dcp_dir / rel
            with open(path, "rb") as f, _map_readonly(f.fileno()) as mm:
                copies = []
                for r, dtype, dsts in items:
                    try:
                        found = _inspect_record(f.fileno(), mm, r, dtype, cache)
                    except Exception as e:  # corrupt or unusual: the generic path decides
                        raise _NotPlain(f"{r.fqn}: {_one_line(e)}") from e
                    if found is None:
                        raise _NotPlain(f"{r.fqn}: unusual record layout")
                    copies.append((r, *found, dsts))
                checked = checker.submit(_check_batch, mm, copies, path)
                try:
                    _copy_batch(mm, copies, out_fd, durable)
                finally:
                    wait([checked])  # the mapping must outlive the checker's views
                checked.result()


def _copy_batch(mm: mmap.mmap, copies: list, out_fd: int, writeback: bool) -> None:
    """Write each record's data to its output offsets."""
    with memoryview(mm) as view:
        for _, src, nbytes, _, dsts in copies:
            with view[src : src + nbytes] as part:
                for dst in dsts:
                    _pwrite_all(out_fd, part, dst)
                    if writeback:
                        _start_writeback(out_fd, dst, nbytes)


def _check_batch(mm: mmap.mmap, copies: list, path: Path) -> None:
    with memoryview(mm) as view:
        for r, src, nbytes, crc, _ in copies:
            with view[src : src + nbytes] as part:
                if _crc32(part) & 0xFFFFFFFF != crc:
                    raise ConversionError(
                        f"DCP shard file {path} is corrupt: CRC mismatch in the data of {r.fqn}"
                    )


def _map_readonly(fd: int) -> mmap.mmap:
    """Map a whole shard file read-only, pre-faulted when the OS can (one syscall, no faults)."""
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)


@functools.cache
def _sync_file_range():
    """libc's sync_file_range (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing a just-written range to disk now (SYNC_FILE_RANGE_WRITE, asynchronous), so
    the final fsync has little left to wait for. A no-op where unavailable; fsync still runs."""
    fn = _sync_file_range()
    if fn is not None and nbytes > 0:
        fn(fd, offset, nbytes, 2)


def _write_generic(dcp_dir: Path, key_map: dict[str, str], out: Path) -> None:
    from safetensors.torch import save_file

    state = _load_mapped(dcp_dir, key_map)
    seen: set[int] = set()
    for name, tensor in state.items():  # save_file refuses tensors that share memory
        if id(tensor) in seen:
            state[name] = tensor.clone()
        seen.add(id(tensor))
    save_file(state, str(out), metadata=SAFETENSORS_METADATA)


def _write_weights(
    dcp_dir: Path, metadata, key_map: dict[str, str], final: Path, *, verify: bool, durable: bool
) -> Path:
    """Write the converted weights to ``final`` atomically; verify the temp file first if asked;
    ``durable``: fsync the file before the rename and the folder after it."""
    tmp = _tmp_path(final)
    try:
        layout = _direct_layout(metadata, key_map)
        if layout is not None:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _write_direct(dcp_dir, layout, fd, durable=durable)
            except _NotPlain as e:
                os.close(fd)
                tmp.unlink()
                logger.debug("direct copy not possible: %s", e)
                layout = None
            except BaseException:
                os.close(fd)
                raise
        if layout is None:
            logger.info("Using the generic DCP loader (unusual shard layout)")
            _write_generic(dcp_dir, key_map, tmp)
            fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fchmod(fd, _file_mode())  # save_file would leave 0600
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if verify:
            verify_against_dcp(tmp, _load_mapped(dcp_dir, key_map))
            logger.info("Verified %s against the DCP shards (%d tensors)", final.name, len(key_map))
        fault_point("convert:before_replace")
        os.replace(tmp, final)
        if durable:
            _fsync_dir(final.parent)
        fault_point("convert:after_replace")
    except ConversionError:
        tmp.unlink(missing_ok=True)
        raise
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ConversionError(f"cannot write {final}: {_one_line(e)}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def _load_mapped(dcp_dir: Path, key_map: dict[str, str]) -> dict[str, torch.Tensor]:
    """{output name: tensor} loaded by torch's own DCP reader (``key_map``: name -> DCP key)."""
    state = load_dcp_state_dict(dcp_dir, keys=set(key_map.values()))
    return {name: state[key] for name, key in key_map.items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def verify_against_dcp(weights_file: str | os.PathLike[str], dcp_state: Mapping) -> None:
    """Read ``weights_file`` back and compare it with ``dcp_state`` (output names -> tensors).

    Same key set, and per tensor the same dtype, shape and bytes (bitwise, so NaNs compare equal to
    themselves and -0.0 differs from 0.0). Raises ConversionError on the first problems found.
    """
    from safetensors import safe_open

    weights_file = Path(weights_file)
    problems: list[str] = []
    try:
        with safe_open(str(weights_file), framework="pt", device="cpu") as f:
            keys = set(f.keys())
            missing = sorted(set(dcp_state) - keys)
            extra = sorted(keys - set(dcp_state))
            if missing:
                problems.append(f"missing {len(missing)} tensors (e.g. {missing[:3]})")
            if extra:
                problems.append(f"{len(extra)} unexpected tensors (e.g. {extra[:3]})")
            for key in sorted(keys & set(dcp_state)):
                got, want = f.get_tensor(key), dcp_state[key]
                if got.dtype != want.dtype:
                    problems.append(f"{key}: dtype {got.dtype} != {want.dtype}")
                elif got.shape != want.shape:
                    problems.append(f"{key}: shape {tuple(got.shape)} != {tuple(want.shape)}")
                elif not torch.equal(_bits(got), _bits(want)):
                    problems.append(f"{key}: values differ")
                if len(problems) >= 5:
                    break
    except ConversionError:
        raise
    except Exception as e:
        raise ConversionError(f"cannot read back {weights_file}: {_one_line(e)}") from e
    if problems:
        raise ConversionError(
            f"{weights_file} does not match the DCP shards: " + "; ".join(problems)
        )


# --------------------------------------------------------------------------------------------
# Folder handling


def _same_file(a: Path, b: Path) -> bool:
    import filecmp

    try:
        return b.is_file() and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _copy_file(src: Path, dst: Path, durable: bool) -> bool:
    """Copy atomically unless ``dst`` already has the same bytes. Returns True when copied."""
    if _same_file(src, dst):
        if durable:
            fsync_path(dst)  # it may have been copied by a run that did not fsync
        return False
    tmp = _tmp_path(dst)
    try:
        shutil.copy2(src, tmp)
        if durable:
            fsync_path(tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True


def _copy_tree(src: Path, dst: Path, skip: frozenset[str], durable: bool) -> list[str]:
    copied = []
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        if entry.name in skip or _is_tmp_name(entry.name):
            continue
        target = dst / entry.name
        if entry.is_dir():
            with contextlib.suppress(ValueError, OSError):
                if dst.resolve().is_relative_to(entry.resolve()):
                    continue  # the output folder lives inside the source folder
            sub = _copy_tree(entry, target, frozenset(), durable)
            copied += [f"{entry.name}/{n}" for n in sub]
        elif entry.is_file() and _copy_file(entry, target, durable):
            copied.append(entry.name)
    if durable:
        _fsync_dir(dst)
    return copied


def _prepare_output(pretrained: Path, output_dir: str | os.PathLike[str] | None) -> Path:
    if output_dir is None:
        return pretrained
    out = Path(output_dir).expanduser()
    if _URL_RE.match(os.fspath(output_dir)):
        raise ConversionError(f"output_dir must be a local folder, not {os.fspath(output_dir)}")
    try:
        if out.exists() and out.resolve() == pretrained.resolve():
            return pretrained
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConversionError(f"output_dir {out} is not writable: {_one_line(e)}") from e
    return out


def _delete_dcp(dcp_dir: Path) -> None:
    """Remove the DCP folder: rename it away first (atomic), then delete the renamed folder."""
    doomed = dcp_dir.with_name(f".{dcp_dir.name}.deleting-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(dcp_dir, doomed)
        _fsync_dir(dcp_dir.parent)
        fault_point("convert:during_delete")
        shutil.rmtree(doomed)
    except OSError as e:
        raise ConversionError(f"cannot delete {dcp_dir}: {_one_line(e)}") from e
    logger.info("Deleted the DCP shards %s", dcp_dir)


# --------------------------------------------------------------------------------------------
# Entry point


def convert_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    *,
    output_dir: str | os.PathLike[str] | None = None,
    delete_dcp: bool = False,
) -> Path:
    """Merge a step's model DCP into ``model.safetensors`` (``adapter_model.safetensors`` for PEFT).

    ``checkpoint_dir``: a LOCAL step folder or its ``pretrained_model/`` (DCP metadata is a
    pickle: never point this at downloaded files). Without ``output_dir`` the weights are written
    into that ``pretrained_model/``; with it, ``output_dir`` becomes a complete pretrained-model
    folder (every file but the DCP folder copied, plus the weights; a step saved without DCP has
    its weights file copied). ``delete_dcp`` removes the DCP folder only after the written file was
    read back and found identical to the shards. Idempotent. Returns the weights file.
    """
    t0 = time.perf_counter()
    pretrained = find_pretrained_dir(checkpoint_dir)
    is_peft = (pretrained / C.ADAPTER_CONFIG_NAME).is_file()
    weights_name = C.ADAPTER_SAFETENSORS if is_peft else C.MODEL_SAFETENSORS
    dcp_dir = pretrained / C.MODEL_DCP_DIR
    has_dcp = dcp_dir.exists()
    if (pretrained / weights_name).is_file():
        # A deletion that was killed half-way: it only ever starts after the weights file was
        # verified and in place, so what is left of the renamed shard folder can go.
        for stale in pretrained.glob(f".{C.MODEL_DCP_DIR}.deleting-*"):
            shutil.rmtree(stale, ignore_errors=True)
            logger.info("Removed %s, left by an interrupted --delete_dcp", stale.name)
    if not has_dcp and not (pretrained / weights_name).is_file():
        raise ConversionError(
            f"nothing to convert: {pretrained} has neither {C.MODEL_DCP_DIR}/ nor {weights_name}"
        )
    out_dir = _prepare_output(pretrained, output_dir)
    final = out_dir / weights_name
    _remove_dead_temporaries(out_dir, weights_name)

    if out_dir != pretrained:
        try:
            skip = _NOT_COPIED | {weights_name} if has_dcp else _NOT_COPIED
            copied = _copy_tree(pretrained, out_dir, frozenset(skip), durable=delete_dcp)
        except OSError as e:
            raise ConversionError(f"output_dir {out_dir} is not writable: {_one_line(e)}") from e
        if copied:
            logger.info("Copied %d files into %s: %s", len(copied), out_dir, ", ".join(copied))

    if not has_dcp:
        source = pretrained / weights_name
        if delete_dcp:
            logger.info("No DCP folder in %s: nothing to delete", pretrained)
        logger.info("No DCP folder in %s: %s is already there", pretrained, weights_name)
        return final if out_dir != pretrained else source

    metadata = read_dcp_metadata(dcp_dir)
    if is_peft:
        key_map = adapter_key_map(metadata.state_dict_metadata, _read_adapter_config(pretrained))
    else:
        key_map = {k: k for k in _tensor_entries(metadata)}
    entries = _tensor_entries(metadata, set(key_map.values()))
    nbytes = sum(entries[k][0].itemsize * entries[k][1].numel() for k in key_map.values())
    logger.info("Loading DCP from %s (%d tensors, %.1f MB)", dcp_dir, len(key_map), nbytes / 1e6)

    if final.exists():
        reference = _load_mapped(dcp_dir, key_map)  # an unreadable DCP fails here: nothing changes
        try:
            verify_against_dcp(final, reference)
        except ConversionError as e:
            logger.warning("Existing %s is not the converted DCP (%s); rewriting it", final, e)
        else:
            logger.info("Already converted: %s matches %s", final, dcp_dir)
            if delete_dcp:
                # An earlier run without --delete_dcp did not fsync: make it durable first.
                fsync_path(final)
                _fsync_dir(final.parent)
                _delete_dcp(dcp_dir)
            return final
        del reference
    _write_weights(dcp_dir, metadata, key_map, final, verify=delete_dcp, durable=delete_dcp)
    logger.info(
        "Wrote %s (%.1f MB) in %.2f s", final, final.stat().st_size / 1e6, time.perf_counter() - t0
    )
    if delete_dcp:
        _delete_dcp(dcp_dir)  # _write_weights verified the file against the shards (or raised)
    return final
