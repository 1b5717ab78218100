import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from lerobot_pipe.constants import DATASET_CODEBASE_VERSION
from lerobot_pipe.datasets import DatasetError, LeRobotDataset, write_synthetic_dataset

VECTOR_KEYS = ["observation.state", "observation.environment_state", "action"]


def _data(root: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(root / "data/chunk-000/file-000.parquet")
    return {name: np.array(table[name].to_pylist()) for name in table.column_names}


def test_reader_opens_written_dataset(
    synthetic_root: Path, synthetic_params: dict[str, int]
) -> None:
    num_episodes, length, fps = (
        synthetic_params[k] for k in ("num_episodes", "episode_length", "fps")
    )
    ds = LeRobotDataset(synthetic_root)
    assert len(ds) == ds.num_frames == num_episodes * length
    assert ds.num_episodes == num_episodes
    assert ds.fps == fps
    item = ds[0]
    for key in VECTOR_KEYS:
        assert item[key].shape == (2,)
    assert (synthetic_root / "README.md").is_file()


def test_info_matches_data(synthetic_root: Path, synthetic_params: dict[str, int]) -> None:
    num_episodes, length = synthetic_params["num_episodes"], synthetic_params["episode_length"]
    info = json.loads((synthetic_root / "meta/info.json").read_text())
    data = _data(synthetic_root)
    assert info["codebase_version"] == DATASET_CODEBASE_VERSION
    assert info["robot_type"] == "synthetic_point2d"
    assert info["total_frames"] == len(data["index"]) == num_episodes * length
    assert info["total_episodes"] == num_episodes
    assert info["total_tasks"] == 1
    assert info["chunks_size"] == 1000
    assert info["splits"] == {"train": f"0:{num_episodes}"}
    assert info["video_path"] is None
    assert info["data_path"].format(chunk_index=0, file_index=0) == (
        "data/chunk-000/file-000.parquet"
    )
    assert set(info["features"]) == set(data)
    for key, feature in info["features"].items():
        assert data[key].shape[1:] == tuple(feature["shape"]) or feature["shape"] == [1]
    schema = pq.read_schema(synthetic_root / "data/chunk-000/file-000.parquet")
    assert str(schema.field("timestamp").type) == "float"
    assert str(schema.field("index").type) == "int64"
    # LeRobot's vector columns: fixed-size lists, with the Hugging Face features alongside.
    assert str(schema.field("action").type) == "fixed_size_list<element: float>[2]"
    hf = json.loads(schema.metadata[b"huggingface"])["info"]["features"]
    assert hf["action"] == {
        "feature": {"dtype": "float32", "_type": "Value"},
        "length": 2,
        "_type": "List",
    }
    assert hf["timestamp"] == {"dtype": "float32", "_type": "Value"}


def test_stats_match_data(synthetic_root: Path) -> None:
    stats = json.loads((synthetic_root / "meta/stats.json").read_text())
    episodes = pd.read_parquet(synthetic_root / "meta/episodes/chunk-000/file-000.parquet")
    data = _data(synthetic_root)
    for key, values in data.items():
        values = values.reshape(len(values), -1).astype(np.float64)
        np.testing.assert_allclose(stats[key]["mean"], values.mean(0), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(stats[key]["std"], values.std(0), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(stats[key]["min"], values.min(0))
        np.testing.assert_allclose(stats[key]["max"], values.max(0))
        assert stats[key]["count"] == [len(values)]
        # LeRobot's quantiles: the frame-weighted mean of the episodes' quantiles, each read
        # off a histogram of the episode (so within a bin of the episode's exact quantile).
        counts = np.stack(episodes[f"stats/{key}/count"].to_numpy()).astype(np.float64)
        for name, q in (("q01", 0.01), ("q10", 0.1), ("q50", 0.5), ("q90", 0.9), ("q99", 0.99)):
            per_episode = np.stack(episodes[f"stats/{key}/{name}"].to_numpy())
            weighted = (per_episode * counts).sum(0) / counts.sum()
            np.testing.assert_allclose(stats[key][name], weighted, rtol=1e-9, atol=1e-12)
            for e, row in enumerate(episodes.itertuples()):
                rows = values[row.dataset_from_index : row.dataset_to_index]
                span = rows.max(0) - rows.min(0)
                exact = np.quantile(rows, q, axis=0, method="inverted_cdf")
                assert np.all(np.abs(per_episode[e] - exact) <= span / 5000 + 1e-6), (key, name)


def test_episodes_and_tasks_metadata(
    synthetic_root: Path, synthetic_params: dict[str, int]
) -> None:
    num_episodes, length = synthetic_params["num_episodes"], synthetic_params["episode_length"]
    episodes = pd.read_parquet(synthetic_root / "meta/episodes/chunk-000/file-000.parquet")
    data = _data(synthetic_root)
    assert episodes["episode_index"].tolist() == list(range(num_episodes))
    assert (episodes["length"] == length).all()
    assert list(episodes["tasks"].iloc[0]) == ["Move the point to the goal."]
    for row in episodes.itertuples():
        rows = slice(row.dataset_from_index, row.dataset_to_index)
        assert (data["episode_index"][rows] == row.episode_index).all()
    mean = np.stack(episodes["stats/action/mean"].to_numpy())
    np.testing.assert_allclose(
        mean[2], data["action"][2 * length : 3 * length].mean(0), rtol=1e-6, atol=1e-7
    )
    tasks = pd.read_parquet(synthetic_root / "meta/tasks.parquet")
    assert tasks.loc["Move the point to the goal.", "task_index"] == 0


def test_expert_reaches_goal_with_bounded_speed(
    synthetic_root: Path, synthetic_params: dict[str, int]
) -> None:
    length, fps = synthetic_params["episode_length"], synthetic_params["fps"]
    data = _data(synthetic_root)
    state, goal, action = (data[key] for key in VECTOR_KEYS)
    step = np.linalg.norm(action - state, axis=1)
    assert step.max() < 1.0 / fps + 0.05
    last = data["frame_index"] == length - 1
    first = data["frame_index"] == 0
    assert (
        np.linalg.norm(state[last] - goal[last], axis=1).mean()
        < np.linalg.norm(state[first] - goal[first], axis=1).mean()
    )
    # The agent tracks its command: next state == previous action within an episode.
    same_episode = data["episode_index"][1:] == data["episode_index"][:-1]
    np.testing.assert_array_equal(state[1:][same_episode], action[:-1][same_episode])


def test_deterministic_and_seed_dependent(tmp_path: Path) -> None:
    a = write_synthetic_dataset(tmp_path / "a", num_episodes=2, episode_length=5, seed=1)
    b = write_synthetic_dataset(tmp_path / "b", num_episodes=2, episode_length=5, seed=1)
    c = write_synthetic_dataset(tmp_path / "c", num_episodes=2, episode_length=5, seed=2)
    np.testing.assert_array_equal(_data(a)["action"], _data(b)["action"])
    assert not np.array_equal(_data(a)["action"], _data(c)["action"])


def test_idempotent_refuse_and_overwrite(tmp_path: Path) -> None:
    root = write_synthetic_dataset(tmp_path / "ds", num_episodes=2, episode_length=5)
    info = root / "meta/info.json"
    mtime = info.stat().st_mtime_ns
    assert write_synthetic_dataset(root, num_episodes=2, episode_length=5) == root
    assert info.stat().st_mtime_ns == mtime  # same parameters: nothing rewritten

    with pytest.raises(DatasetError, match="overwrite=True"):
        write_synthetic_dataset(root, num_episodes=3, episode_length=5)
    write_synthetic_dataset(root, num_episodes=3, episode_length=5, overwrite=True)
    assert LeRobotDataset(root).num_episodes == 3

    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("user data")
    with pytest.raises(DatasetError, match="other"):
        write_synthetic_dataset(other)
    assert (other / "keep.txt").read_text() == "user data"

    empty = tmp_path / "empty"
    empty.mkdir()
    write_synthetic_dataset(empty, num_episodes=1, episode_length=3)
    assert LeRobotDataset(empty).num_frames == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "empty", "other"]


def test_camera_dataset_metadata(camera_root: Path, camera_params: dict) -> None:
    info = json.loads((camera_root / "meta/info.json").read_text())
    size, fps = camera_params["image_size"], camera_params["fps"]
    assert info["video_path"] == (
        "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    )
    top = info["features"]["observation.images.top"]
    assert top["dtype"] == "video" and top["shape"] == [size, size, 3]
    assert top["names"] == ["height", "width", "channels"]
    expected = {
        "video.height": size,
        "video.width": size,
        "video.codec": "av1",
        "video.pix_fmt": "yuv420p",
        "video.fps": fps,
        "video.channels": 3,
        "has_audio": False,
        "video.g": 2,
        "video.crf": 30,
        "is_depth_map": False,  # the key LeRobot 0.6.1 writes (no "video." prefix)
    }
    assert expected.items() <= top["info"].items()
    episodes = pd.read_parquet(camera_root / "meta/episodes/chunk-000/file-000.parquet")
    length = camera_params["episode_length"]
    for key in ("observation.images.top", "observation.images.wrist"):
        assert (episodes[f"videos/{key}/chunk_index"] == 0).all()
        assert (episodes[f"videos/{key}/file_index"] == 0).all()
        starts = episodes[f"videos/{key}/from_timestamp"].to_numpy()
        np.testing.assert_allclose(starts, np.arange(len(episodes)) * length / fps)
        np.testing.assert_allclose(episodes[f"videos/{key}/to_timestamp"], starts + length / fps)
        video = camera_root / f"videos/{key}/chunk-000/file-000.mp4"
        assert video.is_file()
    stats = json.loads((camera_root / "meta/stats.json").read_text())["observation.images.top"]
    for name in ("mean", "std", "min", "max", "q01", "q50", "q99"):
        value = np.asarray(stats[name])
        assert value.shape == (3, 1, 1) and value.min() >= 0 and value.max() <= 1, name
    assert stats["count"] == [camera_params["num_episodes"] * length]


def test_pixels_only_variant_hides_the_goal(tmp_path: Path) -> None:
    from lerobot_pipe.scripts.cli import main

    root = tmp_path / "pixels"
    assert (
        main(
            [
                "make-dataset",
                f"--root={root}",
                "--num_episodes=2",
                "--episode_length=5",
                "--cameras=top",
                "--pixels_only=true",
            ]
        )
        == 0
    )
    info = json.loads((root / "meta/info.json").read_text())
    assert "observation.environment_state" not in info["features"]
    assert {"observation.state", "action", "observation.images.top"} <= set(info["features"])
    ds = LeRobotDataset(root)
    assert "observation.environment_state" not in ds.get_batch([0])
    with pytest.raises(ValueError, match="pixels_only needs at least one camera"):
        write_synthetic_dataset(tmp_path / "bad", pixels_only=True)
    with pytest.raises(ValueError, match=r"cameras \['side'\]"):
        write_synthetic_dataset(tmp_path / "bad", cameras=["side"])


def test_default_has_no_camera(tmp_path: Path) -> None:
    root = write_synthetic_dataset(tmp_path / "plain", num_episodes=1, episode_length=2)
    features = json.loads((root / "meta/info.json").read_text())["features"]
    assert not [k for k, ft in features.items() if ft["dtype"] in ("video", "image")]
    assert not (root / "videos").exists()
