"""Feature statistics computed as LeRobot computes them, so that stats.json files agree.

LeRobot computes each episode's statistics on its own (quantiles read off a 5000-bin histogram
spanning the episode's range) and merges episodes pairwise in recording order: means and
variances by the parallel formula, quantiles as frame-count-weighted means of the episodes'
quantiles. Camera statistics are per channel over the pixels of (a sample of) the episode's
frames, scaled to [0, 1] and shaped (3, 1, 1).
"""

from __future__ import annotations

import numpy as np

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
HISTOGRAM_BINS = 5000
# Padding of the histogram's range, so its end values fall inside it.
RANGE_PAD = 1e-10
# Frames sampled per episode for camera statistics: all up to MIN, then grows as len**POWER.
SAMPLE_MIN, SAMPLE_MAX, SAMPLE_POWER = 100, 10_000, 0.75
# Frames larger than this (either side) are subsampled before the camera statistics.
DOWNSAMPLE_ABOVE, DOWNSAMPLE_TARGET = 300, 150

Stats = dict[str, np.ndarray]


def _quantile(hist: np.ndarray, edges: np.ndarray, target: float) -> float:
    cumsum = np.cumsum(hist)
    i = int(np.searchsorted(cumsum, target))
    if i == 0:
        return edges[0]
    if i >= len(cumsum):
        return edges[-1]
    before = cumsum[i - 1]
    inside = cumsum[i] - before
    if inside == 0:
        return edges[i]
    return edges[i] + (target - before) / inside * (edges[i + 1] - edges[i])


def vector_stats(values: np.ndarray) -> Stats:
    """Statistics over axis 0 of ``(n, dim)`` values (one episode)."""
    values = values.astype(np.result_type(values.dtype, np.float32), copy=False)
    n = len(values)
    if n < 2:
        mean = values.mean(axis=0)
        stats = {
            "min": values.min(axis=0),
            "max": values.max(axis=0),
            "mean": mean,
            "std": values.std(axis=0),
            "count": np.array([n]),
        }
        return stats | {name: mean.copy() for name in QUANTILES}
    low, high = values.min(axis=0), values.max(axis=0)
    mean = values.mean(axis=0)
    variance = (values**2).mean(axis=0) - mean**2
    stats = {
        "min": low,
        "max": high,
        "mean": mean,
        "std": np.sqrt(np.maximum(0, variance)),
        "count": np.array([n]),
    }
    quantiles: dict[str, list[float]] = {name: [] for name in QUANTILES}
    for d in range(values.shape[1]):
        edges = np.linspace(low[d] - RANGE_PAD, high[d] + RANGE_PAD, HISTOGRAM_BINS + 1)
        hist = np.histogram(values[:, d], bins=edges)[0].astype(np.float64)
        for name, q in QUANTILES.items():
            quantiles[name].append(_quantile(hist, edges, q * n))
    return stats | {name: np.array(v) for name, v in quantiles.items()}


def sample_frame_indices(num_frames: int) -> np.ndarray:
    """The frames of an episode that LeRobot's camera statistics look at."""
    floor = min(SAMPLE_MIN, num_frames)
    count = max(floor, min(int(num_frames**SAMPLE_POWER), SAMPLE_MAX))
    return np.round(np.linspace(0, num_frames - 1, count)).astype(int)


def image_stats(frames: np.ndarray) -> Stats:
    """Per-channel statistics in [0, 1], shaped (3, 1, 1), of uint8 ``(n, H, W, 3)`` frames."""
    sampled = frames[sample_frame_indices(len(frames))]
    height, width = sampled.shape[1:3]
    if max(height, width) >= DOWNSAMPLE_ABOVE:
        step = int(max(height, width) / DOWNSAMPLE_TARGET)
        sampled = sampled[:, ::step, ::step]
    stats = vector_stats(sampled.reshape(-1, sampled.shape[-1]))
    stats = {
        name: value if name == "count" else (value.reshape(-1, 1, 1) / 255.0)
        for name, value in stats.items()
    }
    stats["count"] = np.array([len(sampled)])
    return stats


def feature_stats(values: np.ndarray) -> Stats:
    """One episode's statistics of a numeric column (``(n,)`` or ``(n, dim)``)."""
    return vector_stats(values.reshape(len(values), -1))


def merge_stats(a: Stats, b: Stats) -> Stats:
    """Statistics of two sets of frames from the statistics of each."""
    parts = (a, b)
    means = np.stack([s["mean"] for s in parts])
    counts = np.stack([s["count"] for s in parts])
    total = counts.sum(axis=0)
    while counts.ndim < means.ndim:
        counts = np.expand_dims(counts, axis=-1)
    mean = (means * counts).sum(axis=0) / total
    variances = np.stack([s["std"] ** 2 for s in parts])
    variance = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
    merged = {
        "min": np.min(np.stack([s["min"] for s in parts]), axis=0),
        "max": np.max(np.stack([s["max"] for s in parts]), axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": total,
    }
    for name in QUANTILES:
        if name in a and name in b:
            merged[name] = (np.stack([a[name], b[name]]) * counts).sum(axis=0) / total
    return merged


def aggregate(episodes: list[dict[str, Stats]]) -> dict[str, Stats]:
    """Dataset statistics from per-episode statistics, merged in episode order."""
    total: dict[str, Stats] = {}
    for episode in episodes:
        for key, stats in episode.items():
            total[key] = merge_stats(total[key], stats) if key in total else stats
    return total


def to_json(stats: dict[str, Stats]) -> dict[str, dict[str, list]]:
    return {
        key: {name: np.asarray(value).tolist() for name, value in feature.items()}
        for key, feature in stats.items()
    }
