"""Streaming from the local test Hub over HTTP against the map-style loader on local files.

    .venv/bin/python bench/bench_streaming.py [--episodes 40] [--length 100] [--size 64]
        [--batch 8] [--workers 2] [--reps 2] [--whole-files] [--noise 0]
        [--layouts packed,per-episode] [--cameras 2]

Dataset: the synthetic reaching task with two cameras (``top``, ``wrist``, AV1 as LeRobot
encodes; ``--cameras 1``: ``top`` only), written twice: ``packed`` (LeRobot's writer defaults: one data file, one mp4 per
camera holding every episode) and ``per-episode`` (one mp4 per episode and camera). Each is
uploaded to the test Hub (``tests/hub_server.py``, real HTTP on 127.0.0.1, the real
huggingface_hub client). ACT-like delta timestamps (one frame per camera, 10 actions).

Per configuration, one epoch (every drawable sample once), float32 camera batches:
- map: ``BatchPrefetcher(LeRobotDataset(local files), GlobalBatchSampler)``, opening the
  dataset (reading every data file, opening and checking every video file) included;
- stream rank r of W: ``BatchPrefetcher(StreamingLeRobotDataset(hub), StreamSampler(r, W))``,
  a cold cache each rep (resolving the revision, fetching meta/ and every byte included); W=2's ranks run one after
  another in this process (the machine has 2 cores), each reading its share of epoch 0; their
  samples/s is the epoch's samples over the slower rank's time (what two ranks on two machines
  would take).
Video files are read by cached byte-range blocks (``video_ranges``, the default), or fetched
whole with ``--whole-files``. Also: bytes fetched per epoch (every rank, retries included) / bytes of the data and video files,
from a run without loader workers (their look-ahead reads past the end of the epoch).
The sides alternate within each rep; medians of ``--reps`` (and each rep's ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import _common as c  # noqa: F401 - must come first: pins threads, sets sys.path

# isort: split
import numpy as np
from conftest_hub import hub_client_settings
from hub_server import HubServer
from huggingface_hub import HfApi

from lerobot_pipe.datasets import BatchPrefetcher, GlobalBatchSampler, LeRobotDataset
from lerobot_pipe.datasets.stream_sampler import StreamSampler
from lerobot_pipe.datasets.streaming import StreamingLeRobotDataset
from lerobot_pipe.datasets.synthetic import render
from lerobot_pipe.datasets.writer import DatasetWriter, camera_feature

XY = {"dtype": "float32", "shape": [2], "names": ["x", "y"]}
CAMERAS = ("top", "wrist")
DELTAS = {"action": [i / 10 for i in range(10)]}


def write(
    root: Path,
    episodes: int,
    length: int,
    size: int,
    per_episode: bool,
    noise: float = 0.0,
    cameras: tuple[str, ...] = CAMERAS,
) -> Path:
    features = {
        "observation.state": XY,
        "action": XY,
        **{f"observation.images.{v}": camera_feature("video", size, size) for v in cameras},
    }
    kwargs = {"video_files_size_in_mb": 1e-6} if per_episode else {}
    writer = DatasetWriter(root, 10, features, **kwargs)
    rng = np.random.default_rng(0)
    for _ in range(episodes):
        state = np.cumsum(rng.normal(0, 0.05, (length, 2)), axis=0).astype(np.float32)
        goal = np.broadcast_to(state[-1], state.shape)
        writer.add_episode(
            {"observation.state": state, "action": np.roll(state, -1, axis=0)},
            "reach",
            {
                f"observation.images.{v}": _noisy(render(v, state, goal, size), noise, rng)
                for v in cameras
            },
        )
    writer.finish()
    return root


def _noisy(frames: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """``frames`` with Gaussian pixel noise of std ``noise``: camera-like bytes per frame (the
    clean renders compress to ~100 bytes, far below a decoder's 32-64 KiB read buffer)."""
    if not noise:
        return frames
    noisy = frames.astype(np.float32) + rng.normal(0, noise, frames.shape).astype(np.float32)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def epoch_map(root: Path, batch: int, workers: int) -> float:
    start = time.perf_counter()  # opening the dataset counted, as the stream's is
    dataset = LeRobotDataset(root, delta_timestamps=DELTAS)
    sampler = GlobalBatchSampler(len(dataset), batch, 0, 1, seed=0)
    steps = len(dataset) // batch
    with BatchPrefetcher(dataset, sampler, workers) as loader:
        for _ in range(steps):
            loader.next()
    return steps * batch / (time.perf_counter() - start)


WHOLE_FILES = False  # --whole-files: each video file fetched whole (video_ranges=False)


def epoch_stream(hub, repo, cache: Path, world: int, batch: int, workers: int):
    """(samples/s of the epoch, bytes fetched by every rank)."""
    times, fetched, samples = [], 0, 0
    for rank in range(world):
        start = time.perf_counter()
        dataset = StreamingLeRobotDataset(
            repo,
            cache / f"r{rank}",
            endpoint=hub.url,
            token=hub.token,
            delta_timestamps=DELTAS,
            video_ranges=not WHOLE_FILES,
        )
        sampler = StreamSampler(dataset.episode_bounds, batch, rank, world, seed=0)
        # This rank's share of epoch 0 (shares differ by up to an episode): whole batches of it.
        _, epochs = sampler.draws(rank, 0, len(dataset))
        steps = int((epochs == 0).sum()) // batch
        with BatchPrefetcher(dataset, sampler, workers) as loader:
            for _ in range(steps):
                loader.next()
        times.append(time.perf_counter() - start)
        samples += steps * batch
        dataset.close()  # joins the read-ahead thread: every byte it fetched counted
        fetched += dataset.files.bytes_fetched
    return samples / max(times), fetched


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--length", type=int, default=100)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--whole-files", action="store_true", help="fetch video files whole")
    parser.add_argument("--noise", type=float, default=0.0, help="pixel noise std (0-255)")
    parser.add_argument("--layouts", default="packed,per-episode")
    parser.add_argument("--cameras", type=int, default=2, choices=(1, 2))
    args = parser.parse_args()
    global WHOLE_FILES
    WHOLE_FILES = args.whole_files
    tmp = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    rows = []
    with HubServer(root=tmp / "hub") as hub, hub_client_settings(hub):
        api = HfApi(endpoint=hub.url, token=hub.token)
        for layout in args.layouts.split(","):
            root = write(
                tmp / layout,
                args.episodes,
                args.length,
                args.size,
                layout == "per-episode",
                args.noise,
                CAMERAS[: args.cameras],
            )
            repo = f"bench/{layout}"
            api.create_repo(repo, repo_type="dataset")
            api.upload_folder(repo_id=repo, repo_type="dataset", folder_path=root)
            files = sum(
                p.stat().st_size for p in root.rglob("*") if p.is_file() and "meta" not in p.parts
            )
            # The sides alternate (map, 1 rank, 2 ranks, per rep): load changes hit all alike.
            maps, streams, loads = [], {1: [], 2: []}, [os.getloadavg()[0]]
            for i in range(args.reps):
                maps.append(epoch_map(root, args.batch, args.workers))
                for world in (1, 2):
                    cache = tmp / f"cache-{layout}-{world}-{i}"
                    streams[world].append(
                        epoch_stream(hub, repo, cache, world, args.batch, args.workers)[0]
                    )
                loads.append(os.getloadavg()[0])
            row = {"layout": layout, "file_bytes": files, "map_sps": statistics.median(maps)}
            row["load_1min"] = [round(min(loads), 1), round(max(loads), 1)]
            for world in (1, 2):
                row[f"stream{world}_sps"] = statistics.median(streams[world])
                # Bytes without loader workers: their look-ahead would read past the epoch.
                _, fetched = epoch_stream(
                    hub, repo, tmp / f"cache-{layout}-{world}-bytes", world, args.batch, 0
                )
                row[f"stream{world}_bytes_ratio"] = fetched / files
                row[f"stream{world}_vs_map"] = row[f"stream{world}_sps"] / row["map_sps"]
                row[f"stream{world}_vs_map_per_rep"] = [
                    round(a / b, 2) for a, b in zip(streams[world], maps, strict=True)
                ]
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(
        "| layout | map-style samples/s | stream 1 rank | / map | bytes / files | "
        "stream 2 ranks | / map | bytes / files | load (1 min) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['layout']} | {r['map_sps']:.0f} | {r['stream1_sps']:.0f} | "
            f"{r['stream1_vs_map']:.2f} | {r['stream1_bytes_ratio']:.3f} | "
            f"{r['stream2_sps']:.0f} | {r['stream2_vs_map']:.2f} | {r['stream2_bytes_ratio']:.3f} "
            f"| {r['load_1min'][0]}-{r['load_1min'][1]} |"
        )


if __name__ == "__main__":
    main()
