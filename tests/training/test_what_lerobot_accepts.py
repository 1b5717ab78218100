"""What LeRobot 0.6.1 accepts, we accept: statistics are needed only where the policy normalizes
(a dataset's meta/stats.json may leave out a feature no policy input or output uses, e.g.
next.done), and --optimizer.lr=0 (a frozen run, which torch and LeRobot allow) trains."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from tiny import run_train, tiny_act_flags

from lerobot_pipe.datasets import DatasetError, LeRobotDataset
from lerobot_pipe.training.preflight import make_plan


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.fixture
def with_next_done(dataset_root, tmp_path) -> Path:
    """The synthetic dataset with a bool next.done column, as LeRobot's recorded datasets have,
    and no statistics for it."""
    root = shutil.copytree(dataset_root, tmp_path / "ds")
    for path in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        last = pa.compute.equal(table["frame_index"], pa.compute.max(table["frame_index"]).as_py())
        pq.write_table(table.append_column("next.done", last), path)
    _edit_json(
        root / "meta/info.json",
        lambda info: info["features"].update(
            {"next.done": {"dtype": "bool", "shape": [1], "names": None}}
        ),
    )
    _edit_json(root / "meta/stats.json", lambda stats: stats.pop("next.done", None))
    return root


def test_a_feature_no_policy_uses_needs_no_statistics(with_next_done, tmp_path):
    assert "next.done" in LeRobotDataset(with_next_done).features
    out = tmp_path / "out"
    run_train(tiny_act_flags(**{"dataset.root": with_next_done, "output_dir": out, "steps": 2}))
    assert (out / "checkpoints/000002/training_state/training_step.json").is_file()


def test_a_normalized_feature_without_statistics_is_refused_before_launch(dataset_root, tmp_path):
    root = shutil.copytree(dataset_root, tmp_path / "ds")
    _edit_json(root / "meta/stats.json", lambda stats: stats["action"].pop("std"))
    LeRobotDataset(root)  # the dataset itself loads: the policy decides what it needs
    flags = tiny_act_flags(**{"dataset.root": root, "output_dir": tmp_path / "out"})
    with pytest.raises(DatasetError) as refused:
        make_plan(flags, 1, {})
    message = str(refused.value)
    assert "meta/stats.json" in message and "'action'" in message and "'std'" in message
    assert "Recompute the dataset statistics" in message


@pytest.mark.parametrize(
    "flags",
    [
        {"policy.optimizer_lr": 0, "policy.optimizer_lr_backbone": 0},
        {
            "use_policy_training_preset": "false",
            "optimizer.type": "adamw",
            "optimizer.lr": 0,
            "scheduler.type": "constant_with_warmup",
            "scheduler.num_warmup_steps": 0,
        },
    ],
    ids=["policy-preset", "optimizer-flag"],
)
def test_a_zero_learning_rate_is_a_frozen_run(dataset_root, tmp_path, flags):
    out = tmp_path / "out"
    argv = tiny_act_flags(
        **{"dataset.root": dataset_root, "output_dir": out, "steps": 2, "save_freq": 1, **flags}
    )
    run_train(argv)
    weights = [
        load_file(out / f"checkpoints/{step}/pretrained_model/model.safetensors")
        for step in ("000001", "000002")
    ]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
