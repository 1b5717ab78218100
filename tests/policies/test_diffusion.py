"""Diffusion Policy on one process: config rules, the per-sample keyed randomness (noise, steps,
crops), resize and crop, prediction types, DDPM and DDIM with num_inference_steps, the action
queue, the padding mask, trainable batch norm under bf16 and FSDP2 units, LoRA, the registry."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.configs.train import AcceleratorConfig, PeftConfig
from lerobot_pipe.constants import SAMPLE_KEY
from lerobot_pipe.distributed.parallel_dims import ParallelDims
from lerobot_pipe.distributed.parallelize import apply_fsdp, plan_sharding, select_wrap_units
from lerobot_pipe.distributed.runtime import DistEnv
from lerobot_pipe.policies.diffusion import DiffusionConfig, DiffusionPolicy
from lerobot_pipe.policies.factory import discover_policies, get_policy_class
from lerobot_pipe.policies.peft import apply_peft
from lerobot_pipe.policies.vision import BatchNorm2d
from lerobot_pipe.utils.random import keyed_integers, keyed_normal, keyed_uniform

CAMERAS = ("observation.images.top", "observation.images.wrist")
# 48x48: the smallest frames whose resnet18 feature map (2x2) the spatial softmax can use.
HW, STATE_DIM, ENV_DIM, ACTION_DIM = (48, 48), 2, 3, 2


def make_config(
    cameras=CAMERAS[:1], env: bool = False, hw=HW, tiny: bool = True, **overrides
) -> DiffusionConfig:
    inputs = {key: {"type": "VISUAL", "shape": [3, *hw]} for key in cameras}
    inputs["observation.state"] = {"type": "STATE", "shape": [STATE_DIM]}
    if env:
        inputs["observation.environment_state"] = {"type": "ENV", "shape": [ENV_DIM]}
    build = DiffusionConfig.tiny if tiny else DiffusionConfig
    return build(
        input_features=inputs,
        output_features={"action": {"type": "ACTION", "shape": [ACTION_DIM]}},
        **{"pretrained_backbone_weights": None, **overrides},
    )


def make_batch(cfg: DiffusionConfig, size: int = 4, seed: int = 0, keys=True) -> dict:
    gen = torch.Generator().manual_seed(seed)
    steps = cfg.n_obs_steps
    hw = next(iter(cfg.image_features.values()))["shape"][1:] if cfg.image_features else HW
    batch = {k: torch.rand(size, steps, 3, *hw, generator=gen) for k in cfg.image_features}
    batch["observation.state"] = torch.randn(size, steps, STATE_DIM, generator=gen)
    if cfg.env_state_feature is not None:
        batch["observation.environment_state"] = torch.randn(size, steps, ENV_DIM, generator=gen)
    batch["action"] = torch.randn(size, cfg.horizon, ACTION_DIM, generator=gen)
    batch["action_is_pad"] = torch.zeros(size, cfg.horizon, dtype=torch.bool)
    batch["action_is_pad"][0, -3:] = True
    if keys:
        batch[SAMPLE_KEY] = torch.arange(100, 100 + size, dtype=torch.int64)
    return batch


def rows(batch: dict, index) -> dict:
    return {k: v[index] for k, v in batch.items()}


def test_registry_finds_the_package() -> None:
    assert "diffusion" in discover_policies()
    assert get_policy_class("diffusion") is DiffusionPolicy
    assert PreTrainedConfig.get_choice_class("diffusion") is DiffusionConfig


def test_default_size_and_wrap_units() -> None:
    """LeRobot's defaults: LeRobot's parameter count with one camera, 12 U-Net blocks and 8 ResNet
    blocks per camera as FSDP2 units; the rest (stems, up/downsampling convolutions) in the root."""
    with torch.device("meta"):
        policy = DiffusionPolicy(make_config(hw=(96, 96), tiny=False), pretrained_parts=False)
    n = sum(p.numel() for p in policy.parameters())
    # LeRobot 0.6.1's count for the same config: its DiffusionPolicy(DiffusionConfig(
    # input_features={"observation.images.top": PolicyFeature(VISUAL, (3, 96, 96)),
    # "observation.state": PolicyFeature(STATE, (2,))}, output_features={"action":
    # PolicyFeature(ACTION, (2,))}, pretrained_backbone_weights=None)) built on the meta device.
    assert n == 262_709_026
    units = select_wrap_units(policy, AcceleratorConfig().fsdp, DiffusionPolicy._fsdp_wrap_modules)
    names = [name for name, _ in units]
    assert sum(".unet." in x for x in names) == 12
    assert sum(".rgb_encoder." in x for x in names) == 8
    largest = max(sum(p.numel() for p in m.parameters()) for _, m in units)
    assert largest < 0.2 * n  # the largest unit bounds what is unsharded at once


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"horizon": 10}, r"multiple of 2\*\*len\(down_dims\) = 4"),
        ({"n_action_steps": 8}, r"n_action_steps \(8\) must be <= horizon - n_obs_steps \+ 1"),
        ({"use_group_norm": True, "pretrained_backbone_weights": "IMAGENET1K_V1"}, "=null"),
        ({"crop_shape": (50, 40)}, r"does not fit in the camera frames \[48, 48\]"),
        ({"noise_scheduler_type": "PNDM"}, "noise_scheduler_type must be one of"),
        ({"prediction_type": "v_prediction"}, "prediction_type must be one of"),
        ({"num_inference_steps": 11}, r"num_inference_steps \(11\) must lie in"),
        ({"n_groups": 5}, "divisible by n_groups"),
    ],
)
def test_config_errors(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_config(**overrides).validate_features()


def test_feature_rules() -> None:
    with pytest.raises(ValueError, match="needs 'observation.state'"):
        cfg = make_config()
        cfg.input_features.pop("observation.state")
        cfg.validate_features()
    with pytest.raises(ValueError, match="at least one camera"):
        make_config(cameras=()).validate_features()
    with pytest.raises(ValueError, match="one frame shape"):
        cfg = make_config(cameras=CAMERAS)
        cfg.input_features[CAMERAS[1]]["shape"] = [3, 64, 64]
        cfg.validate_features()


def test_crop_follows_resize_and_ratio() -> None:
    assert make_config(resize_shape=[48, 40], crop_ratio=0.5).crop_shape == (24, 20)
    assert make_config(resize_shape=[48, 40], crop_shape=[10, 10]).crop_shape is None
    cfg = make_config(crop_shape=[40, 40])
    assert cfg.crop_shape == (40, 40) and cfg.down_dims == (16, 32)
    assert cfg.observation_delta_indices == [-1, 0]
    assert cfg.action_delta_indices == list(range(-1, 7))


def test_keyed_draws_are_pure_functions_of_the_key() -> None:
    keys = torch.tensor([0, 1, 2**40 + 3, -5], dtype=torch.int64)
    u = keyed_uniform(keys, 7, 1000)
    assert u.dtype == torch.float32 and u.min() > 0 and u.max() < 1
    assert torch.equal(u[2:3], keyed_uniform(keys[2:3], 7, 1000))  # independent of the batch
    assert not torch.equal(u, keyed_uniform(keys, 8, 1000))  # streams differ
    assert len({tuple(r[:4].tolist()) for r in u}) == 4  # keys differ
    z = keyed_normal(torch.arange(64), 1, (50, 20))
    assert z.shape == (64, 50, 20) and abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02
    i = keyed_integers(torch.arange(2000), 2, 2, torch.tensor([3, 10]))
    assert set(i[:, 0].tolist()) == {0, 1, 2} and set(i[:, 1].tolist()) == set(range(10))


def test_loss_of_a_sample_does_not_depend_on_its_batch() -> None:
    """The per-sample noise, step and crop come from its key: the loss of a batch is the mean
    of its samples' losses (group norm: no batch statistics), however it is split."""
    torch.manual_seed(0)
    cfg = make_config(use_group_norm=True, crop_shape=[40, 40])
    policy = DiffusionPolicy(cfg).train()
    batch = make_batch(cfg)
    whole = policy(batch)[0]
    parts = torch.stack([policy(rows(batch, slice(i, i + 2)))[0] for i in (0, 2)]).mean()
    torch.testing.assert_close(whole, parts, rtol=1e-6, atol=1e-6)
    whole.backward()  # the camera matters: its ResNet's stem gets a gradient
    assert policy.diffusion.rgb_encoder[0].backbone[0].weight.grad.abs().sum() > 0
    assert torch.equal(policy(batch)[0], whole)  # the same keys: the same draws
    other = dict(batch, **{SAMPLE_KEY: batch[SAMPLE_KEY] + 50})
    assert not torch.equal(policy(other)[0], whole)
    torch.manual_seed(1)  # no keys: drawn from torch's RNG, reproducible with its seed
    unkeyed = {k: v for k, v in batch.items() if k != SAMPLE_KEY}
    first = policy(unkeyed)[0]
    torch.manual_seed(1)
    assert torch.equal(policy(unkeyed)[0], first)


def test_random_crops_per_sample_and_camera_centre_in_eval() -> None:
    torch.manual_seed(0)
    cfg = make_config(cameras=CAMERAS, crop_shape=[20, 24])
    model = DiffusionPolicy(cfg).diffusion.train()
    keys = torch.arange(64)
    offsets = model._crop_offsets(keys, HW)
    assert offsets.shape == (64, 2, 2)
    assert offsets[..., 0].max() == 28 and offsets[..., 1].max() == 24 and offsets.min() == 0
    assert not torch.equal(offsets[:, 0], offsets[:, 1])  # cameras crop independently
    encoder = model.rgb_encoder[0]
    frames = torch.rand(3, 3, *HW)
    crop = encoder._crop(frames, offsets[:3, 0])
    for i, (top, left) in enumerate(offsets[:3, 0].tolist()):
        assert torch.equal(crop[i], frames[i, :, top : top + 20, left : left + 24])
    # The backbone's layout, not channels-last (slower convolutions on a CPU; issue 19).
    assert crop.shape == (3, 3, 20, 24) and crop.is_contiguous()
    model.eval()
    assert model._crop_offsets(keys, HW) is None
    assert torch.equal(encoder._crop(frames, None), frames[:, :, 14:34, 12:36])


def test_resize_is_antialiased_bilinear() -> None:
    torch.manual_seed(0)
    cfg = make_config(resize_shape=[24, 16])
    encoder = DiffusionPolicy(cfg).diffusion.rgb_encoder[0].eval()
    frames = torch.rand(2, 3, *HW)
    seen = {}
    encoder.backbone.register_forward_pre_hook(lambda m, i: seen.update(x=i[0]))
    encoder(frames)
    expected = nn.functional.interpolate(
        frames, size=(24, 16), mode="bilinear", align_corners=False, antialias=True
    )
    assert torch.equal(seen["x"], expected)


@pytest.mark.parametrize("prediction_type", ["epsilon", "sample"])
def test_loss_targets_the_noise_or_the_actions(prediction_type: str) -> None:
    torch.manual_seed(0)
    cfg = make_config(cameras=(), env=True, prediction_type=prediction_type)
    model = DiffusionPolicy(cfg).diffusion.train()
    batch = make_batch(cfg)
    seen = {}
    model.unet.register_forward_hook(lambda m, i, o: seen.update(pred=o, noisy=i[0], t=i[1]))
    loss = model.compute_loss(batch)
    from lerobot_pipe.policies.diffusion.modeling_diffusion import NOISE_STREAM

    eps = keyed_normal(batch[SAMPLE_KEY], NOISE_STREAM, (cfg.horizon, ACTION_DIM))
    target = eps if prediction_type == "epsilon" else batch["action"]
    torch.testing.assert_close(loss, ((seen["pred"] - target) ** 2).mean())
    expected = model.noise_scheduler.add_noise(batch["action"], eps, seen["t"])
    torch.testing.assert_close(seen["noisy"], expected)


@pytest.mark.parametrize(("scheduler", "steps", "calls"), [("DDPM", None, 10), ("DDIM", 3, 3)])
def test_inference_steps_and_the_action_queue(scheduler: str, steps, calls: int) -> None:
    torch.manual_seed(0)
    cfg = make_config(env=True, noise_scheduler_type=scheduler, num_inference_steps=steps)
    policy = DiffusionPolicy(cfg)
    count = []
    policy.diffusion.unet.register_forward_hook(lambda *a: count.append(1))
    obs = {k: v[:, 0] for k, v in make_batch(cfg, size=2).items() if k.startswith("observation")}
    actions = [policy.select_action(obs) for _ in range(cfg.n_action_steps + 1)]
    # One chunk of n_action_steps, then a new one; the first observation filled the queue.
    assert len(count) == 2 * calls and all(a.shape == (2, ACTION_DIM) for a in actions)
    queued = policy._queues["observation.state"]
    assert len(queued) == 2 and torch.equal(queued[0], queued[1])
    policy.reset()
    torch.manual_seed(5)
    chunk = policy.predict_action_chunk(make_batch(cfg, size=2))
    assert chunk.shape == (2, cfg.n_action_steps, ACTION_DIM)
    torch.manual_seed(5)
    again = policy.predict_action_chunk(make_batch(cfg, size=2))
    assert torch.equal(chunk, again)  # same seed, same actions


def test_padding_mask_and_its_normalizer() -> None:
    torch.manual_seed(0)
    cfg = make_config(cameras=(), env=True, do_mask_loss_for_padding=True)
    policy = DiffusionPolicy(cfg).train()
    batch = make_batch(cfg)
    valid = int((~batch["action_is_pad"]).sum()) * ACTION_DIM
    assert int(policy.loss_normalizers(batch)["mse"]) == valid
    loss = policy(batch)[0]
    half = policy(batch, normalizers={"mse": (torch.tensor(2 * valid), 2)})[0]
    torch.testing.assert_close(half, loss)
    assert DiffusionPolicy(make_config(env=True)).loss_normalizers(batch) == {}


def test_compiled_checkpoint_names_load(tmp_path: Path) -> None:
    """LeRobot's compile_model=true checkpoints name the U-Net's weights unet._orig_mod.*."""
    torch.manual_seed(0)
    policy = DiffusionPolicy(make_config(env=True))
    state = {
        k.replace("diffusion.unet.", "diffusion.unet._orig_mod."): v
        for k, v in policy.state_dict().items()
    }
    other = DiffusionPolicy(make_config(env=True))
    other.load_state_dict(state, strict=True)
    for key, value in policy.state_dict().items():
        assert torch.equal(other.state_dict()[key], value)


def test_trainable_batch_norm_with_bf16_parameters() -> None:
    """FSDP2's bf16 policy casts the parameters, not the running statistics."""
    bn = BatchNorm2d(4)
    reference = BatchNorm2d(4)
    x = torch.randn(3, 4, 5, 5)
    bn.weight.data, bn.bias.data = bn.weight.data.bfloat16(), bn.bias.data.bfloat16()
    out = bn(x.bfloat16())
    expected = reference(x)
    assert out.dtype == torch.bfloat16 and bn.running_mean.dtype == torch.float32
    torch.testing.assert_close(out.float(), expected, atol=0.05, rtol=0.05)
    torch.testing.assert_close(bn.running_mean, reference.running_mean, atol=1e-2, rtol=0)
    assert int(bn.num_batches_tracked) == 1


def test_fsdp2_units_with_bf16_parameters(tmp_path: Path) -> None:
    """One-process gloo group: U-Net and ResNet blocks are units; bf16 parameters with fp32
    batch-norm statistics run forward and backward."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        torch.manual_seed(0)
        cfg = make_config(cameras=CAMERAS, env=True, crop_shape=[40, 40])
        policy = DiffusionPolicy(cfg).train()
        accelerator = AcceleratorConfig(mixed_precision="bf16")
        env = DistEnv(
            rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo"
        )
        dims = ParallelDims(dp_replicate=1, dp_shard=1, world_size=1)
        sharding = plan_sharding(policy, accelerator, DiffusionPolicy._fsdp_wrap_modules)
        model = apply_fsdp(policy, dims, env, accelerator, sharding)
        loss, _ = model(make_batch(cfg))
        loss.backward()
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        assert all(torch.isfinite(p.grad.full_tensor()).all() for p in model.parameters())
        stats = [b for n, b in model.named_buffers() if n.endswith("running_mean")]
        assert len(stats) == 2 * 20 and all(b.dtype == torch.float32 for b in stats)
    finally:
        dist.destroy_process_group()


def test_lora_trains_the_film_and_first_convolutions_only() -> None:
    torch.manual_seed(0)
    cfg = make_config(env=True)
    policy = DiffusionPolicy(cfg)
    model = apply_peft(policy, PeftConfig(r=2), base_path=None)
    base = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" not in n}
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any(".cond_encoder.1.lora_" in n for n in trainable)
    assert any(".conv1.block.0.lora_" in n for n in trainable)
    optimizer = torch.optim.Adam(model.get_optim_params(), lr=1e-2)
    for _ in range(2):
        loss, _ = model(make_batch(cfg))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = dict(policy.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in base.items())


# nn.Module.compile imports torch._dynamo, which warns about torch.jit on import.
@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.jit")
def test_gradient_checkpointing_and_compile_keep_the_numbers_and_names() -> None:
    torch.manual_seed(0)
    cfg = make_config(env=True)
    plain = DiffusionPolicy(cfg).train()
    checkpointed = DiffusionPolicy(make_config(env=True, gradient_checkpointing=True)).train()
    checkpointed.load_state_dict(plain.state_dict())
    batch = make_batch(cfg)
    losses = []
    for policy in (plain, checkpointed):
        loss, _ = policy(batch)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7, msg=name)
    compiled = DiffusionPolicy(make_config(env=True, compile_model=True))  # compiled lazily
    assert list(compiled.state_dict()) == list(plain.state_dict())
