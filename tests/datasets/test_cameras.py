"""Camera features of the reader: decoding, windows, images, stats, and broken video files."""

import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_pipe.datasets import DatasetError, LeRobotDataset
from lerobot_pipe.datasets.synthetic import _rollout, render

TOP = "observation.images.top"
WRIST = "observation.images.wrist"
VIDEO = "videos/observation.images.top/chunk-000/file-000.mp4"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
BACKENDS = ["torchcodec", "pyav"]


def _encoded_frames(params: dict, view: str) -> np.ndarray:
    """The frames the synthetic writer encoded, uint8 (N, 3, H, W)."""
    n, length = params["num_episodes"], params["episode_length"]
    columns, goals = _rollout(n, length, params["fps"], params["seed"])
    agent = columns["observation.state"]
    frames = render(view, agent, np.repeat(goals, length, axis=0), params["image_size"])
    return frames.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_video_items_are_float_chw_in_unit_range(camera_root: Path, backend: str) -> None:
    ds = LeRobotDataset(camera_root, video_backend=backend)
    assert ds.video_backend == backend and ds.camera_keys == [TOP, WRIST]
    batch = ds.get_batch([0, 7, len(ds) - 1])
    for key in (TOP, WRIST):
        assert batch[key].shape == (3, 3, 64, 64) and batch[key].dtype == torch.float32
        assert batch[key].min() >= 0.0 and batch[key].max() <= 1.0
    raw = ds.get_batch([0, 7, len(ds) - 1], raw_cameras=True)
    assert raw[TOP].dtype == torch.uint8
    torch.testing.assert_close(raw[TOP].float() / 255, batch[TOP], rtol=0, atol=0)
    torch.testing.assert_close(ds[7][WRIST], batch[WRIST][1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_smooth_frames_survive_encoding(camera_root: Path, camera_params: dict, backend: str):
    ds = LeRobotDataset(camera_root, video_backend=backend)
    decoded = ds.get_batch(np.arange(len(ds)), raw_cameras=True)
    for key, view in ((TOP, "top"), (WRIST, "wrist")):
        error = np.abs(decoded[key].numpy().astype(float) - _encoded_frames(camera_params, view))
        assert error.mean() / 255 < 0.01, (key, error.mean() / 255)


def test_backends_decode_the_same_frames(camera_root: Path) -> None:
    rows = np.random.default_rng(0).permutation(80)[:40]
    one = LeRobotDataset(camera_root, video_backend="torchcodec").get_batch(rows, raw_cameras=True)
    two = LeRobotDataset(camera_root, video_backend="pyav").get_batch(rows, raw_cameras=True)
    for key in (TOP, WRIST):
        torch.testing.assert_close(one[key], two[key], rtol=0, atol=0)


@pytest.mark.parametrize("root_name", ["camera_root", "image_root"])
def test_camera_windows_clamp_to_the_episode(root_name: str, request, camera_params: dict):
    root = request.getfixturevalue(root_name)
    length = camera_params["episode_length"]
    ds = LeRobotDataset(root, delta_timestamps={TOP: [-0.2, -0.1, 0.0], "action": [0.0, 0.1]})
    plain = LeRobotDataset(root)
    first, last = length, 2 * length - 1  # first and last frame of episode 1
    batch = ds.get_batch([first, first + 5, last], raw_cameras=True)
    single = plain.get_batch(np.arange(len(plain)), raw_cameras=True)[TOP]
    assert batch[TOP].shape == (3, 3, 3, 64, 64)
    assert batch[f"{TOP}_is_pad"].tolist() == [[True, True, False], [False] * 3, [False] * 3]
    torch.testing.assert_close(batch[TOP][0], single[[first] * 3])
    torch.testing.assert_close(batch[TOP][1], single[first + 3 : first + 6])
    torch.testing.assert_close(batch[TOP][2], single[last - 2 : last + 1])
    assert batch[WRIST].shape == (3, 3, 64, 64)  # no window asked for this camera
    assert ds.get_batch([first])[TOP].dtype == torch.float32


def test_image_features_hold_the_exact_frames(image_root: Path, camera_params: dict) -> None:
    info = json.loads((image_root / "meta/info.json").read_text())
    assert info["features"][TOP]["dtype"] == "image" and info["video_path"] is None
    schema = pq.read_schema(image_root / "data/chunk-000/file-000.parquet")
    assert str(schema.field(TOP).type) == "struct<bytes: binary, path: string>"
    assert json.loads(schema.metadata[b"huggingface"])["info"]["features"][TOP] == {
        "_type": "Image"
    }
    ds = LeRobotDataset(image_root)
    assert ds.video_keys == [] and ds.image_keys == [TOP, WRIST]
    batch = ds.get_batch(np.arange(len(ds)), raw_cameras=True)
    for key, view in ((TOP, "top"), (WRIST, "wrist")):  # PNG is lossless
        np.testing.assert_array_equal(batch[key].numpy(), _encoded_frames(camera_params, view))
    subset = LeRobotDataset(image_root, episodes=[2]).get_batch([0], raw_cameras=True)
    torch.testing.assert_close(subset[TOP][0], batch[TOP][2 * camera_params["episode_length"]])


def test_imagenet_stats_replace_camera_mean_and_std(camera_root: Path) -> None:
    stored = json.loads((camera_root / "meta/stats.json").read_text())[TOP]
    own = LeRobotDataset(camera_root, use_imagenet_stats=False).stats[TOP]
    for name in ("mean", "std", "min", "max", "q50"):
        assert own[name].shape == (3, 1, 1)
        np.testing.assert_allclose(own[name], np.asarray(stored[name], np.float32))
    assert own["min"].min() >= 0 and own["max"].max() <= 1
    imagenet = LeRobotDataset(camera_root).stats[TOP]
    np.testing.assert_allclose(imagenet["mean"].ravel(), [0.485, 0.456, 0.406], rtol=1e-6)
    np.testing.assert_allclose(imagenet["std"].ravel(), [0.229, 0.224, 0.225], rtol=1e-6)
    assert imagenet["mean"].shape == imagenet["std"].shape == (3, 1, 1)
    np.testing.assert_allclose(imagenet["max"], own["max"])  # only mean and std change


def _shift_episode(root: Path, episode: int, seconds: float) -> None:
    table = pq.read_table(root / EPISODES_FILE)
    column = f"videos/{TOP}/from_timestamp"
    values = table[column].to_numpy().copy()
    values[episode] += seconds
    index = table.schema.get_field_index(column)
    pq.write_table(table.set_column(index, column, [values]), root / EPISODES_FILE)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shifted_frames_fail_with_file_episode_and_time(
    camera_root: Path, camera_copy: Path, backend: str
) -> None:
    _shift_episode(camera_copy, 2, 0.04)  # 0.4 frame: the nearest frame is 0.04 s away
    ds = LeRobotDataset(camera_copy, video_backend=backend)
    ds.get_batch([0, 20, 79])  # other episodes are fine
    with pytest.raises(DatasetError) as excinfo:
        ds.get_batch([10, 45])
    message = str(excinfo.value)
    assert str(camera_copy / VIDEO) in message and "episode 2" in message
    assert "tolerance_s=0.0001" in message and "timestamp 0.500000 s" in message
    assert "--tolerance_s" in message
    # Within a looser tolerance the nearest frame is used: the one the row had before.
    loose = LeRobotDataset(camera_copy, video_backend=backend, tolerance_s=0.05)
    clean = LeRobotDataset(camera_root, video_backend=backend)
    torch.testing.assert_close(
        loose.get_batch([45], raw_cameras=True)[TOP], clean.get_batch([45], raw_cameras=True)[TOP]
    )


def test_missing_mp4_fails_at_open(camera_copy: Path) -> None:
    (camera_copy / VIDEO).unlink()
    with pytest.raises(DatasetError) as excinfo:
        LeRobotDataset(camera_copy)
    message = str(excinfo.value)
    assert str(camera_copy / VIDEO) in message and "is missing" in message
    assert "--dataset.repo_id" in message and "[0, 1, 2, 3]" in message


def test_corrupt_mp4_fails_at_open(camera_copy: Path) -> None:
    size = (camera_copy / VIDEO).stat().st_size
    (camera_copy / VIDEO).write_bytes(np.random.default_rng(0).bytes(size))
    with pytest.raises(DatasetError) as excinfo:
        LeRobotDataset(camera_copy)
    message = str(excinfo.value)
    assert str(camera_copy / VIDEO) in message and "corrupt" in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncated_mp4_fails_at_open(camera_copy: Path, backend: str) -> None:
    video = camera_copy / VIDEO
    video.write_bytes(video.read_bytes()[: video.stat().st_size * 2 // 3])
    with pytest.raises(DatasetError) as excinfo:
        LeRobotDataset(camera_copy, video_backend=backend)
    message = str(excinfo.value)
    assert str(video) in message and "truncated" in message and "episode 3" in message


def test_episodes_beyond_the_video_fail_at_open(camera_copy: Path) -> None:
    table = pq.read_table(camera_copy / EPISODES_FILE)
    column = f"videos/{TOP}/to_timestamp"
    values = table[column].to_numpy().copy()
    values[-1] += 1.0
    index = table.schema.get_field_index(column)
    pq.write_table(table.set_column(index, column, [values]), camera_copy / EPISODES_FILE)
    with pytest.raises(DatasetError, match=r"holds 80 frames .* episode 3 ends at 9\.000 s"):
        LeRobotDataset(camera_copy)


def test_backend_choice_falls_back_and_is_logged(
    camera_root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="lerobot_pipe.datasets.video"):
        assert LeRobotDataset(camera_root).video_backend == "torchcodec"  # LeRobot's default
    assert "decoding videos with torchcodec" in caplog.text
    monkeypatch.setitem(sys.modules, "torchcodec", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lerobot_pipe.datasets.video"):
        ds = LeRobotDataset(camera_root, video_backend="torchcodec")
    assert ds.video_backend == "pyav"
    assert "'torchcodec' does not load here; decoding videos with pyav instead" in caplog.text
    assert ds.get_batch([3])[TOP].shape == (1, 3, 64, 64)
    with pytest.raises(DatasetError, match=r"video_backend='opencv' .*--dataset\.video_backend"):
        LeRobotDataset(camera_root, video_backend="opencv")


def test_camera_stats_of_another_shape_are_refused(camera_copy: Path) -> None:
    stats = json.loads((camera_copy / "meta/stats.json").read_text())
    stats[TOP]["mean"] = [0.5, 0.5]
    (camera_copy / "meta/stats.json").write_text(json.dumps(stats))
    with pytest.raises(
        DatasetError, match=r"camera observation\.images\.top\.mean has shape \[2\]"
    ):
        LeRobotDataset(camera_copy)


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling API")
def test_encoding_keeps_the_callers_scheduling_policy(tmp_path: Path) -> None:
    """SVT-AV1 run as root makes the encoding thread SCHED_FIFO 99, which every process it then
    starts would inherit (a busy real-time trainer starves the machine)."""
    from lerobot_pipe.datasets.video import encode_episode

    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    frames = np.zeros((3, 32, 32, 3), dtype=np.uint8)
    encode_episode(frames, tmp_path / "episode.mp4", fps=10)
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
