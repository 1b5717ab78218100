"""Resume verification split across ranks: each rank hashes a disjoint share of a real 2-rank
FSDP2 checkpoint and reads no more than its share (bytes read measured by the kernel, in
/proc/self/io), and a damaged file found by one rank fails every rank with the same message."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from launch import run_distributed
from tiny import train_fsdp2_dcp

from lerobot_pipe.checkpoint.layout import CheckpointError, read_training_step
from lerobot_pipe.checkpoint.manifest import shares


@pytest.fixture(scope="module")
def step_dir(dataset_root, tmp_path_factory):
    out = train_fsdp2_dcp(dataset_root, tmp_path_factory.mktemp("verify") / "out")
    return out / "checkpoints/000002"


def _bytes_read() -> int:
    """Bytes this process passed through read(2)/pread(2) so far (page-cache hits included)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _verify_on_every_rank(good: str, damaged: str) -> dict:
    from lerobot_pipe.checkpoint.manifest import verify_split as verify_checkpoint_split
    from lerobot_pipe.distributed.runtime import destroy, init_distributed

    init_distributed()
    try:
        info = read_training_step(Path(good))
        verify_checkpoint_split(Path(good), info)  # imports and the first collective
        before = _bytes_read()
        verify_checkpoint_split(Path(good), info)
        read = _bytes_read() - before
        try:
            verify_checkpoint_split(Path(damaged), read_training_step(Path(damaged)))
            verdict = None
        except CheckpointError as e:
            verdict = str(e)
        return {"read": read, "verdict": verdict}
    finally:
        destroy()


def test_each_rank_reads_its_share_and_all_agree_on_damage(step_dir, tmp_path):
    files = read_training_step(step_dir)["files"]
    total = sum(v["size"] for v in files.values())
    largest = max(v["size"] for v in files.values())
    # Damage the biggest file of rank 1's share: rank 0 never reads it, yet must refuse too.
    victim = max(shares(files, 2)[1], key=lambda rel: files[rel]["size"])
    damaged = tmp_path / step_dir.name
    shutil.copytree(step_dir, damaged)
    data = bytearray((damaged / victim).read_bytes())
    data[len(data) // 2] ^= 0x01
    (damaged / victim).write_bytes(bytes(data))

    results = run_distributed(_verify_on_every_rank, 2, str(step_dir), str(damaged))
    collective_slack = 64 * 1024  # the verdict's all_gather over sockets
    for rank, r in enumerate(results):
        assert r["read"] <= total / 2 + largest + collective_slack, (rank, r["read"], total)
    assert sum(r["read"] for r in results) <= total + 2 * collective_slack
    assert sum(r["read"] for r in results) >= total  # every byte was read by someone
    assert results[0]["verdict"] == results[1]["verdict"]
    assert victim in results[0]["verdict"] and "SHA-256 does not match" in results[0]["verdict"]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_shares_are_disjoint_whole_and_bounded(world):
    sizes = [5, 1 << 20, 3, 700_000, 700_001, 12, 4096, 1 << 19, 9, 300_000, 2_000_000]
    files = {f"f{i}": {"size": s, "sha256": ""} for i, s in enumerate(sizes)}
    split = shares(files, world)
    assert sorted(rel for share in split for rel in share) == sorted(files)
    bound = sum(sizes) / world + max(sizes)
    assert all(sum(files[rel]["size"] for rel in share) <= bound for share in split)
    assert split == shares(dict(reversed(list(files.items()))), world)  # same on every rank
