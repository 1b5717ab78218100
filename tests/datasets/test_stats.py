"""lerobot_pipe.datasets.stats: each statistic against a direct numpy computation over the same
frames, and (with LeRobot's venv) against LeRobot 0.6.1's own compute_stats on the same data."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from lerobot_pipe.datasets import stats as S

QUANTILE_NAMES = ("q01", "q10", "q50", "q90", "q99")


def random_columns(seed: int, n: int, dim: int, dtype=np.float64) -> np.ndarray:
    gen = np.random.default_rng(seed)
    return (gen.normal(size=(n, dim)) * [1.0, 10.0, 0.1][:dim] + [0.0, 5.0, -2.0][:dim]).astype(
        dtype
    )


def bin_widths(values: np.ndarray) -> np.ndarray:
    return (values.max(axis=0) - values.min(axis=0) + 2 * S.RANGE_PAD) / S.HISTOGRAM_BINS


def test_vector_stats_are_numpys():
    values = random_columns(0, 1000, 3)
    stats = S.vector_stats(values)
    np.testing.assert_array_equal(stats["min"], values.min(axis=0))
    np.testing.assert_array_equal(stats["max"], values.max(axis=0))
    np.testing.assert_allclose(stats["mean"], values.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], values.std(axis=0), rtol=1e-12)  # ddof 0
    np.testing.assert_array_equal(stats["count"], [1000])
    # A quantile read off the 5000-bin histogram lies in the bin of the sample that numpy's
    # inverted-CDF quantile picks (the first whose cumulative count reaches q * n).
    for name, q in S.QUANTILES.items():
        exact = np.quantile(values, q, axis=0, method="inverted_cdf")
        assert np.all(np.abs(stats[name] - exact) <= bin_widths(values)), name


def test_float32_columns_are_computed_in_float32():
    """float32 in, float32 statistics out (LeRobot's precision). On a grid of quarters every
    float32 sum is exact, so only the last roundings differ from float64: the divisions by n and
    the square of the mean, each within half an epsilon of E[x^2], which the variance
    E[x^2] - E[x]^2 keeps as its absolute error."""
    values = np.round(random_columns(1, 1000, 3) * 4) / 4
    stats = S.vector_stats(values.astype(np.float32))
    assert all(stats[name].dtype == np.float32 for name in ("min", "mean", "std"))
    np.testing.assert_allclose(stats["mean"], values.mean(axis=0), rtol=1e-6)
    bound = 2 * np.finfo(np.float32).eps * (values**2).mean(axis=0)
    assert np.all(np.abs(stats["std"].astype(np.float64) ** 2 - values.var(axis=0)) <= bound)


def test_quantiles_interpolate_within_their_bin():
    """0..1049 in 5000 bins: every value sits alone in its bin. The q-quantile is in the bin of
    value ceil(q * n) - 1, as far into it as q * n exceeds the count of the values below."""
    n = 1050
    stats = S.vector_stats(np.arange(n, dtype=np.float64).reshape(-1, 1))
    edges = np.linspace(-S.RANGE_PAD, n - 1 + S.RANGE_PAD, S.HISTOGRAM_BINS + 1)
    width = edges[1] - edges[0]
    for name, q in S.QUANTILES.items():
        target = q * n  # 10.5, 105, 525, 945, 1039.5
        value = int(np.ceil(target)) - 1
        start = edges[np.searchsorted(edges, value, side="right") - 1]
        expected = start + (target - value) * width
        assert stats[name][0] == pytest.approx(expected, rel=1e-9), name


def test_integer_columns_are_promoted():
    values = np.arange(10, dtype=np.int64).reshape(-1, 1)
    stats = S.feature_stats(values[:, 0])
    assert stats["mean"].dtype == np.float64 and stats["mean"].shape == (1,)
    assert stats["mean"][0] == 4.5 and stats["std"][0] == pytest.approx(np.arange(10).std())


def test_one_frame_has_no_spread():
    stats = S.vector_stats(np.array([[1.5, -2.0]], dtype=np.float32))
    np.testing.assert_array_equal(stats["std"], [0.0, 0.0])
    for name in ("min", "max", "mean", *QUANTILE_NAMES):
        np.testing.assert_array_equal(stats[name], [1.5, -2.0])
    np.testing.assert_array_equal(stats["count"], [1])


def test_a_constant_column_has_its_value_everywhere():
    stats = S.vector_stats(np.full((50, 1), 3.25))
    assert stats["std"][0] == 0.0
    for name in QUANTILE_NAMES:
        assert stats[name][0] == pytest.approx(3.25, abs=1e-9)


@pytest.mark.parametrize(
    "frames, sampled",
    # LeRobot's estimate_num_samples docstring: 100 up to ~500 frames, then len ** 0.75.
    [
        (1, 1),
        (50, 50),
        (100, 100),
        (400, 100),
        (1000, 177),
        (2000, 299),
        (5000, 594),
        (10_000, 1000),
        (20_000, 1681),
    ],
)
def test_camera_frames_sampled_as_lerobot(frames, sampled):
    indices = S.sample_frame_indices(frames)
    assert len(indices) == sampled
    assert indices[0] == 0 and indices[-1] == frames - 1
    assert np.all(np.diff(indices) >= 0)


def test_image_stats_are_per_channel_over_the_sampled_frames():
    """Per channel over every pixel of the sampled frames, in [0, 1]. Pixels below 128 on 2x2
    frames keep every float32 sum (of 400 pixels, and of their squares) an exact integer."""
    gen = np.random.default_rng(1)
    frames = gen.integers(0, 128, size=(150, 2, 2, 3), dtype=np.uint8)
    stats = S.image_stats(frames)
    sampled = frames[S.sample_frame_indices(150)].astype(np.float64) / 255
    assert len(sampled) == 100
    for name, value in stats.items():
        assert value.shape == ((1,) if name == "count" else (3, 1, 1)), name
    np.testing.assert_array_equal(stats["count"], [100])
    np.testing.assert_allclose(stats["mean"][:, 0, 0], sampled.mean(axis=(0, 1, 2)), rtol=1e-6)
    np.testing.assert_allclose(stats["std"][:, 0, 0], sampled.std(axis=(0, 1, 2)), rtol=1e-6)
    np.testing.assert_allclose(stats["min"][:, 0, 0], sampled.min(axis=(0, 1, 2)))
    np.testing.assert_allclose(stats["max"][:, 0, 0], sampled.max(axis=(0, 1, 2)))


def test_large_frames_are_downsampled_before_the_statistics():
    """Frames of 300 pixels or more (either side) are strided down to about 150."""
    frames = np.zeros((2, 320, 200, 3), dtype=np.uint8)
    frames[:, 1::2] = 255  # odd rows white: a stride of 2 keeps the black rows only
    stats = S.image_stats(frames)
    np.testing.assert_array_equal(stats["max"][:, 0, 0], [0.0, 0.0, 0.0])
    small = S.image_stats(frames[:, :298])  # under the threshold: every row counts
    np.testing.assert_allclose(small["mean"][:, 0, 0], [0.5, 0.5, 0.5])


LENGTHS = (7, 30, 1, 120)


def test_aggregate_is_the_statistics_of_all_frames():
    """Per-episode statistics merged in episode order: min, max, mean and std of the frames of
    every episode together, the frame count summed, quantiles the episodes' quantiles weighted by
    their frame counts (LeRobot's aggregation)."""
    episodes = [random_columns(seed, n, 2) for seed, n in enumerate(LENGTHS)]
    per_episode = [{"x": S.feature_stats(values)} for values in episodes]
    total = S.aggregate(per_episode)["x"]
    everything = np.concatenate(episodes)
    np.testing.assert_array_equal(total["min"], everything.min(axis=0))
    np.testing.assert_array_equal(total["max"], everything.max(axis=0))
    np.testing.assert_allclose(total["mean"], everything.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(total["std"], everything.std(axis=0), rtol=1e-10)
    np.testing.assert_array_equal(total["count"], [sum(LENGTHS)])
    counts = np.array(LENGTHS, dtype=np.float64)[:, None]
    for name in QUANTILE_NAMES:
        weighted = (np.stack([s["x"][name] for s in per_episode]) * counts).sum(0) / counts.sum()
        np.testing.assert_allclose(total[name], weighted, rtol=1e-12)


def test_aggregate_keeps_features_of_some_episodes_only():
    first = {"x": S.feature_stats(np.arange(4.0)), "y": S.feature_stats(np.ones(3))}
    second = {"x": S.feature_stats(np.arange(4.0, 8.0))}
    total = S.aggregate([first, second])
    assert total["y"] is first["y"]
    np.testing.assert_array_equal(total["x"]["count"], [8])
    assert total["x"]["mean"][0] == 3.5


def test_to_json_writes_lists():
    data = S.to_json({"x": S.feature_stats(np.arange(4.0))})
    assert json.loads(json.dumps(data))["x"]["count"] == [4]
    assert data["x"]["mean"] == [1.5]


@pytest.mark.interop
@pytest.mark.interop
def test_lerobots_compute_stats_agree(upstream: Callable, tmp_path: Path) -> None:
    """LeRobot's compute_episode_stats and aggregate_stats on the same episodes (numeric columns
    of float32, float64 and int64, a one-frame episode, a constant column, PNG camera frames with
    sampling and downsampling) give the same statistics."""
    from PIL import Image

    gen = np.random.default_rng(2)
    episodes = []
    for e, n in enumerate((3, 1, 140)):
        frames = gen.integers(0, 256, size=(n, 310 if e == 2 else 12, 16, 3), dtype=np.uint8)
        paths = []
        for i, frame in enumerate(frames):
            paths.append(str(tmp_path / f"ep{e}_{i:03d}.png"))
            Image.fromarray(frame).save(paths[-1])
        episodes.append(
            {
                "observation.state": random_columns(e, n, 3, np.float32),
                "timestamp": np.arange(n, dtype=np.float64) / 10,
                "index": np.arange(n, dtype=np.int64),
                "constant": np.full((n, 1), 0.5, dtype=np.float32),
                "observation.images.top": (frames, paths),
            }
        )
    features = {
        "observation.state": {"dtype": "float32", "shape": [3]},
        "timestamp": {"dtype": "float64", "shape": [1]},
        "index": {"dtype": "int64", "shape": [1]},
        "constant": {"dtype": "float32", "shape": [1]},
        "observation.images.top": {"dtype": "image", "shape": [12, 16, 3]},
    }
    camera = "observation.images.top"
    arrays = {
        f"{e}/{key}": value
        for e, ep in enumerate(episodes)
        for key, value in ep.items()
        if key != camera
    }
    np.savez(tmp_path / "episodes.npz", **arrays)
    spec = {
        "episodes": str(tmp_path / "episodes.npz"),
        "num_episodes": len(episodes),
        "features": features,
        "images": {camera: [ep[camera][1] for ep in episodes]},
        "out": str(tmp_path / "lerobot_stats.json"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    upstream("upstream_stats.py", tmp_path / "spec.json")
    theirs = json.loads((tmp_path / "lerobot_stats.json").read_text())

    ours_per_episode = [
        {
            key: S.image_stats(value[0]) if key == camera else S.feature_stats(value)
            for key, value in ep.items()
        }
        for ep in episodes
    ]
    ours = {
        **{f"episode_{e}": S.to_json(stats) for e, stats in enumerate(ours_per_episode)},
        "aggregated": S.to_json(S.aggregate(ours_per_episode)),
    }
    assert ours.keys() == theirs.keys()
    for part, features_stats in theirs.items():
        assert ours[part].keys() == features_stats.keys(), part
        for key, stats in features_stats.items():
            assert ours[part][key].keys() == stats.keys(), (part, key)
            for name, value in stats.items():
                np.testing.assert_allclose(
                    ours[part][key][name],
                    value,
                    rtol=1e-6,
                    atol=1e-12,
                    err_msg=f"{part} {key}.{name}",
                )
