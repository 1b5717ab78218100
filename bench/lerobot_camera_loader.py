"""Run by LeRobot's own interpreter (not ours): LeRobot 0.6.1's loader as lerobot-train builds it.

    <lerobot python> lerobot_camera_loader.py ROOT CONFIG BATCH WORKERS SECONDS [--float]

``LeRobotDataset(video_backend="torchcodec", return_uint8=True, tolerance_s=1e-4)`` with the
delta timestamps lerobot-train resolves for CONFIG (``act``: an action chunk of 100 steps,
one frame per camera; ``window2``: every observation.* feature over 2 frames, 16 actions from
the previous step; ``diffusion``: LeRobot 0.6.1's DiffusionConfig defaults, 2 frames and 64
actions, the sampler off each episode's last drop_n_last_frames), its EpisodeAwareSampler
(shuffle, seed),
and ``torch.utils.data.DataLoader`` with lerobot-train's options (``num_workers``,
``prefetch_factor=4``, ``persistent_workers=True``, ``multiprocessing_context="spawn"``,
``pin_memory`` off on CPU, ``drop_last=False``). After a warm-up (workers started, queues
full) it counts samples delivered for SECONDS and prints one JSON line. ``--float`` also does
what lerobot-train's loop does next: uint8 cameras -> float32 / 255 in the main process.
"""

import json
import sys
import time

import torch
from lerobot.datasets import EpisodeAwareSampler
from lerobot.datasets.lerobot_dataset import LeRobotDataset


def delta_timestamps(config: str, features: dict, fps: int) -> dict[str, list[float]]:
    if config == "act":
        return {"action": [i / fps for i in range(100)]}
    if config == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

        cfg = DiffusionConfig()
        obs, actions = cfg.observation_delta_indices, cfg.action_delta_indices
        window = {k: [i / fps for i in obs] for k in features if k.startswith("observation.")}
        return window | {"action": [i / fps for i in actions]}
    window = {key: [-1 / fps, 0.0] for key in features if key.startswith("observation.")}
    return window | {"action": [(i - 1) / fps for i in range(16)]}


def main() -> None:
    root, config, batch_size, workers, seconds = sys.argv[1:6]
    batch_size, workers, seconds = int(batch_size), int(workers), float(seconds)
    to_float = "--float" in sys.argv[6:]
    probe = LeRobotDataset("local/bench", root=root)
    dataset = LeRobotDataset(
        "local/bench",
        root=root,
        delta_timestamps=delta_timestamps(config, probe.meta.features, probe.meta.fps),
        video_backend="torchcodec",
        return_uint8=True,
        tolerance_s=1e-4,
    )
    drop = 0
    if config == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

        drop = DiffusionConfig().drop_n_last_frames
    sampler = EpisodeAwareSampler(
        dataset.meta.episodes["dataset_from_index"],
        dataset.meta.episodes["dataset_to_index"],
        drop_n_last_frames=drop,
        shuffle=True,
        seed=1000,
    )
    on = workers > 0
    loader = torch.utils.data.DataLoader(
        dataset,
        num_workers=workers,
        batch_size=batch_size,
        sampler=sampler,
        pin_memory=False,
        drop_last=False,
        prefetch_factor=4 if on else None,
        persistent_workers=on,
        multiprocessing_context="spawn" if on else None,
    )
    cameras = dataset.meta.camera_keys

    def batches():
        while True:
            yield from loader

    stream = batches()
    for _ in range(4 * max(workers, 1) + 2):  # the workers are up and have delivered
        next(stream)
    samples, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = next(stream)
        if to_float:
            for key in cameras:
                batch[key] = batch[key].to(dtype=torch.float32) / 255.0
        samples += len(batch["index"])
    elapsed = time.perf_counter() - start
    print(json.dumps({"samples_per_s": samples / elapsed, "samples": samples, "s": elapsed}))


if __name__ == "__main__":
    main()
