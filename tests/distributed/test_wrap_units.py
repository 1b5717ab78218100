"""FSDP2 wrap units whose forward never runs: found by running the policy once before sharding
(lerobot_pipe/distributed/unit_probe.py), refused by name when chosen by class, passed over by
the size policy; and the Diffusion run of issue #20 that crashed on such a unit trains."""

from __future__ import annotations

import os

import pytest
import torch
from launch import run_distributed
from tiny import losses, run_train, tiny_act_flags, tiny_diffusion_flags
from torch import nn

from lerobot_pipe.configs.parser import ConfigError
from lerobot_pipe.distributed.parallelize import plan_sharding
from lerobot_pipe.distributed.unit_probe import find_bypassed_modules

pytestmark = pytest.mark.torch_range


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)  # calls out_proj's weight
        self.ff = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        x = x + self.attn(x, x, x, need_weights=False)[0]
        x = x + self.ff[1:](self.ff[0](x))  # the Sequential's own forward never runs
        return self.drop(self.norm(x.transpose(1, 2)).transpose(1, 2))


class ToyPolicy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(8, 2)
        self.inference_head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.block(x)).sum()

    def select_action(self, x):
        self.eval()  # as LeRobot's policies do
        # In inference the block's parts are called one by one: its forward does not run there.
        h = self.block.ff(x)
        return self.inference_head(h)


def test_probe_names_every_module_whose_forward_is_bypassed_in_training_and_inference():
    policy = ToyPolicy().train()
    x = torch.randn(3, 4, 8)
    training = find_bypassed_modules(policy, lambda: policy(x))
    assert training == {
        "block.attn.out_proj": "block.attn.out_proj.weight",
        "block.ff": "block.ff.0.weight",
    }
    both = find_bypassed_modules(policy, lambda: policy(x), lambda: policy.select_action(x))
    assert "block" in both and "block.ff" in both and "head" not in both
    assert list(both) == [n for n, _ in policy.named_modules() if n in both]  # model order


def test_probe_leaves_every_rng_buffer_and_mode_as_it_was():
    policy = ToyPolicy().train()  # dropout draws numbers, batch norm updates its statistics
    x = torch.randn(3, 4, 8)
    stats = {n: b.clone() for n, b in policy.named_buffers()}
    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    find_bypassed_modules(policy, lambda: policy(x), lambda: policy.select_action(x))
    assert torch.equal(torch.rand(4), expected)
    for name, buffer in policy.named_buffers():
        assert torch.equal(buffer, stats[name]), name
    assert all(m.training for m in policy.modules())  # select_action switched it to eval


@pytest.fixture(scope="module")
def diffusion_parts(diffusion_camera_root, tmp_path_factory):
    """The tiny Diffusion Policy on the camera dataset, built as the trainer builds it for a
    2-rank FSDP2 run, with the modules the probe finds bypassed."""
    from lerobot_pipe.policies.factory import make_policy
    from lerobot_pipe.training.data import make_processors
    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.unit_probes import probe_forwards as _probe_forwards

    out = tmp_path_factory.mktemp("probe") / "out"
    flags = tiny_diffusion_flags(**{"dataset.root": diffusion_camera_root, "steps": 2})
    plan = make_plan(
        [*flags, "--parallelism.dp_shard=2", f"--output_dir={out}"], 2, dict(os.environ)
    )
    policy = make_policy(plan.cfg.policy, plan.dataset.features, pretrained_parts=False)
    pre, _ = make_processors(plan, "cpu")
    bypassed = _probe_forwards(plan, policy, policy, pre, torch.device("cpu"))
    return plan, policy, bypassed


def test_the_size_policy_passes_over_a_bypassed_module(diffusion_parts):
    plan, policy, bypassed = diffusion_parts
    # forward slices it: self.diffusion_step_encoder[1:](embed)
    assert "diffusion.unet.diffusion_step_encoder" in bypassed
    accelerator = plan.cfg.accelerator
    accelerator.fsdp.min_num_params = 2000
    try:
        blind = plan_sharding(policy, accelerator, [])
        seen = plan_sharding(policy, accelerator, [], bypassed)
    finally:
        accelerator.fsdp.min_num_params = None
    assert "diffusion.unet.diffusion_step_encoder" in blind.wrap_units  # what crashed
    assert not set(seen.wrap_units) & set(bypassed)
    assert seen.passed_over == ("diffusion.unet.diffusion_step_encoder",)


def test_a_unit_chosen_by_class_whose_forward_is_bypassed_is_refused_by_name(diffusion_parts):
    plan, policy, bypassed = diffusion_parts
    accelerator = plan.cfg.accelerator
    # The policy's own units pass: their forwards run.
    declared = plan_sharding(policy, accelerator, type(policy)._fsdp_wrap_modules, bypassed)
    assert declared.wrap_units == plan.sharding.wrap_units
    # Declared by a policy (its _fsdp_wrap_modules) ...
    with pytest.raises(ConfigError, match=r"diffusion\.unet\.diffusion_step_encoder \(its "):
        plan_sharding(policy, accelerator, ["Sequential"], bypassed)
    # ... or asked for with --accelerator.fsdp.wrap_modules.
    accelerator.fsdp.wrap_modules = ["Sequential"]
    try:
        with pytest.raises(
            ConfigError, match=r"^--accelerator.fsdp.wrap_modules: .*diffusion_step_encoder"
        ):
            plan_sharding(policy, accelerator, [], bypassed)
    finally:
        accelerator.fsdp.wrap_modules = None


def test_acts_declared_units_all_run(dataset_root, tmp_path):
    from lerobot_pipe.policies.factory import make_policy
    from lerobot_pipe.training.data import make_processors
    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.unit_probes import plan_units_on_the_real_model

    flags = tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2})
    plan = make_plan([*flags, "--parallelism.dp_shard=2", f"--output_dir={tmp_path}"], 2, {})
    policy = make_policy(plan.cfg.policy, plan.dataset.features, pretrained_parts=False)
    pre, _ = make_processors(plan, "cpu")
    sharding = plan_units_on_the_real_model(plan, policy, policy, pre, torch.device("cpu"))
    assert sharding.wrap_units == plan.sharding.wrap_units and sharding.passed_over == ()


@pytest.mark.slow
@pytest.mark.one_torch  # the choice is ours (the probe's test above runs on the range's ends)
def test_diffusion_with_min_num_params_trains_on_two_ranks(diffusion_camera_root, tmp_path):
    """Issue #20's command: a size policy that once chose diffusion_step_encoder, whose forward
    the U-Net bypasses, and crashed with "got mixed torch.Tensor and DTensor"."""
    flags = tiny_diffusion_flags(
        **{"dataset.root": diffusion_camera_root, "steps": 2, "save_freq": 2, "batch_size": 2}
    )
    run_distributed(
        run_train,
        2,
        [
            *flags,
            "--parallelism.dp_shard=2",
            "--accelerator.fsdp.min_num_params=2000",
            f"--output_dir={tmp_path}",
        ],
    )
    curve = losses(tmp_path)
    assert sorted(curve) == [1, 2] and all(map(torch.isfinite, map(torch.tensor, curve.values())))
    assert (tmp_path / "checkpoints" / "000002" / "training_state").is_dir()
