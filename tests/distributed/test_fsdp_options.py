"""FSDP2 settings on 2 real ranks, each compared with DDP (same global batch, deterministic):
ignored modules (whose gradients the trainer averages), reshard_after_forward, CPU offload,
min_num_params wrap units, a custom mixed-precision policy."""

from __future__ import annotations

import pytest
from launch import run_distributed
from tiny import DETERMINISTIC, losses, run_train, tiny_act_flags

pytestmark = pytest.mark.torch_range


@pytest.fixture(scope="module")
def ddp_curve(dataset_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp") / "out"
    run_distributed(
        run_train,
        2,
        [
            *tiny_act_flags(
                **DETERMINISTIC,
                **{"dataset.root": dataset_root, "steps": 4, "save_freq": 0, "batch_size": 4},
            ),
            f"--output_dir={out}",
        ],
    )
    return losses(out)


@pytest.mark.parametrize(
    "options",
    [
        ["--accelerator.fsdp.ignored_modules=action_head$"],
        ["--accelerator.fsdp.reshard_after_forward=false"],
        ["--accelerator.fsdp.cpu_offload=true"],
        ["--accelerator.fsdp.min_num_params=2000"],
        [
            "--accelerator.fsdp.mixed_precision_policy.param_dtype=float32",
            "--accelerator.fsdp.mixed_precision_policy.reduce_dtype=float32",
        ],
    ],
    ids=["ignored-modules", "no-reshard", "cpu-offload", "min-num-params", "custom-mp-policy"],
)
@pytest.mark.slow
def test_fsdp_option_matches_ddp(ddp_curve, dataset_root, tmp_path, options):
    flags = tiny_act_flags(
        **DETERMINISTIC,
        **{"dataset.root": dataset_root, "steps": 4, "save_freq": 0, "batch_size": 4},
    )
    run_distributed(
        run_train, 2, [*flags, "--parallelism.dp_shard=2", *options, f"--output_dir={tmp_path}"]
    )
    curve = losses(tmp_path)
    for step, value in ddp_curve.items():
        assert abs(curve[step] - value) < 1e-5, (step, curve[step], value)
