"""The best checkpoint of a run, chosen from its evaluations (``eval/<step>/eval_info.json``).

The order: the higher success rate (``pc_success``), then the higher mean max reward, then the
higher mean sum reward, then the later step. (Diffusion Policy ranks by the mean max reward
alone, robomimic by success alone; success first keeps the figure users read, the rewards
separate checkpoints that succeed equally often, and the later step wins a full tie, as the one
trained longest.) A NaN figure ranks below every number. Torch-free: the pipeline's rules and
its report read it.

``best.json``::

    {"step": "000040", "pc_success": 80.0, "avg_max_reward": ..., "avg_sum_reward": ...,
     "n_episodes": 20, "eval_info": "results/<run>/eval/000040/eval_info.json",
     "rule": "...", "candidates": {"000020": {...the same figures}, ...}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lerobot_pipe.fsutil import read_json, write_json_atomic

FIGURES = ("pc_success", "avg_max_reward", "avg_sum_reward")
RULE = "highest pc_success, then avg_max_reward, then avg_sum_reward, then the later step"


def _number(value: Any) -> float:
    value = float(value)
    return -math.inf if math.isnan(value) else value


def rank_key(step: str, overall: Mapping[str, Any]) -> tuple:
    """Sort key of one evaluated checkpoint: larger is better."""
    return (*(_number(overall[name]) for name in FIGURES), int(step))


def choose_best(overall_by_step: Mapping[str, Mapping[str, Any]]) -> str:
    """The best step folder name among ``{step: eval_info["overall"]}``."""
    if not overall_by_step:
        raise ValueError("no evaluated checkpoint to choose from")
    return max(overall_by_step, key=lambda step: rank_key(step, overall_by_step[step]))


def read_overall(eval_info_path: str | Path) -> dict[str, Any]:
    info = read_json(Path(eval_info_path), "eval_info.json")
    overall = info.get("overall") if isinstance(info, dict) else None
    if not isinstance(overall, dict) or any(name not in overall for name in FIGURES):
        raise ValueError(f"{eval_info_path}: no 'overall' with {', '.join(FIGURES)}")
    return overall


def best_record(eval_infos: Mapping[str, str | Path]) -> dict[str, Any]:
    """``{step: path of its eval_info.json}`` -> the content of best.json."""
    overall = {step: read_overall(path) for step, path in eval_infos.items()}
    best = choose_best(overall)

    def figures(step: str) -> dict[str, Any]:
        return {name: overall[step][name] for name in (*FIGURES, "n_episodes")}

    return {
        "step": best,
        **figures(best),
        "eval_info": str(eval_infos[best]),
        "rule": RULE,
        "candidates": {step: figures(step) for step in sorted(overall)},
    }


def write_best(path: str | Path, record: Mapping[str, Any]) -> None:
    write_json_atomic(Path(path), dict(record))


def read_best(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
