"""--dataset.repo_id with cameras: the video files the selected episodes need, and no others,
come from the Hub (the local test server over HTTP) into the usual cache."""

from pathlib import Path

import numpy as np
import pytest
from conftest_hub import hub_server  # noqa: F401  (tests/ is on pythonpath)
from huggingface_hub import HfApi

from lerobot_pipe.datasets import DatasetError, LeRobotDataset, resolve_dataset_root
from lerobot_pipe.datasets.synthetic import render
from lerobot_pipe.datasets.writer import DatasetWriter, camera_feature

REPO = "alice/reach-cameras"
KEY = "observation.images.top"
XY = {"dtype": "float32", "shape": [2], "names": ["x", "y"]}


def _video(i: int) -> str:
    return f"videos/{KEY}/chunk-000/file-{i:03d}.mp4"


@pytest.fixture
def repo(hub_server, tmp_path: Path) -> str:  # noqa: F811
    """A dataset repo of 4 episodes, each in its own video file (LeRobot's size rule)."""
    root = tmp_path / "upload"
    features = {"observation.state": XY, "action": XY, KEY: camera_feature("video", 64, 64)}
    writer = DatasetWriter(root, 10, features, video_files_size_in_mb=1e-6)
    rng = np.random.default_rng(0)
    for _ in range(4):
        state = rng.uniform(-1, 1, (8, 2)).astype(np.float32)
        writer.add_episode(
            {"observation.state": state, "action": state},
            "reach",
            {KEY: render("top", state, state, 64)},
        )
    writer.finish()
    assert all((root / _video(i)).is_file() for i in range(4))
    api = HfApi(endpoint=hub_server.url, token=hub_server.token)
    api.create_repo(REPO, repo_type="dataset")
    api.upload_folder(repo_id=REPO, repo_type="dataset", folder_path=root)
    hub_server.clear_requests()
    return REPO


def _downloads(server, name: str) -> int:
    return len(server.find_requests(rf"/resolve/.*/{name}$", method="GET"))


def _videos_in(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.glob("videos/*/*/*.mp4"))


def test_downloads_only_the_selected_episodes_videos(repo: str, hub_server) -> None:  # noqa: F811
    root = resolve_dataset_root(None, repo, episodes=[1, 2])
    assert root.is_relative_to(hub_server.cache_dir)
    assert _videos_in(root) == [_video(1), _video(2)]
    assert _downloads(hub_server, "file-000.mp4") == _downloads(hub_server, "file-003.mp4") == 0
    ds = LeRobotDataset(root, episodes=[1, 2])
    assert ds.get_batch([0, 15])[KEY].shape == (2, 3, 64, 64)
    with pytest.raises(DatasetError, match=r"file-000\.mp4: .* is missing.*--dataset\.repo_id"):
        LeRobotDataset(root)  # all episodes: the others' videos were not fetched

    # More episodes later: only the file not yet in the cache is downloaded.
    again = resolve_dataset_root(None, repo, episodes=[0, 1])
    assert again == root
    assert _videos_in(root) == [_video(0), _video(1), _video(2)]
    assert _downloads(hub_server, "file-000.mp4") == 1
    assert _downloads(hub_server, "file-001.mp4") == 1
    LeRobotDataset(root, episodes=[0, 1, 2])


def test_local_root_gets_the_missing_videos(repo: str, hub_server, tmp_path: Path) -> None:  # noqa: F811
    local = tmp_path / "local"
    assert resolve_dataset_root(local, repo, episodes=[3]) == local
    assert _videos_in(local) == [_video(3)]
    LeRobotDataset(local, episodes=[3])
    # An existing root that lacks videos for the selected episodes fetches just those.
    assert resolve_dataset_root(local, repo, episodes=[2, 3]) == local
    assert _videos_in(local) == [_video(2), _video(3)]
    assert _downloads(hub_server, "file-003.mp4") == 1
    # Without --dataset.repo_id nothing is fetched and the missing file is named.
    assert resolve_dataset_root(local, None) == local
    with pytest.raises(DatasetError, match=r"file-000\.mp4: .* is missing"):
        LeRobotDataset(local)
