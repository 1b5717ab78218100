"""Diffusion Policy against LeRobot 0.6.1 itself (its Python, torch, torchvision and diffusers):
the same config fields and defaults, our weights load strictly in LeRobot's DiffusionPolicy and
LeRobot's in ours (with its processors), parameters come in LeRobot's order, and with DDIM and
the same seed both predict the same actions on the same frames; in training mode the observation
encoders (trainable batch norm) and the U-Net compute the same.

Two configurations: ``bn`` (two cameras, resize + centre crop, a ResNet per camera with batch
norm, DDIM with 5 of 10 steps, environment state, epsilon prediction) and ``gn`` (one camera of a
single observation step, random crop, one shared ResNet with group norm, bias-only FiLM, sample
prediction, DDPM).

LeRobot runs in its own environment (tests/upstream.py: ``make lerobot-venv`` or
``$LEROBOT_UPSTREAM_PYTHON``) as a subprocess, driven by lerobot_diffusion_driver.py; files
are exchanged as safetensors. Skipped, saying what to install, where it is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from upstream import find_upstream

from lerobot_pipe.configs.parser import to_dict
from lerobot_pipe.policies.diffusion import DiffusionConfig, DiffusionPolicy
from lerobot_pipe.policies.factory import make_pre_post_processors

UPSTREAM, WHY_NOT = find_upstream()
DRIVER = Path(__file__).with_name("lerobot_diffusion_driver.py")
CAMERAS = ("observation.images.top", "observation.images.wrist")
BATCH, HW, STATE_DIM, ENV_DIM, ACTION_DIM = 2, (64, 64), 3, 4, 2
VARIANTS = {
    "bn": dict(
        cameras=CAMERAS,
        env=True,
        resize_shape=(48, 48),
        crop_ratio=0.875,
        crop_is_random=False,
        noise_scheduler_type="DDIM",
        num_inference_steps=5,
    ),
    "gn": dict(
        cameras=CAMERAS[:1],
        env=False,
        n_obs_steps=1,
        crop_shape=(56, 56),
        use_group_norm=True,
        use_separate_rgb_encoder_per_camera=False,
        use_film_scale_modulation=False,
        prediction_type="sample",
        noise_scheduler_type="DDPM",
    ),
}

pytestmark = [pytest.mark.interop, pytest.mark.skipif(UPSTREAM is None, reason=WHY_NOT)]


def features(cameras, env: bool) -> tuple[dict, dict]:
    inputs = {key: {"type": "VISUAL", "shape": [3, *HW]} for key in cameras}
    inputs["observation.state"] = {"type": "STATE", "shape": [STATE_DIM]}
    if env:
        inputs["observation.environment_state"] = {"type": "ENV", "shape": [ENV_DIM]}
    return inputs, {"action": {"type": "ACTION", "shape": [ACTION_DIM]}}


def variant_config(name: str) -> DiffusionConfig:
    fields = dict(VARIANTS[name])
    inputs, outputs = features(fields.pop("cameras"), fields.pop("env"))
    return DiffusionConfig.tiny(
        input_features=inputs,
        output_features=outputs,
        pretrained_backbone_weights=None,
        device="cpu",
        **fields,
    )


def randomize_batch_norm(module: torch.nn.Module, seed: int) -> None:
    """Non-trivial running statistics, so that eval-mode batch norm arithmetic is compared."""
    gen = torch.Generator().manual_seed(seed)
    for name, buffer in module.named_buffers():
        if name.endswith("running_var"):
            buffer.copy_(0.5 + torch.rand(buffer.shape, generator=gen))
        elif name.endswith("running_mean"):
            buffer.copy_(0.1 * torch.randn(buffer.shape, generator=gen))


def observations(cfg: DiffusionConfig, seed: int) -> dict[str, torch.Tensor]:
    """Normalized observation windows (B, n_obs_steps, ...)."""
    gen = torch.Generator().manual_seed(seed)
    steps = cfg.n_obs_steps
    batch = {k: torch.rand(BATCH, steps, 3, *HW, generator=gen) for k in cfg.image_features}
    batch["observation.state"] = torch.randn(BATCH, steps, STATE_DIM, generator=gen)
    if cfg.env_state_feature is not None:
        batch["observation.environment_state"] = torch.randn(BATCH, steps, ENV_DIM, generator=gen)
    if steps == 1:  # a single step may come without its step dimension, as LeRobot accepts
        batch = {k: v[:, 0] if k in cfg.image_features else v for k, v in batch.items()}
    return batch


def dataset_stats(cfg: DiffusionConfig) -> dict[str, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(9)
    stats = {}
    for key, ft in {**cfg.input_features, **cfg.output_features}.items():
        shape = (3, 1, 1) if ft["type"] == "VISUAL" else tuple(ft["shape"])
        low = torch.randn(shape, generator=gen)
        stats[key] = {
            "mean": torch.randn(shape, generator=gen),
            "std": 0.5 + torch.rand(shape, generator=gen),
            "min": low,
            "max": low + 1 + torch.rand(shape, generator=gen),
        }
    return stats


def optimizer_order(policy: DiffusionPolicy) -> list[str]:
    names = {id(p): n for n, p in policy.named_parameters()}
    return [names[id(p)] for group in policy.get_optim_params() for p in group["params"]]


@pytest.fixture(scope="module")
def exchange(tmp_path_factory) -> dict:
    """Everything prepared here, one LeRobot process for every job, the results."""
    root = tmp_path_factory.mktemp("lerobot_diffusion")
    jobs: dict[str, dict] = {}
    prepared: dict[str, dict] = {}
    for name in VARIANTS:
        cfg = variant_config(name)
        torch.manual_seed(0)
        ours = DiffusionPolicy(cfg)
        randomize_batch_norm(ours, seed=1)
        ours.save_pretrained(root / f"{name}_ours")
        batch = observations(cfg, seed=2)
        save_file(batch, str(root / f"{name}_batch.safetensors"))
        stats = dataset_stats(cfg)
        save_file(
            {f"{k}/{s}": v for k, d in stats.items() for s, v in d.items()},
            str(root / f"{name}_stats.safetensors"),
        )
        prepared[name] = {"cfg": cfg, "ours": ours, "batch": batch, "stats": stats}
        jobs[f"{name}_defaults"] = {
            "kind": "defaults",
            "input_features": cfg.input_features,
            "output_features": cfg.output_features,
        }
        jobs[f"{name}_ours"] = {
            "kind": "load_and_act",
            "policy_dir": str(root / f"{name}_ours"),
            "batch": str(root / f"{name}_batch.safetensors"),
            "seed": 3,
            "out": str(root / f"{name}_ours_actions.safetensors"),
        }
        jobs[f"{name}_theirs"] = {
            "kind": "init_and_save",
            "config_dir": str(root / f"{name}_ours"),
            "seed": 4,
            "batch": str(root / f"{name}_batch.safetensors"),
            "stats": str(root / f"{name}_stats.safetensors"),
            "out_dir": str(root / f"{name}_theirs"),
        }
    cfg = prepared["bn"]["cfg"]
    gen = torch.Generator().manual_seed(5)
    train_inputs = {
        "noisy": torch.randn(BATCH, cfg.horizon, ACTION_DIM, generator=gen),
        "timesteps": torch.randint(0, cfg.num_train_timesteps, (BATCH,), generator=gen),
    }
    save_file(train_inputs, str(root / "train_inputs.safetensors"))
    prepared["train_inputs"] = train_inputs
    jobs["bn_train"] = {
        "kind": "train_forward",
        "policy_dir": str(root / "bn_ours"),
        "batch": str(root / "bn_batch.safetensors"),
        "inputs": str(root / "train_inputs.safetensors"),
        "out": str(root / "bn_train.safetensors"),
    }
    (root / "jobs.json").write_text(json.dumps(jobs))
    UPSTREAM.run_script(
        DRIVER, root / "jobs.json", root / "results.json", home=root / ".hf_home", timeout=600
    )
    return {
        "root": root,
        "results": json.loads((root / "results.json").read_text()),
        **prepared,
    }


def our_actions(policy: DiffusionPolicy, batch: dict, seed: int) -> torch.Tensor:
    policy.reset()
    torch.manual_seed(seed)
    return policy.predict_action_chunk(batch)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_config_fields_and_defaults_are_lerobots(exchange, name: str) -> None:
    cfg = exchange[name]["cfg"]
    theirs = exchange["results"][f"{name}_defaults"]
    ours = to_dict(
        DiffusionConfig(input_features=cfg.input_features, output_features=cfg.output_features)
    )
    ours.pop("type")
    assert sorted(ours) == sorted(theirs)
    # LeRobot's JSON of PolicyFeature and NormalizationMode values carries the same content.
    for key in ("input_features", "output_features"):
        assert {
            k: {"type": v["type"], "shape": list(v["shape"])} for k, v in theirs[key].items()
        } == ours[key]
    # LeRobot resolves device None to the machine's; push_to_hub is False here by design.
    for key, value in ours.items():
        if key not in ("input_features", "output_features", "device", "push_to_hub"):
            assert theirs[key] == value, key


@pytest.mark.parametrize("name", list(VARIANTS))
def test_our_weights_load_strictly_in_lerobot_and_act_alike(exchange, name: str) -> None:
    ours, result = exchange[name]["ours"], exchange["results"][f"{name}_ours"]
    # The order LeRobot numbers parameters in (optimizer_state.safetensors), one group.
    assert result["parameter_names"] == [n for n, _ in ours.named_parameters()]
    assert result["state_dict_keys"] == sorted(ours.state_dict())
    assert result["optimizer_order"] == optimizer_order(ours)
    theirs = load_file(exchange["root"] / f"{name}_ours_actions.safetensors")["actions"]
    mine = our_actions(ours, exchange[name]["batch"], seed=3)
    cfg = exchange[name]["cfg"]
    assert mine.shape == (BATCH, cfg.n_action_steps, ACTION_DIM)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_lerobot_weights_and_processors_load_here_and_act_alike(exchange, name: str) -> None:
    folder = exchange["root"] / f"{name}_theirs"
    loaded = DiffusionPolicy.from_pretrained(folder)  # strict: every key, nothing more
    assert [n for n, _ in loaded.named_parameters()] == exchange["results"][f"{name}_theirs"][
        "parameter_names"
    ]
    state = load_file(folder / "model.safetensors")
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, state[key]), key
    theirs = load_file(folder / "actions.safetensors")["actions"]
    torch.testing.assert_close(
        our_actions(loaded, exchange[name]["batch"], seed=4), theirs, rtol=0, atol=1e-5
    )
    # LeRobot's preprocessor and postprocessor (MIN_MAX state and action) load and compute alike.
    pre, post = make_pre_post_processors(loaded.config, pretrained_path=folder)
    expected = load_file(folder / "normalized.safetensors")
    raw = load_file(folder / "raw.safetensors")
    normalized = pre({k: v for k, v in raw.items() if k != "action_out"})
    for key, value in expected.items():
        if key != "unnormalized":
            torch.testing.assert_close(normalized[key], value, rtol=0, atol=1e-6)
    torch.testing.assert_close(post(raw["action_out"]), expected["unnormalized"], rtol=0, atol=1e-6)


def test_training_mode_encoders_and_unet_compute_lerobots(exchange) -> None:
    """Batch norm on batch statistics (training mode), centre crop, FiLM U-Net."""
    ours = exchange["bn"]["ours"]
    ours.train()
    batch = ours._stack_cameras(exchange["bn"]["batch"], add_step_dim=False)
    inputs = exchange["train_inputs"]
    with torch.no_grad():
        cond = ours.diffusion.global_conditioning(batch, keys=None)
        pred = ours.diffusion.unet(inputs["noisy"], inputs["timesteps"], global_cond=cond)
    theirs = load_file(exchange["root"] / "bn_train.safetensors")
    torch.testing.assert_close(cond, theirs["global_cond"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pred, theirs["pred"], rtol=1e-5, atol=1e-5)
