"""Datasets against LeRobot's own code (a released lerobot in its own venv, run as a subprocess):
our writer writes what LeRobot's writer writes from the same frames, and we decode exactly the
frames LeRobot decodes, from files LeRobot wrote and from ours, with either backend."""

import json
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

from lerobot_pipe.datasets import LeRobotDataset
from lerobot_pipe.datasets.synthetic import _rollout, render
from lerobot_pipe.datasets.writer import DatasetWriter, camera_feature

pytestmark = pytest.mark.interop

NUMERIC = ("observation.state", "action")
CAMERAS = {"observation.images.top": "top", "observation.images.wrist": "wrist"}
LENGTHS = [12, 9, 14]
TASKS = ["reach", "reach again", "reach"]
TABLES = [
    "data/chunk-000/file-000.parquet",
    "meta/tasks.parquet",
    "meta/episodes/chunk-000/file-000.parquet",
]
BACKENDS = ("torchcodec", "pyav")


@pytest.fixture(scope="module")
def episodes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Episode data (numeric columns and camera frames) both writers record."""
    columns, goals = _rollout(len(LENGTHS), max(LENGTHS), 10, 11)
    keep = np.concatenate([e * max(LENGTHS) + np.arange(n) for e, n in enumerate(LENGTHS)])
    agent = columns["observation.state"][keep]
    goal = np.repeat(goals, LENGTHS, axis=0)
    arrays = {key: columns[key][keep] for key in NUMERIC}
    for key, view in CAMERAS.items():
        arrays[f"camera:{key}"] = render(view, agent, goal, 64)
    path = tmp_path_factory.mktemp("episodes") / "episodes.npz"
    np.savez(path, lengths=np.array(LENGTHS), tasks=np.array(TASKS), **arrays)
    return path


def _write_ours(source: Path, root: Path, dtype: str) -> Path:
    data = np.load(source)
    features = {key: {"dtype": "float32", "shape": [2], "names": ["x", "y"]} for key in NUMERIC}
    features |= {key: camera_feature(dtype, 64, 64) for key in CAMERAS}
    writer = DatasetWriter(root, 10, features, robot_type="synthetic_point2d")
    start = 0
    for length, task in zip(LENGTHS, TASKS, strict=True):
        rows = slice(start, start + length)
        writer.add_episode(
            {key: data[key][rows] for key in NUMERIC},
            task,
            {key: data[f"camera:{key}"][rows] for key in CAMERAS},
        )
        start += length
    writer.finish()
    return root


@pytest.fixture(scope="module", params=["video", "image"])
def written(request, episodes: Path, upstream: Callable, tmp_path_factory) -> tuple[Path, Path]:
    """(ours, LeRobot's) datasets written from ``episodes`` with cameras of dtype ``param``."""
    folder = tmp_path_factory.mktemp(f"written-{request.param}")
    upstream("upstream_write.py", episodes, folder / "lerobot", request.param)
    return _write_ours(episodes, folder / "ours", request.param), folder / "lerobot"


def _hf_features(schema) -> dict:
    return json.loads(schema.metadata[b"huggingface"])["info"]["features"]


def test_writer_writes_what_lerobot_writes(written: tuple[Path, Path]) -> None:
    ours, lerobot = written
    for name in TABLES:
        mine, theirs = pq.read_schema(ours / name), pq.read_schema(lerobot / name)
        assert mine.remove_metadata() == theirs.remove_metadata(), name
        assert set(mine.metadata or {}) == set(theirs.metadata or {}), name
        if b"huggingface" in (theirs.metadata or {}):
            assert _hf_features(mine) == _hf_features(theirs)
        files = (pq.ParquetFile(ours / name), pq.ParquetFile(lerobot / name))
        assert files[0].metadata.num_row_groups == files[1].metadata.num_row_groups, name
        a, b = pq.read_table(ours / name).to_pydict(), pq.read_table(lerobot / name).to_pydict()
        for column, expected in b.items():
            if column.startswith("stats/"):
                np.testing.assert_allclose(
                    np.asarray(a[column], float),
                    np.asarray(expected, float),
                    rtol=1e-6,
                    err_msg=column,
                )
            elif column not in ("observation.images.top", "observation.images.wrist"):
                assert a[column] == expected, (name, column)
    assert json.loads((ours / "meta/info.json").read_text()) == json.loads(
        (lerobot / "meta/info.json").read_text()
    )
    mine = json.loads((ours / "meta/stats.json").read_text())
    theirs = json.loads((lerobot / "meta/stats.json").read_text())
    assert mine.keys() == theirs.keys()
    for key, stats in theirs.items():
        assert mine[key].keys() == stats.keys()
        for name, value in stats.items():
            np.testing.assert_allclose(mine[key][name], value, rtol=1e-6, err_msg=f"{key}.{name}")


def test_videos_are_laid_out_as_lerobots(written: tuple[Path, Path]) -> None:
    ours, lerobot = written
    assert (ours / "videos").exists() == (lerobot / "videos").exists()  # not for image cameras
    for key in CAMERAS if (lerobot / "videos").exists() else ():
        files = [root / f"videos/{key}/chunk-000/file-000.mp4" for root in (ours, lerobot)]
        layouts = []
        for path in files:
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                packets = [p for p in container.demux(stream) if p.dts is not None]
                layouts.append(
                    (
                        stream.time_base,
                        stream.frames,
                        stream.duration,
                        stream.average_rate,
                        stream.codec_context.name,
                        stream.codec_context.pix_fmt,
                        [(p.pts, p.is_keyframe) for p in packets],
                    )
                )
        assert layouts[0] == layouts[1]


INDICES = [0, 1, 5, 11, 12, 20, 21, 34]


@pytest.fixture(scope="module")
def lerobot_frames(written: tuple[Path, Path], upstream: Callable, tmp_path_factory) -> dict:
    """LeRobot's decode of ``INDICES`` of (ours, LeRobot's) datasets, keyed ``<0|1>/<backend>/<key>``."""
    out = tmp_path_factory.mktemp("frames") / "frames.npz"
    backends = BACKENDS if (written[1] / "videos").exists() else BACKENDS[:1]
    upstream("upstream_frames.py", out, ",".join(backends), ",".join(map(str, INDICES)), *written)
    return dict(np.load(out))


@pytest.mark.parametrize("writer", [0, 1], ids=["ours", "lerobot"])
def test_frames_equal_lerobots_decode(
    written: tuple[Path, Path], writer: int, lerobot_frames: dict
) -> None:
    root = written[writer]
    # PNG frames do not go through a video backend.
    backends = BACKENDS if (root / "videos").exists() else BACKENDS[:1]
    for backend in backends:
        items = LeRobotDataset(root, video_backend=backend).get_batch(INDICES)
        for key in CAMERAS:
            for lerobot_backend in backends:
                theirs = lerobot_frames[f"{writer}/{lerobot_backend}/{key}"] / np.float32(255)
                assert np.abs(items[key].numpy() - theirs).max() <= 1 / 255, (backend, key)
