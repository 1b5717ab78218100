"""Reading a model DCP checkpoint on one CPU process: its files checked against the checkpoint's
manifest first, then ``.metadata`` and the tensors (``dcp.load(no_dist=True)``, every failure
naming the file); see :mod:`lerobot_pipe.convert.dcp_to_safetensors` for why these APIs."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.filesystem import FileSystem

from lerobot_pipe import constants as C
from lerobot_pipe.checkpoint.layout import CheckpointError, is_complete, read_training_step
from lerobot_pipe.checkpoint.manifest import verify_files
from lerobot_pipe.convert.errors import ConversionError, innermost, one_line
from lerobot_pipe.utils.locate import checkpoint_step_dir

logger = logging.getLogger(__name__)


def _damaged_file(path: Path, expected_size: int) -> str:
    """What is wrong with ``path``, a DCP file that failed the manifest check."""
    is_metadata = path.name == C.DCP_METADATA_FILE
    what = f"DCP {'metadata' if is_metadata else 'shard'} file {path}"
    if not path.is_file():
        return f"{what} is missing"
    size = path.stat().st_size
    if size != expected_size:
        state = "truncated" if size < expected_size and not is_metadata else "corrupt"
        return f"{what} is {state} ({size} bytes, {C.TRAINING_STEP} lists {expected_size})"
    return f"{what} is corrupt: its SHA-256 does not match {C.TRAINING_STEP}"


def verify_dcp_files(dcp_dir: str | os.PathLike[str]) -> bool:
    """Check every file of a model DCP folder against the size and SHA-256 that its checkpoint's
    ``training_state/training_step.json`` lists. Returns False (and warns) when there is no such
    list; raises ConversionError naming the first damaged or missing file."""
    dcp_dir = Path(dcp_dir)
    step_dir = checkpoint_step_dir(dcp_dir.parent)
    listed: dict[str, dict] = {}
    if step_dir is not None and is_complete(step_dir):
        try:
            info = read_training_step(step_dir)
        except CheckpointError as e:
            raise ConversionError(f"{e}; it lists the SHA-256 of every DCP shard") from None
        files = info.get("files")
        prefix = dcp_dir.relative_to(step_dir).as_posix() + "/"
        if isinstance(files, dict):
            listed = {rel: v for rel, v in files.items() if rel.startswith(prefix)}
    if not listed:
        logger.warning(
            "No file manifest lists %s (%s of its step folder): a missing or truncated shard is "
            "still found, a flipped bit in tensor data is not",
            dcp_dir,
            f"{C.TRAINING_STATE_DIR}/{C.TRAINING_STEP}",
        )
        return False
    size = sum(int(v.get("size", 0)) for v in listed.values())
    logger.info(
        "Checking %d DCP files (%.1f MB) against %s", len(listed), size / 1e6, C.TRAINING_STEP
    )
    for rel, expected in sorted(listed.items()):
        path = step_dir / rel
        try:
            verify_files(step_dir, {"files": {rel: expected}})
        except CheckpointError:
            intact = False
        else:
            intact = path.is_file()  # verify_files passes a shard gone after conversion
        if not intact:
            raise ConversionError(
                f"{_damaged_file(path, expected['size'])}; nothing was written or deleted"
            )
    return True


def read_dcp_metadata(dcp_dir: str | os.PathLike[str]) -> Metadata:
    """Read (unpickle) the ``.metadata`` of a local DCP folder. Local folders only."""
    dcp_dir = Path(dcp_dir)
    meta_file = dcp_dir / C.DCP_METADATA_FILE
    if not dcp_dir.is_dir():
        raise ConversionError(f"DCP folder {dcp_dir} does not exist")
    if not meta_file.is_file():
        raise ConversionError(f"DCP metadata file {meta_file} is missing")
    try:
        metadata = dcp.FileSystemReader(str(dcp_dir)).read_metadata()
    except Exception as e:
        raise ConversionError(f"DCP metadata file {meta_file} is corrupt: {one_line(e)}") from e
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise ConversionError(f"DCP metadata file {meta_file} is corrupt: not a DCP Metadata")
    return metadata


def tensor_entries(metadata: Metadata, fqns: Iterable[str] | None = None) -> dict[str, tuple]:
    """fqn -> (dtype, size) for the tensor entries of the checkpoint (all, or ``fqns``)."""
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


class _FileNamingFileSystem(FileSystem):
    """torch's local file system for DCP, naming the file when reading it fails: torch.load's
    errors about a truncated or damaged record ("failed finding central directory") do not."""

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator:
        try:
            with super().create_stream(path, mode) as stream:
                yield stream
        except FileNotFoundError:
            raise ConversionError(f"DCP shard file {path} is missing") from None
        except Exception as e:
            raise ConversionError(
                f"DCP shard file {path} is truncated or corrupt: {one_line(e)}"
            ) from e


def load_tensors(
    dcp_dir: Path, metadata: Metadata, keys: Iterable[str] | None
) -> dict[str, torch.Tensor]:
    """The tensors ``keys`` (all when None) of a DCP folder, read by torch's own DCP reader."""
    entries = tensor_entries(metadata, keys)
    state = {k: torch.empty(size, dtype=dtype) for k, (dtype, size) in entries.items()}
    reader = dcp.FileSystemReader(str(dcp_dir))
    reader.fs = _FileNamingFileSystem()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
            dcp.load(
                state,
                storage_reader=reader,
                planner=dcp.DefaultLoadPlanner(allow_partial_load=True),
                no_dist=True,
            )
    except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
        inner = innermost(e)  # DCP wraps whatever the read raised, Ctrl-C included
        if isinstance(inner, ConversionError) or not isinstance(inner, Exception):
            raise inner from None
        raise ConversionError(f"cannot read DCP shards in {dcp_dir}: {one_line(e)}") from e
    return state


def load_dcp_state_dict(
    dcp_dir: str | os.PathLike[str], *, keys: Iterable[str] | None = None
) -> dict[str, torch.Tensor]:
    """Load a local model DCP folder into plain CPU tensors, offline (no process group).

    The folder's files are first checked against the checkpoint's manifest (see
    :func:`verify_dcp_files`); the tensors are allocated from the checkpoint's metadata and filled
    by the public ``torch.distributed.checkpoint.load`` (``no_dist=True``). ``keys`` restricts the
    load to those entries. Local folders only: the metadata is a pickle.
    """
    dcp_dir = Path(dcp_dir)
    verify_dcp_files(dcp_dir)
    return load_tensors(dcp_dir, read_dcp_metadata(dcp_dir), keys)
