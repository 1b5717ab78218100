"""Run by LeRobot's own interpreter (not by pytest): LeRobot's writer on given episode data.

    <lerobot python> upstream_write.py EPISODES.npz ROOT video|image

EPISODES.npz holds ``lengths`` (episodes), ``tasks`` (one per episode), the numeric features
``observation.state`` and ``action`` (frames, 2), and camera frames under ``camera:<key>``
(frames, H, W, 3) uint8. The dataset is recorded frame by frame with LeRobotDataset.create /
add_frame / save_episode / finalize, the way lerobot-record writes one.
"""

import sys
from pathlib import Path

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

NUMERIC = ("observation.state", "action")


def main() -> None:
    source, root, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    data = np.load(source)
    cameras = [name.split(":", 1)[1] for name in data.files if name.startswith("camera:")]
    features = {key: {"dtype": "float32", "shape": (2,), "names": ["x", "y"]} for key in NUMERIC}
    for key in cameras:
        height, width = data[f"camera:{key}"].shape[1:3]
        features[key] = {
            "dtype": mode,
            "shape": (height, width, 3),
            "names": ["height", "width", "channels"],
        }
    dataset = LeRobotDataset.create(
        "local/written",
        fps=10,
        features=features,
        root=root,
        robot_type="synthetic_point2d",
        use_videos=mode == "video",
    )
    row = 0
    for length, task in zip(data["lengths"].tolist(), data["tasks"].tolist(), strict=True):
        for _ in range(length):
            frame = {key: data[key][row] for key in NUMERIC}
            frame |= {key: data[f"camera:{key}"][row] for key in cameras}
            dataset.add_frame(frame | {"task": str(task)})
            row += 1
        dataset.save_episode()
    dataset.finalize()


if __name__ == "__main__":
    main()
