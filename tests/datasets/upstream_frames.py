"""Run by LeRobot's own interpreter (not by pytest): LeRobot's decode of a dataset's frames.

    <lerobot python> upstream_frames.py ROOT BACKEND OUT.npz INDEX [INDEX ...]

Writes, for each camera key, LeRobot's uint8 frames of the given dataset indices
(``LeRobotDataset(..., video_backend=BACKEND, return_uint8=True)[index]``, its training
configuration) stacked as ``(len(indices), C, H, W)``, and under ``<key>.float`` the float32
frames of its default (``return_uint8=False``) items.
"""

import sys

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset


def main() -> None:
    root, backend, out = sys.argv[1:4]
    indices = [int(i) for i in sys.argv[4:]]
    arrays = {}
    for uint8 in (True, False):
        ds = LeRobotDataset("local/frames", root=root, video_backend=backend, return_uint8=uint8)
        for key in ds.meta.camera_keys:
            frames = np.stack([ds[i][key].numpy() for i in indices])
            arrays[key if uint8 else f"{key}.float"] = frames
    np.savez(out, **arrays)


if __name__ == "__main__":
    main()
