"""bf16 and fp16 under FSDP2 (and DDP): training makes progress, resume works, the fp16 loss
scaler's state round-trips through training_state/scaler_state.json."""

from __future__ import annotations

import json

import pytest
from launch import run_distributed
from tiny import losses, run_train, tiny_act_flags

from lerobot_pipe.checkpoint.manifest import file_manifest

pytestmark = pytest.mark.torch_range


@pytest.mark.parametrize(
    ("precision", "parallel"),
    [
        pytest.param("bf16", ["--parallelism.dp_shard=2"], id="bf16-fsdp2", marks=pytest.mark.slow),
        pytest.param("fp16", ["--parallelism.dp_shard=2"], id="fp16-fsdp2", marks=pytest.mark.slow),
        # DDP's autocast and scaler: the FSDP2 cases run them on the torch range's ends
        pytest.param("bf16", [], id="bf16-ddp", marks=pytest.mark.one_torch),
        pytest.param("fp16", [], id="fp16-ddp", marks=pytest.mark.one_torch),
    ],
)
def test_mixed_precision_trains_and_resumes(dataset_root, tmp_path, precision, parallel):
    flags = tiny_act_flags(
        **{"dataset.root": dataset_root, "batch_size": 8, "save_freq": 20, "log_freq": 5}
    )
    flags += [f"--accelerator.mixed_precision={precision}", *parallel]
    run_distributed(run_train, 2, [*flags, f"--output_dir={tmp_path}", "--steps=20"])
    curve = losses(tmp_path)
    assert curve[20] < 0.8 * curve[5], curve
    state = tmp_path / "checkpoints/000020/training_state"
    scaler_file = state / "scaler_state.json"
    assert scaler_file.exists() == (precision == "fp16")
    step = json.loads((state / "training_step.json").read_text())
    assert step["precision"] == precision

    run_distributed(
        run_train,
        2,
        ["--resume=true", f"--config_path={tmp_path / 'checkpoints/last'}", "--steps=30"],
    )
    curve = losses(tmp_path)
    assert 30 in curve and curve[30] < curve[5]
    if precision == "fp16":
        saved = json.loads(scaler_file.read_text())
        assert saved["scale"] > 0 and "_growth_tracker" in saved
        resumed_scale = json.loads(
            (tmp_path / "checkpoints/000030/training_state/scaler_state.json").read_text()
        )
        assert resumed_scale["growth_interval"] == saved["growth_interval"]


def test_fp16_scaler_state_is_restored(dataset_root, tmp_path):
    """After resume the scaler continues from the saved scale, not from the default 65536."""
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "batch_size": 8, "save_freq": 4})
    flags += ["--accelerator.mixed_precision=fp16"]
    run_train([*flags, f"--output_dir={tmp_path / 'a'}", "--steps=4"])
    path = tmp_path / "a/checkpoints/000004/training_state/scaler_state.json"
    state = json.loads(path.read_text())
    state["scale"] = 1024.0
    state["_growth_tracker"] = 0
    path.write_text(json.dumps(state))
    step_file = tmp_path / "a/checkpoints/000004/training_state/training_step.json"
    info = json.loads(step_file.read_text())
    info["files"] = file_manifest(tmp_path / "a/checkpoints/000004")  # keep it a valid checkpoint
    step_file.write_text(json.dumps(info))
    run_train(
        [
            "--resume=true",
            f"--config_path={tmp_path / 'a/checkpoints/000004'}",
            "--steps=5",
            "--save_freq=5",
        ]
    )
    after = json.loads(
        (tmp_path / "a/checkpoints/000005/training_state/scaler_state.json").read_text()
    )
    assert after["scale"] in (1024.0, 512.0), (
        after
    )  # continued from the saved scale (maybe backed off)
