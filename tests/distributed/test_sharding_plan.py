"""The sharding is planned once, before launch, on the meta-device model (make_plan), and the
launch applies that plan to the real model by module name instead of deciding again."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from tiny import tiny_act_flags
from torch.distributed.fsdp import FSDPModule

from lerobot_pipe.distributed import parallelize
from lerobot_pipe.distributed.parallel_dims import ParallelDims
from lerobot_pipe.distributed.runtime import DistEnv
from lerobot_pipe.policies.factory import make_policy
from lerobot_pipe.training.preflight import make_plan

pytestmark = pytest.mark.torch_range


def test_make_plan_plans_the_sharding_and_the_launch_applies_it(
    dataset_root, tmp_path, monkeypatch
):
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "output_dir": tmp_path / "out"})
    assert make_plan(flags, 2, {}).sharding is None  # DDP: nothing to plan
    plan = make_plan(
        [
            *flags,
            "--parallelism.dp_shard=2",
            "--accelerator.fsdp.ignored_modules=action_head$",
            "--accelerator.mixed_precision=bf16",
        ],
        2,
        {},
    )
    sharding = plan.sharding
    assert sharding.wrap_units and all(
        name.startswith(("model.encoder.layers.", "model.decoder.layers.", "model.vae_encoder."))
        for name in sharding.wrap_units
    )
    assert sharding.ignored_modules == ("model.action_head",)
    assert sharding.mp_policy.param_dtype == torch.bfloat16

    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        policy = make_policy(plan.cfg.policy, plan.dataset.features)
        real_units = parallelize.select_wrap_units(
            policy, plan.cfg.accelerator.fsdp, type(policy)._fsdp_wrap_modules
        )
        # The meta-device model's module names are the real model's.
        assert list(sharding.wrap_units) == [name for name, _ in real_units]

        def decided_again(*args, **kwargs):
            raise AssertionError("the launch decided the sharding again")

        for name in ("select_wrap_units", "check_shared_parameters", "ignored_module_names"):
            monkeypatch.setattr(parallelize, name, decided_again)
        env = DistEnv(
            rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo"
        )
        dims = ParallelDims(dp_replicate=1, dp_shard=1, world_size=1)
        model = parallelize.apply_fsdp(policy, dims, env, plan.cfg.accelerator, sharding)
        wrapped = sorted(n for n, m in model.named_modules() if n and isinstance(m, FSDPModule))
        assert wrapped == sorted(sharding.wrap_units)
        ignored = sharding.ignored_parameters(policy)
        assert ignored and all(not hasattr(p, "to_local") for p in ignored)  # left unsharded
    finally:
        dist.destroy_process_group()
