"""The file manifest of a checkpoint (size and SHA-256 of every file), computed where the bytes
are and verified in shares.

Saving: each rank hashes the files it wrote itself, right after writing them (their pages are
still cached, so the hash costs memory bandwidth, not a second disk read): DCP shards through
:class:`HashingFileSystemWriter`, the main rank its single files. The main rank merges the
parts into the manifest of training_step.json (:func:`ordered`).

Resuming: :func:`shares` splits the manifest into one share per rank, balanced by bytes, so
that verifying it costs each rank at most ``total / world + largest file`` of reads instead of
every rank reading everything.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

from torch.distributed.checkpoint import FileSystemWriter, Metadata
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

_BLOCK = 1 << 20
# DCP's own name of the global metadata file of a DCP folder.
DCP_METADATA_FILE = ".metadata"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def file_entry(path: Path) -> dict:
    """``{"size", "sha256"}`` of one file, as training_step.json lists it."""
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


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


class HashingFileSystemWriter(FileSystemWriter):
    """DCP's file-system writer (same files, same bytes, fsynced) that also records the size and
    SHA-256 of each file this rank writes, read back right after DCP wrote it.

    ``files`` maps each file's path relative to ``root`` (the checkpoint's step folder) to its
    entry; the coordinator's entry for the DCP ``.metadata`` is added in :meth:`finish`. The
    metadata's save id is derived from the folder path instead of a random UUID, so the same
    state saved twice (synchronously or in the background) gives the same bytes.
    """

    def __init__(self, path: Path, root: Path) -> None:
        super().__init__(path)
        self._folder = Path(path)
        self._root = Path(root)
        self.files: dict[str, dict] = {}

    def storage_meta(self) -> StorageMeta:
        save_id = str(uuid.uuid5(uuid.NAMESPACE_URL, self._folder.as_posix()))
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=save_id)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        written = super().write_data(plan, planner)
        self._record(r.storage_data.relative_path for r in written.wait())
        return written

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)
        self._record([DCP_METADATA_FILE])

    def _record(self, names: Iterable[str]) -> None:
        for name in sorted(set(names)):
            path = self._folder / name
            self.files[path.relative_to(self._root).as_posix()] = file_entry(path)
