"""Run by LeRobot's own interpreter (not by pytest): LeRobot's decode of datasets' frames.

    <lerobot python> upstream_frames.py OUT.npz BACKEND[,BACKEND] INDEX[,INDEX...] ROOT [ROOT ...]

Writes, for each dataset ROOT (numbered from 0), backend and camera key, LeRobot's uint8 frames
of the given dataset indices (``LeRobotDataset(..., video_backend=BACKEND,
return_uint8=True)[index]``, as lerobot-train configures it) stacked as ``(len(indices), C, H,
W)`` under ``<root>/<backend>/<key>``. Image (PNG) cameras, which LeRobot always returns as
float32 (x / 255), are rounded back to uint8.
"""

import sys

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset


def main() -> None:
    out, backends, indices = sys.argv[1:4]
    arrays = {}
    for number, root in enumerate(sys.argv[4:]):
        for backend in backends.split(","):
            ds = LeRobotDataset("local/frames", root=root, video_backend=backend, return_uint8=True)
            for key in ds.meta.camera_keys:
                frames = np.stack([ds[int(i)][key].numpy() for i in indices.split(",")])
                if frames.dtype != np.uint8:
                    frames = np.round(frames * 255).astype(np.uint8)
                arrays[f"{number}/{backend}/{key}"] = frames
    np.savez(out, **arrays)


if __name__ == "__main__":
    main()
