"""LeRobot 0.6.1's ``--dataset.eval_split`` (its make_train_eval_datasets) on a dataset of several
tasks holds out the same episodes and frames as lerobot_pipe, with and without
``--dataset.episodes``, and fails where lerobot_pipe refuses before launch."""

from __future__ import annotations

import json

import numpy as np
import pytest
from interop_helpers import DRIVER, LEROBOT_TIMEOUT, DriverResults
from multitask import write_multitask

from lerobot_pipe.datasets import LeRobotDataset
from lerobot_pipe.training.heldout import plan_split

pytestmark = pytest.mark.interop

CASES = {
    "all": {"eval_split": 0.3},
    "half": {"eval_split": 0.5},
    "episodes": {"eval_split": 0.3, "episodes": [8, 1, 5, 0, 3, 7]},
    "none-left": {"eval_split": 0.99},
}


def test_lerobot_holds_out_the_same_episodes_and_frames(upstream, tmp_path):
    root = write_multitask(tmp_path / "multitask")
    jobs = tmp_path / "jobs.json"
    out = tmp_path / "split.json"
    jobs.write_text(
        json.dumps(
            [{"job": "eval_split", "dataset_root": str(root), "cases": CASES, "out": str(out)}]
        )
    )
    upstream.run_script(DRIVER, "batch", jobs, home=tmp_path / ".hf_home", timeout=LEROBOT_TIMEOUT)
    theirs = DriverResults(tmp_path).json("split.json")
    for name, case in CASES.items():
        dataset = LeRobotDataset(root, episodes=case.get("episodes"))
        if "error" in theirs[name]:
            assert "leaves 0 training episodes" in theirs[name]["error"]
            with pytest.raises(ValueError, match="leaves no training episode"):
                plan_split(dataset, case["eval_split"])
            continue
        split = plan_split(dataset, case["eval_split"])
        assert list(split.train_episodes) == theirs[name]["train"], name
        assert list(split.eval_episodes) == theirs[name]["eval"], name
        index = dataset.get_batch(split.rows)["index"].numpy()
        assert np.array_equal(index, theirs[name]["eval_index"]), name
