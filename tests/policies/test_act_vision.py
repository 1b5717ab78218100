"""ACT with cameras on one process: the ResNet backbone, camera tokens, the backbone's optimizer
group, bf16, FSDP2 wrap units with mixed precision, LoRA, and torchvision's ImageNet weights
from the torch.hub cache (never downloaded here: tests use random init or a file they write)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from lerobot_pipe.configs.train import AcceleratorConfig, PeftConfig
from lerobot_pipe.distributed.parallel_dims import ParallelDims
from lerobot_pipe.distributed.parallelize import apply_fsdp, plan_sharding, select_wrap_units
from lerobot_pipe.distributed.runtime import DistEnv
from lerobot_pipe.policies.act import ACTConfig, ACTPolicy
from lerobot_pipe.policies.peft import apply_peft
from lerobot_pipe.policies.vision import (
    BackboneWeightsError,
    BasicBlock,
    Bottleneck,
    FrozenBatchNorm2d,
    cached_weights_file,
    ensure_backbone_weights,
    resnet_backbone,
    resolve_weights,
)
from lerobot_pipe.scripts.train import main as train_main

CAMERAS = ("observation.images.top", "observation.images.wrist")
STATE_DIM, ENV_DIM, ACTION_DIM, BATCH = 3, 5, 2, 2
RESNET18_FILE = "resnet18-f37072fd.pth"


def camera_config(shapes=((3, 64, 64), (3, 64, 64)), env: bool = True, **overrides) -> ACTConfig:
    inputs = {
        key: {"type": "VISUAL", "shape": list(s)} for key, s in zip(CAMERAS, shapes, strict=True)
    }
    inputs["observation.state"] = {"type": "STATE", "shape": [STATE_DIM]}
    if env:
        inputs["observation.environment_state"] = {"type": "ENV", "shape": [ENV_DIM]}
    return ACTConfig.tiny(
        input_features=inputs,
        output_features={"action": {"type": "ACTION", "shape": [ACTION_DIM]}},
        **{"pretrained_backbone_weights": None, **overrides},
    )


def camera_batch(cfg: ACTConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    batch = {
        k: torch.rand(BATCH, *ft["shape"], generator=gen) for k, ft in cfg.image_features.items()
    }
    batch["observation.state"] = torch.randn(BATCH, STATE_DIM, generator=gen)
    if cfg.env_state_feature is not None:
        batch["observation.environment_state"] = torch.randn(BATCH, ENV_DIM, generator=gen)
    batch["action"] = torch.randn(BATCH, cfg.chunk_size, ACTION_DIM, generator=gen)
    batch["action_is_pad"] = torch.zeros(BATCH, cfg.chunk_size, dtype=torch.bool)
    batch["action_is_pad"][0, -2:] = True
    return batch


def frozen_state(policy: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b.clone() for n, b in policy.named_buffers() if ".backbone." in n}


def test_cameras_train_the_backbone_but_not_its_batch_norm() -> None:
    torch.manual_seed(0)
    cfg = camera_config(env=False, optimizer_lr_backbone=1e-4)
    policy = ACTPolicy(cfg).train()
    seen = []
    policy.model.encoder.register_forward_pre_hook(lambda _, args: seen.append(args[0].shape))
    buffers = frozen_state(policy)
    conv = policy.model.backbone.layer1[0].conv1.weight.detach().clone()
    optimizer = torch.optim.AdamW(policy.get_optim_params(), lr=1e-3)
    loss, _ = policy(camera_batch(cfg))
    loss.backward()
    assert [n for n, p in policy.named_parameters() if p.grad is None] == []
    optimizer.step()
    # 64x64 frames -> 2x2 layer4 maps: 4 tokens per camera after [latent, state].
    assert seen[0] == (2 + 2 * 4, BATCH, cfg.dim_model)
    assert not torch.equal(conv, policy.model.backbone.layer1[0].conv1.weight)
    for name, value in frozen_state(policy).items():
        assert torch.equal(value, buffers[name]), name
    groups = optimizer.param_groups
    backbone = {id(p) for p in policy.model.backbone.parameters()}
    assert {id(p) for p in groups[1]["params"]} == backbone and groups[1]["lr"] == 1e-4
    assert not backbone & {id(p) for p in groups[0]["params"]} and groups[0]["lr"] == 1e-3
    chunk = policy.predict_action_chunk(camera_batch(cfg, seed=1))
    assert chunk.shape == (BATCH, cfg.chunk_size, ACTION_DIM)


@pytest.mark.parametrize("shapes", [((3, 64, 64), (3, 64, 64)), ((3, 64, 64), (3, 32, 96))])
def test_camera_tokens_equal_camera_by_camera(shapes) -> None:
    """Cameras of one shape share a backbone call; the tokens are those of one call each."""
    torch.manual_seed(0)
    cfg = camera_config(shapes=shapes)
    model = ACTPolicy(cfg).model.eval()
    batch = camera_batch(cfg)
    with torch.no_grad():
        tokens, positions = model._camera_tokens(batch)
        for key, token, pos in zip(CAMERAS, tokens, positions, strict=True):
            feature_map = model.backbone(batch[key])
            expected = model.encoder_img_feat_input_proj(feature_map).flatten(2).permute(2, 0, 1)
            torch.testing.assert_close(token, expected, rtol=1e-5, atol=1e-6)
            embed = model.encoder_cam_feat_pos_embed(feature_map)
            assert torch.equal(pos, embed.flatten(2).permute(2, 0, 1))
            assert pos.shape == (feature_map.shape[2] * feature_map.shape[3], 1, cfg.dim_model)


def test_module_order_is_lerobots() -> None:
    children = [n for n, _ in ACTPolicy(camera_config()).model.named_children()]
    assert children == [
        "vae_encoder",
        "vae_encoder_cls_embed",
        "vae_encoder_robot_state_input_proj",
        "vae_encoder_action_input_proj",
        "vae_encoder_latent_output_proj",
        "backbone",
        "encoder",
        "decoder",
        "encoder_robot_state_input_proj",
        "encoder_env_state_input_proj",
        "encoder_latent_input_proj",
        "encoder_img_feat_input_proj",
        "encoder_1d_feature_pos_embed",
        "encoder_cam_feat_pos_embed",
        "decoder_pos_embed",
        "action_head",
    ]


@pytest.mark.parametrize(
    ("overrides", "shapes", "message"),
    [
        ({"vision_backbone": "resnet200"}, None, "vision_backbone='resnet200'"),
        ({"replace_final_stride_with_dilation": True}, None, "replace_final_stride_with_dilation"),
        (
            {
                "vision_backbone": "resnet34",
                "pretrained_backbone_weights": "ResNet18_Weights.IMAGENET1K_V1",
            },
            None,
            r"not weights of resnet34.*ResNet34_Weights.IMAGENET1K_V1.*=null",
        ),
        ({}, ((1, 64, 64), (3, 64, 64)), r"RGB frames.*\[3, height, width\]"),
    ],
)
def test_backbone_config_errors(overrides: dict, shapes, message: str) -> None:
    cfg = camera_config(**overrides) if shapes is None else None
    with pytest.raises(ValueError, match=message):
        (cfg or camera_config(shapes=shapes, **overrides)).validate_features()


def test_no_camera_and_no_environment_state_is_refused() -> None:
    cfg = camera_config(env=False)
    cfg.input_features = {"observation.state": cfg.input_features["observation.state"]}
    with pytest.raises(ValueError, match=r"at least one camera.*observation.environment_state"):
        cfg.validate_features()


def test_weight_names_resolve_as_torchvision_does() -> None:
    url = "https://download.pytorch.org/models/resnet18-f37072fd.pth"
    for name in ("ResNet18_Weights.IMAGENET1K_V1", "IMAGENET1K_V1", "DEFAULT"):
        assert resolve_weights("resnet18", name) == url
    assert resolve_weights("resnet50", "ResNet50_Weights.DEFAULT").endswith("resnet50-11ad3fa6.pth")
    with pytest.raises(BackboneWeightsError, match="IMAGENET1K_V2"):
        resolve_weights("resnet18", "IMAGENET1K_V2")


# torchvision's published parameter counts without the 1000-class fc layer (its batch norms'
# affine terms are parameters there, buffers in a frozen batch norm).
@pytest.mark.parametrize(
    ("name", "block", "params"),
    [
        ("resnet18", BasicBlock, 11_176_512),
        ("resnet34", BasicBlock, 21_284_672),
        ("resnet50", Bottleneck, 23_508_032),
        ("resnet101", Bottleneck, 42_500_160),
        ("resnet152", Bottleneck, 58_143_808),
    ],
)
def test_resnet_variants(name: str, block: type, params: int) -> None:
    with torch.device("meta"):
        backbone = resnet_backbone(name)
    affine = sum(b.numel() for n, b in backbone.named_buffers() if n.endswith(("weight", "bias")))
    assert sum(p.numel() for p in backbone.parameters()) + affine == params
    assert all(isinstance(b, block) for stage in (backbone.layer1, backbone.layer4) for b in stage)
    assert backbone.out_channels == 512 * block.expansion
    assert not any(isinstance(m, nn.BatchNorm2d) for m in backbone.modules())
    assert "fc.weight" not in backbone.state_dict() and "bn1.running_var" in backbone.state_dict()


def test_dilated_last_stage_keeps_the_resolution() -> None:
    torch.manual_seed(0)
    image = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        assert resnet_backbone("resnet50", True)(image).shape == (1, 2048, 4, 4)
        assert resnet_backbone("resnet18")(image).shape == (1, 512, 2, 2)


def test_frozen_batch_norm() -> None:
    bn = FrozenBatchNorm2d(4)
    bn.running_mean.fill_(1.0)
    bn.running_var.fill_(4.0)
    x = torch.randn(2, 4, 3, 3)
    torch.testing.assert_close(bn(x), (x - 1.0) / torch.sqrt(torch.tensor(4.0 + 1e-5)))
    assert bn(x.bfloat16()).dtype == torch.bfloat16  # bf16 stays bf16 under FSDP2's casts
    state = {**bn.state_dict(), "num_batches_tracked": torch.tensor(7)}  # a trained BatchNorm's
    FrozenBatchNorm2d(4).load_state_dict(state)
    assert [n for n, _ in bn.named_parameters()] == []


def test_bf16_autocast_forward_backward() -> None:
    torch.manual_seed(0)
    cfg = camera_config(dropout=0.0)
    policy = ACTPolicy(cfg).train()
    batch = camera_batch(cfg)
    reference = policy(batch)[0].item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = policy(batch)
    loss.backward()
    assert torch.isfinite(loss) and abs(loss.item() - reference) < 0.05 * abs(reference)
    grads = [p.grad for p in policy.model.backbone.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_fsdp2_units_with_bf16_parameters(tmp_path: Path) -> None:
    """One-process gloo group: the backbone's blocks are units; bf16 parameters with fp32
    frozen batch-norm buffers run forward and backward, with a unit called once per shape."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        torch.manual_seed(0)
        # Two frame shapes: each backbone unit runs twice in one forward.
        cfg = camera_config(shapes=((3, 64, 64), (3, 32, 96)), dropout=0.0, use_vae=False)
        policy = ACTPolicy(cfg).train()
        accelerator = AcceleratorConfig(mixed_precision="bf16")
        units = [
            n for n, _ in select_wrap_units(policy, accelerator.fsdp, ACTPolicy._fsdp_wrap_modules)
        ]
        assert [n for n in units if ".backbone." in n] == [
            f"model.backbone.layer{i}.{j}" for i in range(1, 5) for j in range(2)
        ]
        env = DistEnv(
            rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo"
        )
        dims = ParallelDims(dp_replicate=1, dp_shard=1, world_size=1)
        sharding = plan_sharding(policy, accelerator, ACTPolicy._fsdp_wrap_modules)
        model = apply_fsdp(policy, dims, env, accelerator, sharding)
        loss, _ = model(camera_batch(cfg))
        loss.backward()
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        assert all(torch.isfinite(p.grad.full_tensor()).all() for p in model.parameters())
        assert all(b.dtype == torch.float32 for n, b in model.named_buffers() if "backbone" in n)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("targets", [None, ["linear1", "conv2"]])
def test_lora_over_an_act_with_cameras(targets) -> None:
    """Default targets leave the backbone frozen (an empty backbone group); LoRA on the
    backbone's convolutions trains at optimizer_lr_backbone."""
    torch.manual_seed(0)
    cfg = camera_config(optimizer_lr_backbone=1e-4)
    policy = ACTPolicy(cfg)
    model = apply_peft(policy, PeftConfig(r=4, target_modules=targets), base_path=None)
    base = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" not in n}
    buffers = frozen_state(policy)
    optimizer = torch.optim.AdamW(model.get_optim_params(), lr=1e-3)
    names = {id(p): n for n, p in policy.named_parameters()}
    group_names = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    assert all("lora_" in n for group in group_names for n in group)
    if targets is None:
        assert group_names[1] == []
    else:
        assert group_names[1] and all(n.startswith("model.backbone.") for n in group_names[1])
        assert all(".conv2.lora_" in n for n in group_names[1])
    assert optimizer.param_groups[1]["lr"] == 1e-4
    for _ in range(2):  # LoRA's B starts at zero: the second step moves the output
        loss, _ = model(camera_batch(cfg))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = dict(policy.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in base.items())
    assert all(torch.equal(v, buffers[n]) for n, v in frozen_state(policy).items())


def write_fake_resnet18(torch_home: Path) -> dict[str, torch.Tensor]:
    """A cache file as torchvision writes it: its name, its keys (fc and the batch-norm counters
    included), random values."""
    torch.manual_seed(7)
    state = dict(resnet_backbone("resnet18").state_dict())
    for name in list(state):
        if name.endswith("running_var"):
            state[name] = torch.rand_like(state[name]) + 0.5
            state[name.replace("running_var", "num_batches_tracked")] = torch.tensor(100)
    full = {**state, "fc.weight": torch.randn(1000, 512), "fc.bias": torch.randn(1000)}
    path = torch_home / "hub" / "checkpoints" / RESNET18_FILE
    path.parent.mkdir(parents=True)
    torch.save(full, path)
    return {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}


def test_cached_imagenet_weights_are_loaded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a miss would fail, not download
    expected = write_fake_resnet18(tmp_path)
    url = resolve_weights("resnet18", "ResNet18_Weights.IMAGENET1K_V1")
    assert cached_weights_file(url) == tmp_path / "hub" / "checkpoints" / RESNET18_FILE
    assert ensure_backbone_weights("resnet18", "DEFAULT", offline=True) == cached_weights_file(url)
    policy = ACTPolicy(camera_config(pretrained_backbone_weights="ResNet18_Weights.IMAGENET1K_V1"))
    loaded = policy.model.backbone.state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[k], v) for k, v in expected.items())
    # Built to receive a checkpoint's weights (from_pretrained, resume): the file is not read.
    skipped = ACTPolicy(
        camera_config(pretrained_backbone_weights="DEFAULT"), pretrained_parts=False
    )
    assert not torch.equal(skipped.model.backbone.conv1.weight, expected["conv1.weight"])


def test_damaged_cache_file_is_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    path = tmp_path / "hub" / "checkpoints" / RESNET18_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(BackboneWeightsError, match=rf"{RESNET18_FILE}.*cannot be read.*=null"):
        ensure_backbone_weights("resnet18", "DEFAULT", offline=True)
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, path)
    with pytest.raises(BackboneWeightsError, match=r"does not hold resnet18.*missing"):
        ensure_backbone_weights("resnet18", "DEFAULT", offline=True)


def test_offline_with_an_empty_cache_fails_before_launch(
    diffusion_camera_root, tmp_path, monkeypatch, capsys
) -> None:
    """lerobot-train stops in its pre-launch checks (exit 2, nothing written) and says what to do."""
    dataset_root = diffusion_camera_root  # a 48x48 top camera, with its statistics
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    features = {
        "observation.images.top": {"type": "VISUAL", "shape": [3, 48, 48]},
        "observation.state": {"type": "STATE", "shape": [2]},
    }
    argv = [
        "--policy.type=act",
        f"--policy.input_features={json.dumps(features)}",
        f"--dataset.root={dataset_root}",
        f"--output_dir={tmp_path / 'out'}",
        "--steps=1",
    ]
    assert train_main(argv) == 2
    message = capsys.readouterr().err
    assert "--policy.pretrained_backbone_weights=ResNet18_Weights.IMAGENET1K_V1" in message
    assert "not in the cache" in message and "HF_HUB_OFFLINE" in message
    assert "--policy.pretrained_backbone_weights=null" in message
    assert not (tmp_path / "out").exists()
    # With random init the same flags pass the pre-launch checks.
    from lerobot_pipe.training.preflight import make_plan

    plan = make_plan(
        [*argv, "--policy.pretrained_backbone_weights=null"], 1, {"HF_HUB_OFFLINE": "1"}
    )
    assert plan.cfg.policy.pretrained_backbone_weights is None
