"""LeRobot 0.6.1's ``--dataset.eval_split`` (its make_train_eval_datasets) on a dataset of several
tasks holds out the same episodes and frames as lerobot_pipe, with and without
``--dataset.episodes``, and fails where lerobot_pipe refuses before launch; its held-out loss loop
on our checkpoint, with batches of one (where its mean of batch means is the per-sample mean),
gives our eval_loss."""

from __future__ import annotations

import json

import numpy as np
import pytest
from interop_helpers import DRIVER, LEROBOT_TIMEOUT, DriverResults
from multitask import write_multitask
from tiny import DETERMINISTIC, eval_losses, run_train, tiny_act_flags

from lerobot_pipe import constants as C
from lerobot_pipe.datasets import LeRobotDataset
from lerobot_pipe.training.heldout import plan_split

pytestmark = pytest.mark.interop

CASES = {
    "all": {"eval_split": 0.3},
    "half": {"eval_split": 0.5},
    "episodes": {"eval_split": 0.3, "episodes": [8, 1, 5, 0, 3, 7]},
    "none-left": {"eval_split": 0.99},
}


@pytest.fixture(scope="module")
def lerobot_heldout(upstream, tmp_path_factory):
    """A run of ours with its held-out loss at its last step, and what LeRobot computes: the
    split of each case, and its held-out loss on our checkpoint."""
    tmp = tmp_path_factory.mktemp("heldout_interop")
    root = write_multitask(tmp / "multitask")
    out = tmp / "ours"
    flags = {"dataset.root": root, "steps": 2, "save_freq": 0, "dataset.eval_split": 0.3}
    run_train([*tiny_act_flags(**DETERMINISTIC, **flags, eval_steps=2), f"--output_dir={out}"])
    pretrained = out / C.CHECKPOINTS_DIR / "000002" / C.PRETRAINED_MODEL_DIR
    jobs = [
        {"job": "eval_split", "dataset_root": str(root), "cases": CASES},
        {
            "job": "heldout_loss",
            "pretrained": str(pretrained),
            "dataset_root": str(root),
            "eval_split": 0.3,
            "batch_size": 1,
        },
    ]
    for job in jobs:
        job["out"] = str(tmp / f"{job['job']}.json")
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    upstream.run_script(
        DRIVER, "batch", tmp / "jobs.json", home=tmp / ".hf_home", timeout=LEROBOT_TIMEOUT
    )
    return root, out, DriverResults(tmp)


def test_lerobot_holds_out_the_same_episodes_and_frames(lerobot_heldout):
    root, _, results = lerobot_heldout
    theirs = results.json("eval_split.json")
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


def test_lerobots_held_out_loss_with_batches_of_one_is_ours(lerobot_heldout):
    root, out, results = lerobot_heldout
    theirs = results.json("heldout_loss.json")
    split = plan_split(LeRobotDataset(root), 0.3)
    assert theirs["num_samples"] == split.num_samples
    assert eval_losses(out)[2] == pytest.approx(theirs["eval_loss"], rel=1e-5)
