"""Runs inside LeRobot 0.6.1's own environment (its Python, torch and torchvision), driven by
tests/policies/test_lerobot_act_vision.py. Files are exchanged as safetensors and JSON only.

Usage: python lerobot_act_driver.py <jobs.json> <results.json>; each job is a dict with a "kind":
- "load_and_act": LeRobot's ACTPolicy.from_pretrained(policy_dir, strict=True), the action chunk
  it predicts for the frames in ``batch``, its parameter names in order and its optimizer groups.
- "init_and_save": a LeRobot-initialised ACTPolicy for our config.json (seeded), frozen batch
  norm statistics made non-trivial, saved with LeRobot's save_pretrained, and its action chunk.
- "resnet": torchvision's ResNet with FrozenBatchNorm2d up to layer4 (as LeRobot builds it),
  strictly loaded with our backbone weights; its feature map for ``input``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torchvision
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from safetensors.torch import load_file, save_file
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.ops.misc import FrozenBatchNorm2d


def _optimizer_groups(policy: ACTPolicy) -> list[list[str]]:
    names = {id(p): n for n, p in policy.named_parameters()}
    return [[names[id(p)] for p in group["params"]] for group in policy.get_optim_params()]


def load_and_act(job: dict) -> dict:
    policy = ACTPolicy.from_pretrained(job["policy_dir"], strict=True)
    policy.eval()
    actions = policy.predict_action_chunk(load_file(job["batch"]))
    save_file({"actions": actions.contiguous()}, job["out"])
    return {
        "parameter_names": [n for n, _ in policy.named_parameters()],
        "state_dict_keys": sorted(policy.state_dict()),
        "optimizer_groups": _optimizer_groups(policy),
    }


def init_and_save(job: dict) -> dict:
    config = PreTrainedConfig.from_pretrained(job["config_dir"])
    config.device = "cpu"
    torch.manual_seed(job["seed"])
    policy = ACTPolicy(config)
    generator = torch.Generator().manual_seed(job["seed"])
    for name, buffer in policy.named_buffers():
        if name.startswith("model.backbone.") and name.endswith(("running_var", "weight")):
            buffer.copy_(0.5 + torch.rand(buffer.shape, generator=generator))
        elif name.startswith("model.backbone.") and name.endswith(("running_mean", "bias")):
            buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
    policy.save_pretrained(job["out_dir"])
    policy.eval()
    actions = policy.predict_action_chunk(load_file(job["batch"]))
    save_file({"actions": actions.contiguous()}, str(Path(job["out_dir"]) / "actions.safetensors"))
    return {"parameter_names": [n for n, _ in policy.named_parameters()]}


def resnet(job: dict) -> dict:
    model = getattr(torchvision.models, job["name"])(
        replace_stride_with_dilation=[False, False, job["dilation"]],
        weights=None,
        norm_layer=FrozenBatchNorm2d,
    )
    backbone = IntermediateLayerGetter(model, return_layers={"layer4": "feature_map"})
    backbone.load_state_dict(load_file(job["weights"]), strict=True)
    backbone.eval()
    with torch.no_grad():
        features = backbone(load_file(job["input"])["input"])["feature_map"]
    save_file({"features": features.contiguous()}, job["out"])
    return {"state_dict_keys": list(backbone.state_dict())}


KINDS = {"load_and_act": load_and_act, "init_and_save": init_and_save, "resnet": resnet}


def main() -> None:
    torch.set_num_threads(1)
    jobs = json.loads(Path(sys.argv[1]).read_text())
    results = {name: KINDS[job["kind"]](job) for name, job in jobs.items()}
    Path(sys.argv[2]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
