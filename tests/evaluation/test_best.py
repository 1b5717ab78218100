"""The best checkpoint (lerobot_pipe.evaluation.best): success rate first, then the mean max
reward, then the mean sum reward, then the later step."""

from __future__ import annotations

import json
import math

import pytest

from lerobot_pipe.evaluation.best import RULE, best_record, choose_best, read_best, write_best


def _overall(success, max_reward, sum_reward, n=10):
    return {
        "pc_success": success,
        "avg_max_reward": max_reward,
        "avg_sum_reward": sum_reward,
        "n_episodes": n,
    }


def test_success_rate_decides_first():
    steps = {"000020": _overall(30.0, -0.1, -5.0), "000040": _overall(40.0, -0.9, -30.0)}
    assert choose_best(steps) == "000040"


def test_ties_go_to_max_reward_then_sum_reward_then_the_later_step():
    tie = {"000020": _overall(50.0, -0.2, -9.0), "000040": _overall(50.0, -0.3, -1.0)}
    assert choose_best(tie) == "000020"  # the higher mean max reward
    tie["000040"]["avg_max_reward"] = -0.2
    assert choose_best(tie) == "000040"  # equal max reward: the higher mean sum reward
    tie["000040"]["avg_sum_reward"] = -9.0
    tie["000060"] = _overall(50.0, -0.2, -9.0)
    assert choose_best(tie) == "000060"  # a full tie: the later step
    assert choose_best(dict(reversed(list(tie.items())))) == "000060"  # not the listing order


def test_nan_ranks_below_any_number():
    steps = {"000020": _overall(math.nan, 0.0, 0.0), "000040": _overall(0.0, -1.0, -50.0)}
    assert choose_best(steps) == "000040"


def test_no_evaluation_is_an_error():
    with pytest.raises(ValueError, match="no evaluated checkpoint"):
        choose_best({})


def test_best_json_from_eval_infos(tmp_path):
    paths = {}
    for step, success in (("000020", 10.0), ("000040", 60.0), ("000060", 60.0)):
        path = tmp_path / "eval" / step / "eval_info.json"
        path.parent.mkdir(parents=True)
        overall = _overall(success, -0.2 if step == "000040" else -0.25, -10.0, n=20)
        path.write_text(json.dumps({"per_task": [], "per_group": {}, "overall": overall}))
        paths[step] = path
    record = best_record(paths)
    write_best(tmp_path / "best.json", record)
    best = read_best(tmp_path / "best.json")
    assert best["step"] == "000040" and best["pc_success"] == 60.0 and best["n_episodes"] == 20
    assert best["eval_info"] == str(paths["000040"]) and best["rule"] == RULE
    assert sorted(best["candidates"]) == ["000020", "000040", "000060"]
    (tmp_path / "eval" / "000020" / "eval_info.json").write_text("{}")
    with pytest.raises(ValueError, match="no 'overall'"):
        best_record(paths)
