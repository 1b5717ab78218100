import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_pipe.datasets import DatasetError, LeRobotDataset, resolve_dataset_root
from lerobot_pipe.datasets.synthetic import write_synthetic_dataset

DATA_FILE = "data/chunk-000/file-000.parquet"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"


def _edit_json(path: Path, edit: Any) -> None:
    content = json.loads(path.read_text())
    edit(content)
    path.write_text(json.dumps(content))


def test_get_batch_shapes_and_dtypes(synthetic_root: Path) -> None:
    ds = LeRobotDataset(synthetic_root)
    batch = ds.get_batch(np.array([0, 5, len(ds) - 1]))
    for key in ("observation.state", "observation.environment_state", "action"):
        assert batch[key].shape == (3, 2) and batch[key].dtype == torch.float32
    for key in ("index", "episode_index", "frame_index", "task_index"):
        assert batch[key].shape == (3,) and batch[key].dtype == torch.int64
    assert batch["timestamp"].dtype == torch.float32
    assert batch["index"].tolist() == [0, 5, len(ds) - 1]
    # Each frame's task string, from meta/tasks.parquet (LeRobot's items carry it).
    assert batch["task"] == ["Move the point to the goal."] * 3
    item = ds[5]
    assert item.pop("task") == "Move the point to the goal."
    for key, value in item.items():
        torch.testing.assert_close(value, batch[key][1])
    torch.testing.assert_close(ds[-1]["index"], torch.tensor(len(ds) - 1))
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(IndexError):
        ds.get_batch([0, len(ds)])
    assert ds.stats["action"]["mean"].dtype == np.float32
    assert ds.stats["action"]["std"].shape == (2,)


def test_delta_timestamps_and_padding(synthetic_root: Path, synthetic_params: dict) -> None:
    length, fps = synthetic_params["episode_length"], synthetic_params["fps"]
    chunk = [i / fps for i in range(8)]
    ds = LeRobotDataset(
        synthetic_root, delta_timestamps={"action": chunk, "observation.state": [-0.2, -0.1, 0.0]}
    )
    plain = LeRobotDataset(synthetic_root)
    actions = plain.get_batch(np.arange(len(plain)))["action"]
    states = plain.get_batch(np.arange(len(plain)))["observation.state"]

    # First frame of episode 1: past states clamp to its first frame, actions are in range.
    first = length
    batch = ds.get_batch([first, 2 * length - 3, first + 5])
    assert batch["action"].shape == (3, 8, 2)
    assert batch["observation.state"].shape == (3, 3, 2)
    assert batch["observation.state_is_pad"][0].tolist() == [True, True, False]
    torch.testing.assert_close(batch["observation.state"][0], states[[first] * 3])
    assert not batch["action_is_pad"][0].any()
    torch.testing.assert_close(batch["action"][0], actions[first : first + 8])

    # Three frames before the episode end: later actions clamp to the last frame.
    last = 2 * length - 1
    assert batch["action_is_pad"][1].tolist() == [False] * 3 + [True] * 5
    torch.testing.assert_close(batch["action"][1, :3], actions[last - 2 : last + 1])
    torch.testing.assert_close(batch["action"][1, 3:], actions[[last] * 5])

    # Interior frame: shifted rows, no padding.
    assert not batch["observation.state_is_pad"][2].any()
    torch.testing.assert_close(batch["observation.state"][2], states[first + 3 : first + 6])
    assert batch["action_is_pad"].dtype == torch.bool


@pytest.mark.parametrize(
    ("deltas", "match"),
    [({"action": [0.0, 0.05]}, "multiples of 1/fps"), ({"nope": [0.0]}, "'nope'")],
)
def test_bad_delta_timestamps(synthetic_root: Path, deltas: dict, match: str) -> None:
    with pytest.raises(DatasetError, match=match):
        LeRobotDataset(synthetic_root, delta_timestamps=deltas)


def test_tolerates_float_rounding_in_deltas(synthetic_root: Path) -> None:
    ds = LeRobotDataset(synthetic_root, delta_timestamps={"action": [0.1 + 3e-5, 0.3]})
    assert ds.get_batch([0])["action"].shape == (1, 2, 2)


def test_episode_subset(synthetic_root: Path, synthetic_params: dict) -> None:
    length = synthetic_params["episode_length"]
    ds = LeRobotDataset(synthetic_root, delta_timestamps={"action": [0.0, 0.1]}, episodes=[1, 3])
    assert ds.num_episodes == 2 and len(ds) == 2 * length
    batch = ds.get_batch([length - 1])  # last frame of episode 1 pads into nothing
    assert batch["episode_index"].tolist() == [1]
    assert batch["action_is_pad"].tolist() == [[False, True]]
    with pytest.raises(DatasetError, match=r"\[99\]"):
        LeRobotDataset(synthetic_root, episodes=[1, 99])


def test_loads_several_files_without_episode_metadata(dataset_copy: Path) -> None:
    reference = LeRobotDataset(dataset_copy).get_batch(np.arange(10))
    table = pq.read_table(dataset_copy / DATA_FILE)
    (dataset_copy / DATA_FILE).unlink()
    # Later rows first, in a second chunk folder: the reader sorts by index.
    (dataset_copy / "data/chunk-001").mkdir()
    pq.write_table(table.slice(0, 50), dataset_copy / "data/chunk-001/file-000.parquet")
    pq.write_table(table.slice(50), dataset_copy / "data/chunk-000/file-000.parquet")
    (dataset_copy / EPISODES_FILE).unlink()
    ds = LeRobotDataset(dataset_copy)
    assert len(ds) == table.num_rows
    for key, value in ds.get_batch(np.arange(10)).items():
        if key == "task":
            assert value == reference[key]
            continue
        torch.testing.assert_close(value, reference[key])


def test_refuses_missing_info(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="meta/info.json"):
        LeRobotDataset(tmp_path)


def test_refuses_invalid_json(dataset_copy: Path) -> None:
    (dataset_copy / "meta/info.json").write_text('{\n  "fps": 10,\n  oops\n}')
    with pytest.raises(DatasetError, match=r"info\.json: invalid JSON at line 3, column 3"):
        LeRobotDataset(dataset_copy)


def test_refuses_other_codebase_version(dataset_copy: Path) -> None:
    _edit_json(dataset_copy / "meta/info.json", lambda i: i.update(codebase_version="v2.1"))
    with pytest.raises(DatasetError, match=r"info\.json: codebase_version is 'v2\.1'"):
        LeRobotDataset(dataset_copy)


def test_refuses_missing_stats(dataset_copy: Path) -> None:
    (dataset_copy / "meta/stats.json").unlink()
    with pytest.raises(DatasetError, match=r"meta/stats\.json: not found"):
        LeRobotDataset(dataset_copy)


def test_refuses_statistics_of_the_wrong_shape(dataset_copy: Path) -> None:
    # Missing statistics are the policy's to refuse (tests/training/test_what_lerobot_accepts.py).
    _edit_json(dataset_copy / "meta/stats.json", lambda s: s["action"].update(std=[1.0]))
    with pytest.raises(DatasetError, match=r"stats\.json: action\.std has shape \[1\]"):
        LeRobotDataset(dataset_copy)


def test_refuses_missing_data_file(dataset_copy: Path) -> None:
    (dataset_copy / DATA_FILE).unlink()
    with pytest.raises(DatasetError, match=r"file-000\.parquet: data file .* is missing"):
        LeRobotDataset(dataset_copy)
    (dataset_copy / EPISODES_FILE).unlink()
    with pytest.raises(DatasetError, match=r"data: no data files"):
        LeRobotDataset(dataset_copy)


def test_refuses_feature_missing_from_parquet(dataset_copy: Path) -> None:
    def add_feature(info: dict) -> None:
        info["features"]["observation.velocity"] = {"dtype": "float32", "shape": [2]}

    def add_stats(stats: dict) -> None:
        stats["observation.velocity"] = {k: [0.0, 0.0] for k in ("mean", "std", "min", "max")}

    _edit_json(dataset_copy / "meta/info.json", add_feature)
    _edit_json(dataset_copy / "meta/stats.json", add_stats)
    with pytest.raises(
        DatasetError, match=r"file-000\.parquet: columns \['observation\.velocity'\]"
    ):
        LeRobotDataset(dataset_copy)


def test_resolve_existing_root(synthetic_root: Path) -> None:
    assert resolve_dataset_root(synthetic_root, None) == synthetic_root
    assert resolve_dataset_root(str(synthetic_root), "user/unused") == synthetic_root


def test_resolve_needs_root_or_repo_id(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="--dataset.root or --dataset.repo_id"):
        resolve_dataset_root(None, None)
    with pytest.raises(DatasetError, match="missing.*meta/info.json"):
        resolve_dataset_root(tmp_path / "missing", None)


def test_resolve_download_failure_names_root_and_repo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    def fail(*args: Any, **kwargs: Any) -> str:
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(DatasetError) as excinfo:
        resolve_dataset_root(tmp_path / "absent", "user/my_dataset", revision="main")
    message = str(excinfo.value)
    assert str(tmp_path / "absent") in message
    assert "user/my_dataset" in message and "network is unreachable" in message


def test_resolve_downloads_into_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    calls = []

    def fake_download(repo_id: str, **kwargs: Any) -> str:
        calls.append((repo_id, kwargs))
        return str(write_synthetic_dataset(tmp_path / "cache", num_episodes=1, episode_length=2))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve_dataset_root(None, "user/ds", revision="v1") == tmp_path / "cache"
    (repo_id, kwargs) = calls[0]
    assert repo_id == "user/ds"
    assert kwargs["repo_type"] == "dataset" and kwargs["revision"] == "v1"
    assert kwargs["local_dir"] is None
    assert "data/**" in kwargs["allow_patterns"]
    assert not any("videos" in pattern for pattern in kwargs["allow_patterns"])
