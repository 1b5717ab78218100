"""What a streamed epoch costs in bytes, counted by the test Hub (the body bytes of every answer
it sent, tests/hub_server.py), against the bytes of the data and video files: each rank reads
its own episodes' bytes, also when an episode is smaller than one request or a decoder's read
buffer (issue #42: 96x96 frames, 1.29 of the files on 2 ranks; 1.69 here before the fix).
LeRobot's layout (one data file, one mp4 with every episode), camera-like bytes (pixel noise),
one epoch read as training reads it (BatchPrefetcher over StreamSampler, batch 4, no loader
workers); two ranks are two datasets of one process, each with its own cache, reading its
share of the epoch."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import HfApi

from lerobot_pipe.datasets import BatchPrefetcher
from lerobot_pipe.datasets.hub_files import HubFileCache
from lerobot_pipe.datasets.remote_files import ByteRanges
from lerobot_pipe.datasets.stream_sampler import StreamSampler
from lerobot_pipe.datasets.streaming import StreamingLeRobotDataset
from lerobot_pipe.datasets.synthetic import render
from lerobot_pipe.datasets.writer import DatasetWriter, camera_feature

XY = {"dtype": "float32", "shape": [2], "names": ["x", "y"]}
CAMERA = "observation.images.top"
DELTAS = {"action": [i / 10 for i in range(10)]}  # ACT-like windows
# Bytes sent / bytes of the files over one epoch: nothing twice on one rank; on two, each rank's
# container index, the key frame before a window and the data file's row groups (every rank
# reads its file group's rows) beyond its own episodes' bytes.
ONE_RANK, TWO_RANKS = 1.02, 1.1


def write_noisy(root: Path, episodes: int, length: int, size: int) -> Path:
    """One camera with pixel noise (std 20): camera-like bytes per frame, not the ~100 bytes of
    the clean renders."""
    writer = DatasetWriter(
        root,
        10,
        {"observation.state": XY, "action": XY, CAMERA: camera_feature("video", size, size)},
    )
    rng = np.random.default_rng(0)
    for _ in range(episodes):
        state = np.cumsum(rng.normal(0, 0.05, (length, 2)), axis=0).astype(np.float32)
        frames = render("top", state, np.broadcast_to(state[-1], state.shape), size)
        noisy = frames + rng.normal(0, 20, frames.shape)
        writer.add_episode(
            {"observation.state": state, "action": np.roll(state, -1, axis=0)},
            "reach",
            {CAMERA: np.clip(noisy, 0, 255).astype(np.uint8)},
        )
    writer.finish()
    return root


def upload(hub, root: Path, repo: str) -> int:
    """``root`` on the Hub as ``repo``; the bytes of its data and video files."""
    api = HfApi(endpoint=hub.url, token=hub.token)
    api.create_repo(repo, repo_type="dataset")
    api.upload_folder(repo_id=repo, repo_type="dataset", folder_path=root)
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and "meta" not in p.parts)


def epoch_bytes(hub, repo: str, cache: Path, world: int, request_bytes: int | None = None):
    """Every rank's epoch 0: (body bytes the Hub sent of data and video files, their requests)."""
    sent, requests = 0, []
    for rank in range(world):
        dataset = StreamingLeRobotDataset(
            repo, cache / f"rank{rank}", endpoint=hub.url, token=hub.token, delta_timestamps=DELTAS
        )
        if request_bytes is not None:
            dataset.files.request_bytes = request_bytes
        hub.clear_requests()
        sampler = StreamSampler(dataset.episode_bounds, 4, rank, world, seed=0)
        _, epochs = sampler.draws(rank, 0, len(dataset))
        with BatchPrefetcher(dataset, sampler, 0) as loader:
            for _ in range(int((epochs == 0).sum()) // 4):
                loader.next()
        dataset.close()  # the read-ahead joined: every byte it fetched is in the log
        got = [
            q
            for q in hub.requests
            if q.method == "GET" and re.search(r"/resolve/[0-9a-f]+/(data|videos)/", q.path)
        ]
        sent += sum(q.sent for q in got)
        requests += [(rank, q.path.rsplit("/", 1)[-1], q.headers.get("Range"), q.sent) for q in got]
    return sent, requests


def check_bytes(hub, repo: str, files: int, cache: Path, world: int, request_bytes=None) -> int:
    sent, requests = epoch_bytes(hub, repo, cache, world, request_bytes)
    ratio = sent / files
    print(f"{repo}, {world} rank(s): {ratio:.4f} of the files' bytes, {len(requests)} requests")
    largest = sorted(requests, key=lambda r: -r[3])[:8]
    assert ratio <= (ONE_RANK if world == 1 else TWO_RANKS), (ratio, largest)
    return len(requests)


SMALL = "alice/small-episodes"


@pytest.fixture(scope="module")
def small(hub_server_module, tmp_path_factory):
    """12 episodes x 40 frames of 96x96: ~97 kB of video each, less than one 1 MiB request."""
    root = write_noisy(tmp_path_factory.mktemp("small") / "ds", 12, 40, 96)
    return hub_server_module, upload(hub_server_module, root, SMALL)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize(
    "request_bytes",
    [None, 32 << 10],
    ids=["episodes-smaller-than-a-request", "episodes-larger-than-a-request"],
)
def test_each_rank_reads_only_its_episodes_bytes(small, tmp_path, world, request_bytes):
    hub, files = small
    requests = check_bytes(hub, SMALL, files, tmp_path, world, request_bytes)
    if request_bytes is None:  # few requests: ~one per episode, a few per rank (index, data)
        assert requests <= 16 + 8 * world


@pytest.mark.slow
@pytest.mark.parametrize(
    ("episodes", "length", "size"),
    [(20, 60, 96), (4, 150, 160)],
    ids=["issue-42-dataset-147kB-episodes", "1MB-episodes"],
)
def test_each_rank_reads_only_its_episodes_bytes_slow(
    hub_server_module, tmp_path, episodes, length, size
):
    """Issue #42's dataset (20 episodes x 60 frames of 96x96, ~147 kB of video each) and larger
    episodes (4 x 150 frames of 160x160, ~1 MB each: more than one request)."""
    repo = f"alice/episodes-{episodes}x{length}x{size}"
    files = upload(hub_server_module, write_noisy(tmp_path / "ds", episodes, length, size), repo)
    for world in (1, 2):
        check_bytes(hub_server_module, repo, files, tmp_path / f"cache{world}", world)


def test_byte_ranges_merge_and_locate():
    ranges = ByteRanges()
    for start, end in [(100, 200), (300, 400), (200, 250), (500, 500), (390, 420)]:
        ranges.add(start, end)
    assert ranges.around(150) == (100, 250, True)  # touching ranges merged
    assert ranges.around(320) == (300, 420, True)  # overlapping ones too
    assert ranges.around(260) == (250, 300, False)  # the gap around a position
    assert ranges.around(50) == (0, 100, False) and ranges.around(420) == (420, None, False)


def test_parts_of_a_block_are_joined_and_each_byte_is_fetched_once(small, tmp_path):
    """A block is fetched only within the reader's window; its parts are joined as they come,
    and a later read fetches only the bytes the block does not hold yet."""
    hub, _ = small
    path = "videos/observation.images.top/chunk-000/file-000.mp4"
    cache = HubFileCache(
        SMALL, hub.head(SMALL, "dataset"), tmp_path, 1 << 30, endpoint=hub.url, token=hub.token
    )
    want = hub.read_file(SMALL, path, repo_type="dataset")
    hub.clear_requests()
    reads = [  # (start, stop, window)
        (1000, 1100, (1000, 5000)),  # block 0's part within the window only
        (5000, 5100, (5000, 40000)),  # the rest of block 0 within the window
        (0, 20000, None),  # block 0's first 1000 bytes; block 1 whole
        (39000, 40100, (39000, 40100)),  # block 2's part within the window
        (32768, 39100, (32768, 49152)),  # block 2's bytes before it, joined to it
    ]
    for start, stop, window in reads:
        assert cache.read_bytes(path, start, stop, 16384, window) == want[start:stop]
    sent = [(q.headers["Range"], q.sent) for q in hub.requests if q.method == "GET"]
    assert sent == [
        ("bytes=1000-4999", 4000),
        ("bytes=5000-16383", 11384),
        ("bytes=0-999", 1000),
        ("bytes=16384-32767", 16384),
        ("bytes=39000-40099", 1100),
        ("bytes=32768-38999", 6232),
    ]
    assert cache.read_bytes(path, 0, 40100, 16384) == want[:40100]  # all in memory now
    assert len([q for q in hub.requests if q.method == "GET"]) == len(sent)
