"""Camera loader: samples/s against LeRobot 0.6.1's loader and a bare decode loop; where the time goes.

    .venv/bin/python bench/bench_camera_loading.py [--reps 3] [--seconds 4] [--batch 8]
        [--configs act,window2,diffusion]

Dataset: the synthetic reaching task, 50 episodes x 100 frames at 10 fps, two cameras (``top``,
``wrist``) of 96x96 encoded as LeRobot encodes (AV1 libsvtav1, yuv420p, g=2, crf 30), 5,000
frames per camera file. Three configurations of delta timestamps, as lerobot-train resolves them:
``act`` (ACT: one frame per camera, an action chunk of 100), ``window2`` (every observation.*
over 2 frames, 16 actions) and ``diffusion`` (Diffusion Policy at LeRobot 0.6.1's defaults:
every observation.* over n_obs_steps=2 frames, horizon 64 actions, and both samplers off each
episode's last drop_n_last_frames=7 frames).

A (ours): ``BatchPrefetcher(dataset, GlobalBatchSampler, num_workers)``, torchcodec, uint8
cameras (``raw_cameras=True``: what LeRobot's ``return_uint8`` loader delivers), and the same
with float32 cameras in [0, 1] (what a CPU training step receives from it).
B (LeRobot): ``bench/lerobot_camera_loader.py`` in LeRobot's own venv (LEROBOT_UPSTREAM_PYTHON,
default /work/upstream/up061/bin/python): its LeRobotDataset(return_uint8=True, torchcodec) +
EpisodeAwareSampler + DataLoader configured as lerobot-train configures it (spawn, persistent
workers, prefetch_factor 4), same files, same worker count.
C (bare loop): the frames of A's sample stream decoded in one thread by the same decoder
(torchcodec, one open VideoDecoder per file): one ``get_frames_at`` per sample and camera, and,
as the decode floor of A's batching, one per batch and camera with sorted unique indices.
Targets: A / B >= 1.2 at the same worker count; A per worker / C (per sample) >= 0.8.
A and B alternate ``--reps`` times (the order rotates); medians.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import time
from pathlib import Path

import _common as c  # must come first: pins threads, sets sys.path

# isort: split
import numpy as np
import pyarrow.parquet as pq
import torch

from lerobot_pipe.datasets import (
    BatchPrefetcher,
    GlobalBatchSampler,
    LeRobotDataset,
    episode_frames,
    write_synthetic_dataset,
)
from lerobot_pipe.policies.diffusion import DiffusionConfig

UPSTREAM = os.environ.get("LEROBOT_UPSTREAM_PYTHON", "/work/upstream/up061/bin/python")
HERE = Path(__file__).resolve().parent
CAMERAS = ("observation.images.top", "observation.images.wrist")
TARGET_VS_LEROBOT = 1.2
TARGET_VS_BARE = 0.8


CONFIGS = ("act", "window2", "diffusion")
DIFFUSION = DiffusionConfig()


def delta_timestamps(config: str, features: dict, fps: int) -> dict[str, list[float]]:
    """What lerobot-train resolves for ACT (``act``), a 2-frame policy (``window2``) and
    Diffusion Policy's defaults (``diffusion``)."""
    if config == "act":
        return {"action": [i / fps for i in range(100)]}
    if config == "diffusion":
        obs, actions = DIFFUSION.observation_delta_indices, DIFFUSION.action_delta_indices
        window = {k: [i / fps for i in obs] for k in features if k.startswith("observation.")}
        return window | {"action": [i / fps for i in actions]}
    window = {key: [-1 / fps, 0.0] for key in features if key.startswith("observation.")}
    return window | {"action": [(i - 1) / fps for i in range(16)]}


def open_dataset(root: Path, config: str) -> LeRobotDataset:
    probe = LeRobotDataset(root)
    deltas = delta_timestamps(config, probe.features, probe.fps)
    return LeRobotDataset(root, delta_timestamps=deltas, video_backend="torchcodec")


def drawable(ds: LeRobotDataset, config: str) -> np.ndarray | None:
    """The positions lerobot-train's sampler draws from (``diffusion``: not an episode's last
    drop_n_last_frames)."""
    if config != "diffusion":
        return None
    return episode_frames(*ds.episode_bounds, drop_n_last_frames=DIFFUSION.drop_n_last_frames)


def ours_rate(
    ds: LeRobotDataset, config: str, batch: int, workers: int, seconds: float, raw: bool
) -> float:
    sampler = GlobalBatchSampler(len(ds), batch, 0, 1, seed=1000, indices=drawable(ds, config))
    with BatchPrefetcher(ds, sampler, workers, raw_cameras=raw) as loader:
        for _ in range(2 * max(workers, 1) + 2):
            loader.next()
        samples, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            samples += len(loader.next()["index"])
        return samples / (time.perf_counter() - start)


def lerobot_rate(root: Path, config: str, batch: int, workers: int, seconds: float) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    script = HERE / "lerobot_camera_loader.py"
    args = [UPSTREAM, str(script), str(root), config, str(batch), str(workers), str(seconds)]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode:
        raise RuntimeError(f"LeRobot's loader failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"]


class FrameIndex:
    """Frame indices in the video files of dataset rows, read from the files (not our reader)."""

    def __init__(self, root: Path) -> None:
        data = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pydict()
        episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
        self.episode = np.array(data["episode_index"])
        self.timestamp = np.array(data["timestamp"], dtype=np.float32).astype(np.float64)
        self.start = np.array(episodes["dataset_from_index"])[self.episode]
        self.end = np.array(episodes["dataset_to_index"])[self.episode] - 1
        self.offset = {
            key: np.array(episodes[f"videos/{key}/from_timestamp"])[self.episode] for key in CAMERAS
        }
        self.paths = {key: root / f"videos/{key}/chunk-000/file-000.mp4" for key in CAMERAS}

    def frames(self, key: str, rows: np.ndarray, window: list[int], fps: int) -> np.ndarray:
        wanted = np.clip(
            rows[:, None] + np.array(window)[None, :], self.start[rows, None], self.end[rows, None]
        )
        return np.rint((self.offset[key][wanted] + self.timestamp[wanted]) * fps).astype(int)


def bare_rate(root: Path, config: str, batch: int, seconds: float, grouped: bool) -> float:
    from torchcodec.decoders import VideoDecoder

    index = FrameIndex(root)
    window = [0] if config == "act" else [-1, 0]
    decoders = {
        key: VideoDecoder(str(p), seek_mode="approximate") for key, p in index.paths.items()
    }
    sampler = GlobalBatchSampler(
        len(index.episode), batch, 0, 1, seed=1000, indices=drawable(LeRobotDataset(root), config)
    )
    samples, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        rows = sampler.next_indices()
        for key, decoder in decoders.items():
            frames = index.frames(key, rows, window, 10)
            if grouped:
                decoder.get_frames_at(indices=np.unique(frames).tolist())
            else:
                for sample in frames:
                    decoder.get_frames_at(indices=sample.tolist())
        samples += len(rows)
    return samples / (time.perf_counter() - start)


def _echo(inbox: mp.Queue, outbox: mp.Queue) -> None:
    while (item := inbox.get()) is not None:
        outbox.put(item)


def breakdown(root: Path, batch: int) -> list[tuple[str, float]]:
    """Microseconds per camera frame of each stage, one thread, 96x96 frames at random rows."""
    import av
    from torchcodec.decoders import VideoDecoder

    index = FrameIndex(root)
    rng = np.random.default_rng(0)
    rows = rng.integers(0, len(index.episode), 400)
    key = CAMERAS[0]
    targets = index.frames(key, rows, [0], 10)[:, 0]
    path = str(index.paths[key])
    out: list[tuple[str, float]] = []

    def per_frame(name: str, work, n: int) -> None:
        start = time.perf_counter()
        work()
        out.append((name, 1e6 * (time.perf_counter() - start) / n))

    per_frame("open a file (PyAV header)", lambda: [av.open(path).close() for _ in range(50)], 50)
    per_frame(
        "open a file (torchcodec VideoDecoder)",
        lambda: [VideoDecoder(path, seek_mode="approximate") for _ in range(20)],
        20,
    )
    container = av.open(path)
    stream = container.streams.video[0]
    stream.codec_context.thread_count = 1
    time_base = float(stream.time_base)
    rgb = av.video.reformatter.VideoReformatter()
    seek_s = decode_s = colour_s = 0.0
    decoded = []
    for t in targets.tolist():
        a = time.perf_counter()
        container.seek(int(t / 10 / time_base), backward=True, any_frame=False, stream=stream)
        b = time.perf_counter()
        frame = None
        for packet in container.demux(stream):
            for candidate in packet.decode():
                if candidate.pts * time_base >= t / 10 - 0.05:
                    frame = candidate
                    break
            if frame is not None:
                break
        d = time.perf_counter()
        decoded.append(rgb.reformat(frame, format="rgb24").to_ndarray())
        e = time.perf_counter()
        seek_s, decode_s, colour_s = seek_s + b - a, decode_s + d - b, colour_s + e - d
    n = len(targets)
    out += [
        ("PyAV: seek to the key frame", 1e6 * seek_s / n),
        ("PyAV: decode (key frame, then the target)", 1e6 * decode_s / n),
        ("PyAV: colour conversion YUV -> RGB + to numpy", 1e6 * colour_s / n),
    ]
    decoder = VideoDecoder(path, seek_mode="approximate")
    per_frame(
        "torchcodec: seek + decode + colour, one frame per call",
        lambda: [decoder.get_frames_at(indices=[t]) for t in targets.tolist()],
        n,
    )
    groups = [np.unique(targets[i : i + 2 * batch]) for i in range(0, n, 2 * batch)]
    per_frame(
        f"torchcodec: the same, {2 * batch} sorted frames per call",
        lambda: [decoder.get_frames_at(indices=g.tolist()) for g in groups],
        sum(len(g) for g in groups),
    )
    out.append(("resize (none: LeRobot's loader keeps the stored size)", 0.0))
    frames = torch.from_numpy(np.stack(decoded)).permute(0, 3, 1, 2).contiguous()
    buffer = torch.empty((batch * 2, *frames.shape[1:]), dtype=torch.uint8)
    picks = rng.integers(0, len(frames), (200, batch * 2))
    per_frame(
        "collation: frames into the batch buffer (numpy gather)",
        lambda: [buffer.numpy().__setitem__(slice(None), frames.numpy()[p]) for p in picks],
        picks.size,
    )
    per_frame(
        "uint8 -> float32 / 255, per frame of a batch",
        lambda: [buffer.to(torch.float32).div_(255.0) for _ in range(200)],
        200 * len(buffer),
    )
    ctx = mp.get_context("fork")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    echo = ctx.Process(target=_echo, args=(inbox, outbox), daemon=True)
    echo.start()
    for dtype in (torch.uint8, torch.float32):
        item = {k: buffer.to(dtype) for k in CAMERAS}
        inbox.put(item)
        outbox.get()

        def round_trips(item=item) -> None:
            for _ in range(50):
                inbox.put(item)
                outbox.get()

        name = "uint8" if dtype == torch.uint8 else "float32"
        per_frame(
            f"IPC: a {name} batch to a process and back, per frame",
            round_trips,
            50 * 2 * len(buffer),
        )
    inbox.put(None)
    echo.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    args = ap.parse_args()
    configs = args.configs.split(",")
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        ap.error(f"--configs: unknown {unknown}; choose among {', '.join(CONFIGS)}")
    tmp = c.bench_tmp("camera_loading")
    started = time.perf_counter()
    root = write_synthetic_dataset(
        tmp / "dataset",
        num_episodes=50,
        episode_length=100,
        cameras=["top", "wrist"],
        image_size=96,
    )
    print(
        f"dataset: 50 x 100 frames, 2 cameras 96x96 AV1 (written in {time.perf_counter() - started:.1f} s); "
        f"batch {args.batch}; {c.machine_load()}"
    )
    have_lerobot = Path(UPSTREAM).is_file()
    if not have_lerobot:
        print(
            f"LeRobot's interpreter {UPSTREAM} is absent: set LEROBOT_UPSTREAM_PYTHON (B skipped)"
        )

    print("\nwhere the time goes (us per camera frame, one thread):")
    for name, us in breakdown(root, args.batch):
        print(f"  {name:60s} {us:8.1f}")

    results: dict[tuple, list[float]] = {}
    for rep in range(args.reps):
        for config in configs:
            ds = open_dataset(root, config)
            for workers in (1, 2):
                runs = [("A uint8", True), ("A float", False)] + [("B", None)] * have_lerobot
                if (rep + workers) % 2:
                    runs.reverse()
                for name, raw in runs:
                    if raw is None:
                        rate = lerobot_rate(root, config, args.batch, workers, args.seconds)
                    else:
                        rate = ours_rate(ds, config, args.batch, workers, args.seconds, raw)
                    results.setdefault((config, workers, name), []).append(rate)
            for grouped in (False, True):
                name = "C grouped" if grouped else "C"
                rate = bare_rate(root, config, args.batch, args.seconds, grouped)
                results.setdefault((config, 1, name), []).append(rate)
        print(f"rep {rep} done ({c.machine_load()})")

    med = {k: c.median(v) for k, v in results.items()}
    print(f"\nsamples/s (median of {args.reps}; batch {args.batch}):")
    print(
        f"  {'config':8s} {'workers':>7s} {'A uint8':>9s} {'A float':>9s} {'B LeRobot':>10s} {'A/B':>6s}"
    )
    verdicts = []
    for config in configs:
        for workers in (1, 2):
            a, f = med[(config, workers, "A uint8")], med[(config, workers, "A float")]
            b = med.get((config, workers, "B"))
            ratio = f"{a / b:6.1f}" if b else "     -"
            print(f"  {config:8s} {workers:7d} {a:9,.0f} {f:9,.0f} {b or 0:10,.0f} {ratio}")
            if b:
                verdicts.append(a / b >= TARGET_VS_LEROBOT)
    print("\nper worker vs the bare loop (one thread, same decoder, same frames):")
    for config in configs:
        bare, floor = med[(config, 1, "C")], med[(config, 1, "C grouped")]
        for workers in (1, 2):
            per = med[(config, workers, "A uint8")] / workers
            verdicts.append(per / bare >= TARGET_VS_BARE)
            print(
                f"  {config:8s} workers {workers}: {per:7,.0f} samples/s per worker; bare loop "
                f"{bare:7,.0f} (ratio {per / bare:.2f}); grouped floor {floor:7,.0f} "
                f"(ratio {per / floor:.2f})"
            )
    print("\nscaling with workers (2 / 1):")
    for config in configs:
        ours = med[(config, 2, "A uint8")] / med[(config, 1, "A uint8")]
        theirs = f"{med[(config, 2, 'B')] / med[(config, 1, 'B')]:.2f}" if have_lerobot else "-"
        print(f"  {config:8s} ours {ours:.2f}, LeRobot {theirs}")
    print(
        f"\ntargets: A/B >= {TARGET_VS_LEROBOT}, A per worker / C >= {TARGET_VS_BARE}: "
        f"{c.verdict(all(verdicts))}"
    )


if __name__ == "__main__":
    main()
