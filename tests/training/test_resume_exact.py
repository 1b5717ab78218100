"""Exact resume: single process bit-identical; 2->1 (DDP, FSDP2 DCP) and 2->2 processes within
1e-5."""

from __future__ import annotations

import pytest
import torch
from launch import run_distributed
from safetensors.torch import load_file
from tiny import DETERMINISTIC, losses, run_train, tiny_act_flags


def _tensors(step_dir, rel):
    return load_file(f"{step_dir}/{rel}")


def _assert_identical(a_dir, b_dir, rel):
    a, b = _tensors(a_dir, rel), _tensors(b_dir, rel)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{rel}: {k} differs"


def test_single_process_resume_is_bit_identical(dataset_root, tmp_path):
    # Randomness on: dropout 0.1 and VAE sampling (the ACT defaults).
    common = tiny_act_flags(
        **{"dataset.root": dataset_root, "batch_size": 8, "save_freq": 6, "num_workers": 2}
    )
    full = run_train([*common, f"--output_dir={tmp_path / 'full'}", "--steps=12"])
    run_train([*common, f"--output_dir={tmp_path / 'half'}", "--steps=6"])
    resumed = run_train(
        [
            "--resume=true",
            f"--config_path={tmp_path / 'half/checkpoints/000006/pretrained_model/train_config.json'}",
            "--steps=12",
        ]
    )
    assert resumed.endswith("000012") and full.endswith("000012")
    _assert_identical(full, resumed, "pretrained_model/model.safetensors")
    _assert_identical(full, resumed, "training_state/optimizer_state.safetensors")
    full_l, res_l = losses(tmp_path / "full"), losses(tmp_path / "half")
    assert all(full_l[s] == res_l[s] for s in range(7, 13))


# FSDP2's DCP shards load into the whole model of one process (its checkpoints then hold
# model.safetensors too, whatever the run's --checkpoint_format=dcp says).
TWO_PROCESSES = {
    "ddp": ([], []),
    "fsdp2-dcp": (
        ["--parallelism.dp_shard=2", "--checkpoint_format=dcp"],
        ["--parallelism.dp_shard=1"],
    ),
}


@pytest.mark.parametrize("topology", list(TWO_PROCESSES))
def test_resume_two_processes_to_one_is_sample_exact(dataset_root, tmp_path, topology):
    det = {**DETERMINISTIC, "dataset.root": dataset_root, "save_freq": 5}
    two = tiny_act_flags(**det, batch_size=4)
    sharding, on_one = TWO_PROCESSES[topology]
    out = tmp_path / "two"
    run_distributed(run_train, 2, [*two, *sharding, f"--output_dir={out}", "--steps=10"])
    run_train(
        [
            "--resume=true",
            f"--config_path={out / 'checkpoints/000005/pretrained_model'}",
            f"--output_dir={tmp_path / 'single'}",
            "--batch_size=8",
            "--steps=10",
            *on_one,
        ]
    )
    ref, resumed = losses(out), losses(tmp_path / "single")
    for step in range(6, 11):
        assert abs(ref[step] - resumed[step]) < 1e-5, (step, ref[step], resumed[step])


@pytest.mark.slow
def test_resume_two_to_two_with_randomness_restores_every_rank(dataset_root, tmp_path):
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "save_freq": 4, "batch_size": 4})
    run_distributed(run_train, 2, [*flags, f"--output_dir={tmp_path / 'full'}", "--steps=8"])
    run_distributed(run_train, 2, [*flags, f"--output_dir={tmp_path / 'part'}", "--steps=4"])
    run_distributed(
        run_train,
        2,
        ["--resume=true", f"--config_path={tmp_path / 'part/checkpoints/last'}", "--steps=8"],
    )
    ref, resumed = losses(tmp_path / "full"), losses(tmp_path / "part")
    for step in range(5, 9):
        assert abs(ref[step] - resumed[step]) < 1e-5, (step, ref[step], resumed[step])
    _assert_identical(
        tmp_path / "full/checkpoints/000008",
        tmp_path / "part/checkpoints/000008",
        "pretrained_model/model.safetensors",
    )
