"""ACT with cameras against LeRobot 0.6.1 itself (its Python, torch and torchvision): our weights
load strictly in LeRobot's ACTPolicy and LeRobot's in ours, both predict the same actions on the
same frames, parameters come in LeRobot's order, and our ResNet computes torchvision's features.

LeRobot runs in its own environment (tests/upstream.py: ``make lerobot-venv`` or
``$LEROBOT_UPSTREAM_PYTHON``) as a subprocess, driven by lerobot_act_driver.py; files are
exchanged as safetensors. Skipped, saying what to install, where it is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from upstream import find_upstream

from lerobot_pipe.policies.act import ACTConfig, ACTPolicy
from lerobot_pipe.policies.vision import resnet_backbone

UPSTREAM, WHY_NOT = find_upstream()
DRIVER = Path(__file__).with_name("lerobot_act_driver.py")
CAMERAS = ("observation.images.top", "observation.images.wrist")
BATCH, HW, STATE_DIM, ENV_DIM, ACTION_DIM = 2, (64, 64), 3, 5, 2
RESNETS = {"resnet18": False, "resnet50_dilated": True}

pytestmark = [pytest.mark.interop, pytest.mark.skipif(UPSTREAM is None, reason=WHY_NOT)]


def camera_config() -> ACTConfig:
    inputs = {key: {"type": "VISUAL", "shape": [3, *HW]} for key in CAMERAS}
    inputs["observation.state"] = {"type": "STATE", "shape": [STATE_DIM]}
    inputs["observation.environment_state"] = {"type": "ENV", "shape": [ENV_DIM]}
    return ACTConfig.tiny(
        input_features=inputs,
        output_features={"action": {"type": "ACTION", "shape": [ACTION_DIM]}},
        pretrained_backbone_weights=None,
        device="cpu",
    )


def randomize_frozen_batch_norm(module: torch.nn.Module, seed: int) -> None:
    """Non-trivial statistics and affine terms, so that the batch-norm arithmetic is compared."""
    gen = torch.Generator().manual_seed(seed)
    for name, buffer in module.named_buffers():
        if name.endswith(("running_var", "weight")):
            buffer.copy_(0.5 + torch.rand(buffer.shape, generator=gen))
        elif name.endswith(("running_mean", "bias")):
            buffer.copy_(0.1 * torch.randn(buffer.shape, generator=gen))


def frames(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    batch = {key: torch.rand(BATCH, 3, *HW, generator=gen) for key in CAMERAS}
    batch["observation.state"] = torch.randn(BATCH, STATE_DIM, generator=gen)
    batch["observation.environment_state"] = torch.randn(BATCH, ENV_DIM, generator=gen)
    return batch


def optimizer_groups(policy: ACTPolicy) -> list[list[str]]:
    names = {id(p): n for n, p in policy.named_parameters()}
    return [[names[id(p)] for p in group["params"]] for group in policy.get_optim_params()]


@pytest.fixture(scope="module")
def exchange(tmp_path_factory) -> dict:
    """Everything prepared here, one LeRobot process for every job, the results."""
    root = tmp_path_factory.mktemp("lerobot_act")
    torch.manual_seed(0)
    ours = ACTPolicy(camera_config())
    randomize_frozen_batch_norm(ours.model.backbone, seed=1)
    ours.save_pretrained(root / "ours")
    batch = frames(seed=2)
    save_file(batch, str(root / "batch.safetensors"))
    jobs: dict[str, dict] = {
        "ours": {
            "kind": "load_and_act",
            "policy_dir": str(root / "ours"),
            "batch": str(root / "batch.safetensors"),
            "out": str(root / "ours_actions.safetensors"),
        },
        "theirs": {
            "kind": "init_and_save",
            "config_dir": str(root / "ours"),
            "seed": 3,
            "batch": str(root / "batch.safetensors"),
            "out_dir": str(root / "theirs"),
        },
    }
    features = {}
    for job, dilation in RESNETS.items():
        torch.manual_seed(4)
        backbone = resnet_backbone(job.split("_")[0], replace_final_stride_with_dilation=dilation)
        randomize_frozen_batch_norm(backbone, seed=5)
        image = torch.rand(2, 3, *HW, generator=torch.Generator().manual_seed(6))
        save_file(backbone.state_dict(), str(root / f"{job}_weights.safetensors"))
        save_file({"input": image}, str(root / f"{job}_input.safetensors"))
        with torch.no_grad():
            features[job] = (backbone(image), list(backbone.state_dict()))
        jobs[job] = {
            "kind": "resnet",
            "name": job.split("_")[0],
            "dilation": dilation,
            "weights": str(root / f"{job}_weights.safetensors"),
            "input": str(root / f"{job}_input.safetensors"),
            "out": str(root / f"{job}_features.safetensors"),
        }
    (root / "jobs.json").write_text(json.dumps(jobs))
    UPSTREAM.run_script(
        DRIVER, root / "jobs.json", root / "results.json", home=root / ".hf_home", timeout=300
    )
    return {
        "root": root,
        "ours": ours,
        "batch": batch,
        "features": features,
        "results": json.loads((root / "results.json").read_text()),
    }


def test_our_weights_load_strictly_in_lerobot_and_act_alike(exchange) -> None:
    ours, result = exchange["ours"], exchange["results"]["ours"]
    # The order LeRobot numbers parameters in (optimizer_state.safetensors) and its two groups.
    assert result["parameter_names"] == [n for n, _ in ours.named_parameters()]
    assert any(n.startswith("model.backbone.layer4.1.") for n in result["parameter_names"])
    assert result["state_dict_keys"] == sorted(ours.state_dict())
    assert result["optimizer_groups"] == optimizer_groups(ours)
    theirs = load_file(exchange["root"] / "ours_actions.safetensors")["actions"]
    mine = ours.predict_action_chunk(exchange["batch"])
    assert mine.shape == (BATCH, ours.config.chunk_size, ACTION_DIM)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)


def test_lerobot_weights_load_strictly_here_and_act_alike(exchange) -> None:
    folder = exchange["root"] / "theirs"
    loaded = ACTPolicy.from_pretrained(folder)  # strict: every key, nothing more
    assert [n for n, _ in loaded.named_parameters()] == exchange["results"]["theirs"][
        "parameter_names"
    ]
    state = load_file(folder / "model.safetensors")
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, state[key]), key
    theirs = load_file(folder / "actions.safetensors")["actions"]
    torch.testing.assert_close(
        loaded.predict_action_chunk(exchange["batch"]), theirs, rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("job", list(RESNETS))
def test_resnet_features_equal_torchvision(exchange, job: str) -> None:
    mine, keys = exchange["features"][job]
    assert exchange["results"][job]["state_dict_keys"] == keys
    theirs = load_file(exchange["root"] / f"{job}_features.safetensors")["features"]
    assert mine.shape == theirs.shape == ((2, 2048, 4, 4) if RESNETS[job] else (2, 512, 2, 2))
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
