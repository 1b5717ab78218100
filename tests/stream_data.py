"""The streaming tests' data: a camera dataset (two AV1 cameras, one mp4 per episode and camera, episodes of unequal length,
two tasks) in a module's local test Hub, shared by the streaming tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest_hub import hub_server_module  # noqa: F401 - fixture
from huggingface_hub import HfApi

from lerobot_pipe.datasets.synthetic import render
from lerobot_pipe.datasets.writer import DatasetWriter, camera_feature

REPO = "alice/stream-cams"
LENGTHS = (9, 6, 12, 7, 10, 8, 11, 5)
CAMERAS = ("top", "wrist")
XY = {"dtype": "float32", "shape": [2], "names": ["x", "y"]}
# Windows on both sides of the frame, for a numeric feature and a camera: padding at both edges.
DELTA_TIMESTAMPS = {
    "observation.state": [-0.2, -0.1, 0.0],
    "action": [0.0, 0.1, 0.2, 0.3],
    "observation.images.top": [-0.1, 0.0],
}


@pytest.fixture(scope="module")
def camera_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stream") / "ds"
    features = {
        "observation.state": XY,
        "action": XY,
        **{f"observation.images.{v}": camera_feature("video", 32, 32) for v in CAMERAS},
    }
    writer = DatasetWriter(root, 10, features, video_files_size_in_mb=1e-6)
    rng = np.random.default_rng(0)
    for e, n in enumerate(LENGTHS):
        state = rng.uniform(-1, 1, (n, 2)).astype(np.float32)
        goal = np.broadcast_to(state[-1], state.shape)
        writer.add_episode(
            {"observation.state": state, "action": np.roll(state, -1, axis=0)},
            ("reach the goal", "push the block")[e % 2],
            {f"observation.images.{v}": render(v, state, goal, 32) for v in CAMERAS},
        )
    writer.finish()
    return root


@pytest.fixture(scope="module")
def hub_repo(hub_server_module, camera_root):  # noqa: F811
    """The camera dataset uploaded to the module's Hub as ``REPO``; the server."""
    api = HfApi(endpoint=hub_server_module.url, token=hub_server_module.token)
    api.create_repo(REPO, repo_type="dataset")
    api.upload_folder(repo_id=REPO, repo_type="dataset", folder_path=camera_root)
    return hub_server_module
