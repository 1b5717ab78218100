"""``eval_info.json`` in LeRobot 0.6.1's layout, plus each episode's seed.

    {"per_task": [{"task_group", "task_id", "metrics": {"sum_rewards", "max_rewards",
                   "successes", "video_paths", "predicted_video_paths", "seeds"}}],
     "per_group": {group: {"avg_sum_reward", "avg_max_reward", "pc_success", "n_episodes",
                           "video_paths", "predicted_video_paths"}},
     "overall": {... the same, plus "eval_s", "eval_ep_s"}}

Lists run in episode order. ``seeds`` (per task) is ours: LeRobot keeps the seeds only in memory.
Aggregates are LeRobot's: means ignoring NaN, ``pc_success`` = 100 x the mean success.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from lerobot_pipe.evaluation.rollout import EpisodeResult
from lerobot_pipe.fsutil import write_json_atomic


def _mean(values: list) -> float:
    return float(np.nanmean(np.array(values, dtype=float))) if values else math.nan


def task_metrics(episodes: dict[int, EpisodeResult], video_paths: list[str]) -> dict[str, Any]:
    ordered = [episodes[i] for i in sorted(episodes)]
    return {
        "sum_rewards": [r.sum_reward for r in ordered],
        "max_rewards": [r.max_reward for r in ordered],
        "successes": [r.success for r in ordered],
        "video_paths": list(video_paths),
        "predicted_video_paths": [],
        "seeds": [r.seed for r in ordered],
    }


def _aggregate(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    def joined(key: str) -> list:
        return [v for m in metrics for v in m[key]]

    successes = joined("successes")
    return {
        "avg_sum_reward": _mean(joined("sum_rewards")),
        "avg_max_reward": _mean(joined("max_rewards")),
        "pc_success": _mean(successes) * 100 if successes else math.nan,
        "n_episodes": len(joined("sum_rewards")),
        "video_paths": joined("video_paths"),
        "predicted_video_paths": joined("predicted_video_paths"),
    }


def eval_info(tasks: list[tuple[str, int, dict[str, Any]]], eval_s: float) -> dict[str, Any]:
    """``tasks``: (task_group, task_id, task_metrics) in evaluation order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for group, _, metrics in tasks:
        groups.setdefault(group, []).append(metrics)
    overall = _aggregate([m for _, _, m in tasks])
    video_paths = overall.pop("video_paths")
    predicted = overall.pop("predicted_video_paths")
    overall |= {
        "eval_s": eval_s,
        "eval_ep_s": eval_s / max(1, overall["n_episodes"]),
        "video_paths": video_paths,
        "predicted_video_paths": predicted,
    }
    return {
        "per_task": [{"task_group": g, "task_id": t, "metrics": m} for g, t, m in tasks],
        "per_group": {g: _aggregate(ms) for g, ms in groups.items()},
        "overall": overall,
    }


def write_eval_info(path: Path, info: dict[str, Any]) -> None:
    """Write ``info`` as LeRobot's eval_info.json (indented by 2), atomically."""
    write_json_atomic(path, info, indent=2)
