"""Reading a written safetensors file back and comparing it, tensor by tensor and bit by bit,
with the DCP state it was written from (before the shards are deleted)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open

from lerobot_pipe.convert.errors import ConversionError, one_line

# Bytes of the written file compared through one safe_open handle: the pages a handle maps stay
# in this process's RSS until it closes, so the file is opened anew every so many bytes.
_READBACK_BYTES = 4 << 20


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _readback_batches(names: list[str], state: Mapping[str, torch.Tensor]) -> Iterator[list[str]]:
    """``names`` in runs of about ``_READBACK_BYTES``, one safe_open handle each."""
    batch: list[str] = []
    nbytes = 0
    for name in names:
        batch.append(name)
        nbytes += state[name].nbytes
        if nbytes >= _READBACK_BYTES:
            yield batch
            batch, nbytes = [], 0
    if batch:
        yield batch


def _difference(key: str, got: torch.Tensor, want: torch.Tensor) -> str | None:
    if got.dtype != want.dtype:
        return f"{key}: dtype {got.dtype} != {want.dtype}"
    if got.shape != want.shape:
        return f"{key}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if not torch.equal(_bits(got), _bits(want)):
        return f"{key}: values differ"
    return None


def verify_against_dcp(weights_file: str | os.PathLike[str], dcp_state: Mapping) -> None:
    """Read ``weights_file`` back and compare it with ``dcp_state`` (output names -> tensors).

    Same key set, and per tensor the same dtype, shape and bytes (bitwise, so NaNs compare equal to
    themselves and -0.0 differs from 0.0). Raises ConversionError on the first problems found.
    """
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
        for batch in _readback_batches(sorted(keys & set(dcp_state)), dcp_state):
            with safe_open(str(weights_file), framework="pt", device="cpu") as f:
                for key in batch:
                    problem = _difference(key, f.get_tensor(key), dcp_state[key])
                    if problem:
                        problems.append(problem)
                    if len(problems) >= 5:
                        break
            if len(problems) >= 5:
                break
    except Exception as e:
        raise ConversionError(f"cannot read back {weights_file}: {one_line(e)}") from e
    if problems:
        raise ConversionError(
            f"{weights_file} does not match the DCP shards: " + "; ".join(problems)
        )
