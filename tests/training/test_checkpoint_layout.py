"""The checkpoint layout and completion contract, as written by a real 2-process DDP run."""

from __future__ import annotations

import json
import os

from launch import run_distributed
from tiny import run_train, tiny_act_flags

from lerobot_pipe.checkpoint.layout import list_complete_checkpoints, step_folder_name

PRETRAINED = {
    "config.json",
    "train_config.json",
    "model.safetensors",
    "policy_preprocessor.json",
    "policy_preprocessor_step_3_normalizer_processor.safetensors",
    "policy_postprocessor.json",
    "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
}
TRAINING_STATE = {
    "optimizer_param_groups.json",
    "optimizer_state.safetensors",
    "rng_state.safetensors",
    "training_step.json",
}


def test_layout_of_a_ddp_run(dataset_root, tmp_path):
    out = tmp_path / "out"
    flags = tiny_act_flags(
        **{
            "dataset.root": dataset_root,
            "steps": 4,
            "save_freq": 2,
            "batch_size": 4,
            "use_policy_training_preset": "false",
            "optimizer.type": "adamw",
            "optimizer.lr": 1e-3,
            "scheduler.type": "cosine_decay_with_warmup",
            "scheduler.num_warmup_steps": 1,
            "scheduler.num_decay_steps": 4,
            "scheduler.peak_lr": 1e-3,
            "scheduler.decay_lr": 1e-4,
        }
    )
    run_distributed(run_train, 2, [*flags, f"--output_dir={out}"])
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["000002", "000004", "last"]
    assert os.readlink(ckpts / "last") == "000004"  # relative link
    for step in ("000002", "000004"):
        assert {p.name for p in (ckpts / step / "pretrained_model").iterdir()} == PRETRAINED
        assert {p.name for p in (ckpts / step / "training_state").iterdir()} == TRAINING_STATE | {
            "scheduler_state.json"
        }
    info = json.loads((ckpts / "000004/training_state/training_step.json").read_text())
    assert info["step"] == 4 and info["dp_world_size"] == 2 and info["batch_size"] == 4
    assert info["grad_accum_steps"] == 1 and info["precision"] == "no"
    assert info["parallelism"] == {"dp_replicate": 2, "dp_shard": 1, "world_size": 2, "mode": "ddp"}
    assert info["samples_consumed"] == 4 * 8 and info["num_processes"] == 2  # LeRobot's key
    train_config = json.loads((ckpts / "000004/pretrained_model/train_config.json").read_text())
    assert train_config["parallelism"] == {"dp_replicate": None, "dp_shard": None}  # as asked
    assert "resolved" not in train_config  # resolved degrees: training_step.json
    assert train_config["policy"]["type"] == "act" and train_config["steps"] == 4
    from safetensors import safe_open

    state = ckpts / "000004/training_state"
    with safe_open(state / "rng_state.safetensors", "pt") as f:
        keys = set(f.keys())  # noqa: SIM118 - safe_open is no dict
    # The main rank's state under LeRobot's flat names, the other rank's beside it.
    assert {"py_rng_state", "np_rng_state_values", "torch_rng_state"} <= keys
    assert {k.split("/")[0] for k in keys if "/" in k} == {"rank1"}
    # LeRobot's optimizer layout: parameters numbered, two groups (the backbone's apart).
    groups = json.loads((state / "optimizer_param_groups.json").read_text())
    assert len(groups) == 2 and groups[0]["params"][:3] == [0, 1, 2] and groups[1]["params"] == []
    with safe_open(state / "optimizer_state.safetensors", "pt") as f:
        assert "state/0/exp_avg" in set(f.keys())  # noqa: SIM118


def test_save_freq_zero_saves_only_the_final_step_and_no_scheduler_file(dataset_root, tmp_path):
    run_train(
        [
            *tiny_act_flags(**{"dataset.root": dataset_root, "steps": 3, "save_freq": 0}),
            f"--output_dir={tmp_path}",
        ]
    )
    assert [p.name for p in list_complete_checkpoints(tmp_path)] == ["000003"]
    assert not (tmp_path / "checkpoints/000003/training_state/scheduler_state.json").exists()


def test_incomplete_checkpoints_are_invisible_and_temporaries_cleaned(dataset_root, tmp_path):
    run_train(
        [
            *tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2, "save_freq": 1}),
            f"--output_dir={tmp_path}",
        ]
    )
    ckpts = tmp_path / "checkpoints"
    (ckpts / "000002/training_state/training_step.json").unlink()  # as if the save never finished
    (ckpts / ".tmp-000003").mkdir()
    assert list_complete_checkpoints(tmp_path)[-1].name == "000001"
    run_train(
        [
            "--resume=true",
            f"--output_dir={tmp_path}",
            *tiny_act_flags(**{"dataset.root": dataset_root, "steps": 3, "save_freq": 1}),
        ]
    )
    assert not (ckpts / ".tmp-000003").exists()
    assert [p.name for p in list_complete_checkpoints(tmp_path)] == ["000001", "000002", "000003"]


def test_step_folder_names():
    assert step_folder_name(5, 100) == "000005"
    assert step_folder_name(5000, 1_000_000) == "0005000"
