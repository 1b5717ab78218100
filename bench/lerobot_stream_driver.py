"""LeRobot 0.6.1's StreamingLeRobotDataset through a torch DataLoader: the other side of
``bench/bench_streaming_vs_lerobot.py``. Run with LeRobot's interpreter, HF_ENDPOINT/HF_TOKEN
pointing at the Hub that serves ``--repo``; prints one JSON line.

    HF_LEROBOT_HOME=DIR .venv-lerobot/bin/python bench/lerobot_stream_driver.py --repo NS/NAME
        [--batch 8] [--workers 1] [--batches 50]
    HF_LEROBOT_HOME=DIR .venv-lerobot/bin/accelerate launch --multi_gpu --num_processes 2 \
        bench/lerobot_stream_driver.py --repo NS/NAME --accelerate [...]

Samples/s are timed from the end of the first batch (the shuffle buffer's fill, opening the
parquet stream and the first video decoders excluded) to the end of batch ``--batches + 1``.
With ``--accelerate`` the loader goes through ``Accelerator(cpu=True).prepare`` as lerobot-train
does (under ``accelerate launch``, several processes), with ``dispatch_batches=False``: the
default (the main process reads every batch and splits it) fails on the ``task`` strings. Each
process then iterates the whole stream and keeps every n-th batch. Each process prints its own
line (its ``rank``, its samples/s).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--fps", type=int, default=10)
    parser.add_argument("--accelerate", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    dataset = StreamingLeRobotDataset(
        args.repo,
        # No root: with one, LeRobot streams the parquet from that local folder; meta/ goes
        # under HF_LEROBOT_HOME.
        delta_timestamps={"action": [i / args.fps for i in range(10)]},
        max_num_shards=max(args.workers, 1),  # what lerobot-train passes
    )
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch, num_workers=args.workers, drop_last=True
    )
    rank, world = 0, 1
    if args.accelerate:
        from accelerate import Accelerator
        from accelerate.utils import DataLoaderConfiguration

        # lerobot-train's Accelerator() keeps accelerate's default for an IterableDataset
        # (dispatch_batches: the main process reads and splits every batch), which fails on the
        # batch's "task" strings (TypeError: Can only concatenate tensors, accelerate 1.15):
        # the dispatch is turned off, so each process iterates the stream and keeps its share
        # of the batches (accelerate's IterableDatasetShard).
        accelerator = Accelerator(
            cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=False)
        )
        loader = accelerator.prepare(loader)
        rank, world = accelerator.process_index, accelerator.num_processes
    it = iter(loader)
    batch = next(it)
    first = time.perf_counter()
    done = 0
    for _ in range(args.batches):
        try:
            batch = next(it)
        except StopIteration:
            break
        done += 1
    end = time.perf_counter()
    keys = sorted(k for k in batch if k.startswith("observation.images"))
    print(
        json.dumps(
            {
                "rank": rank,
                "world": world,
                "first_batch_s": first - start,
                "batches": done,
                "sps": done * args.batch / (end - first),
                "camera_shape": [list(batch[k].shape) for k in keys],
                "action_shape": list(batch["action"].shape),
            }
        ),
        flush=True,
    )
    del it, loader


if __name__ == "__main__":
    main()
