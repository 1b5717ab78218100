"""The file manifest of a checkpoint (size and SHA-256 of every file), computed where the bytes
are and verified in shares. Torch-free but for :func:`verify_split`'s collective.

Saving: each rank hashes the files it wrote itself, right after writing them (their pages are
still cached, so the hash costs memory bandwidth, not a second disk read): DCP shards through
:class:`~lerobot_pipe.checkpoint.writer.HashingFileSystemWriter`, the main rank its single files.
The main rank merges the parts into the manifest of training_step.json (:func:`ordered`).

Resuming: before a process group exists only the listed files' sizes are checked
(:func:`verify_files` with ``hashes=False``: no file is read); once it exists,
:func:`verify_split` splits the manifest into one share per rank, balanced by bytes, so that
every byte is hashed once in total, each rank reading at most ``total / world + largest file``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from lerobot_pipe import constants as C
from lerobot_pipe.checkpoint.layout import CheckpointError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

_BLOCK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def file_entry(path: Path) -> dict:
    """``{"size", "sha256"}`` of one file, as training_step.json lists it."""
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def file_manifest(step_dir: Path) -> dict[str, dict]:
    """{relative path: {"size", "sha256"}} of every file in a checkpoint folder, hashed here in one
    process (a save assembles the same manifest from what each rank hashed)."""
    return {
        path.relative_to(step_dir).as_posix(): file_entry(path)
        for path in sorted(step_dir.rglob("*"))
        if path.is_file() and path.name != C.TRAINING_STEP
    }


def ordered(entries: Mapping[str, dict]) -> dict[str, dict]:
    """Manifest entries in their canonical order: by path component, as ``sorted(rglob)`` lists a
    folder (a file before a folder whose name it prefixes), whoever hashed them."""
    return {rel: entries[rel] for rel in sorted(entries, key=lambda r: PurePosixPath(r).parts)}


def shares(files: Mapping[str, dict], world_size: int) -> list[list[str]]:
    """Split the manifest's files into ``world_size`` disjoint shares balanced by size: largest
    first, each to the share with the fewest bytes so far (so no share exceeds
    ``total / world_size`` + the largest file). The same on every rank for the same manifest."""
    loads = [0] * world_size
    out: list[list[str]] = [[] for _ in range(world_size)]
    for rel in sorted(files, key=lambda r: (-int(files[r]["size"]), r)):
        lightest = min(range(world_size), key=lambda i: (loads[i], i))
        out[lightest].append(rel)
        loads[lightest] += int(files[rel]["size"])
    return out


def _file_problem(step_dir: Path, rel: str, expected: dict, converted: bool, hashes: bool):
    """What is wrong with one listed file (None: nothing). Model DCP shards may be gone once
    lerobot-convert-dcp verified them into model.safetensors."""
    path = step_dir / rel
    if not path.is_file():
        if converted and rel.startswith(f"{C.PRETRAINED_MODEL_DIR}/{C.MODEL_DCP_DIR}/"):
            return None
        return f"checkpoint file missing: {path}"
    size = path.stat().st_size
    if size != expected["size"]:
        expected_size = expected["size"]
        return (
            f"corrupt checkpoint file {path}: {size} bytes, expected {expected_size} (truncated?)"
        )
    if hashes and sha256_file(path) != expected["sha256"]:
        return f"corrupt checkpoint file {path}: SHA-256 does not match {C.TRAINING_STEP}"
    return None


def verify_files(
    step_dir: Path, info: dict, *, hashes: bool = True, share: Collection[str] | None = None
) -> None:
    """Check the files listed in training_step.json (only those in ``share`` when given) against
    their size and, with ``hashes``, their SHA-256."""
    pretrained = step_dir / C.PRETRAINED_MODEL_DIR
    converted = any(
        (pretrained / n).is_file() for n in (C.MODEL_SAFETENSORS, C.ADAPTER_SAFETENSORS)
    )
    for rel, expected in (info.get("files") or {}).items():
        if share is not None and rel not in share:
            continue
        problem = _file_problem(step_dir, rel, expected, converted, hashes)
        if problem:
            raise CheckpointError(problem)


def verify_split(step_dir: Path, info: dict, group: ProcessGroup | None = None) -> None:
    """Collective: check the SHA-256 of every file training_step.json lists, each rank a disjoint
    share. Every rank then raises the same CheckpointError if any share failed, before anything
    is loaded. Without a process group this process checks everything."""
    import torch.distributed as dist

    files = info.get("files") or {}
    if not dist.is_initialized():
        verify_files(step_dir, info)
        return
    world = dist.get_world_size(group)
    mine = set(shares(files, world)[dist.get_rank(group)])
    try:
        verify_files(step_dir, info, share=mine)
        problem = None
    except CheckpointError as e:
        problem = str(e)
    problems: list[str | None] = [None] * world
    dist.all_gather_object(problems, problem, group=group)
    first = next((p for p in problems if p), None)
    if first is not None:
        raise CheckpointError(first)
