"""Runs inside LeRobot 0.6.1's own environment (its Python, torch, torchvision and diffusers),
driven by tests/policies/test_lerobot_diffusion.py. Files are exchanged as safetensors and JSON.

Usage: python lerobot_diffusion_driver.py <jobs.json> <results.json>; each job is a dict with a
"kind":
- "defaults": LeRobot's DiffusionConfig() with the job's features, as its config.json holds it.
- "load_and_act": LeRobot's DiffusionPolicy.from_pretrained(policy_dir, strict=True); with torch
  seeded ``seed``, the action chunk it predicts for the observation windows in ``batch``; its
  parameter names in order, state-dict keys and optimizer parameter order.
- "init_and_save": a LeRobot-initialised DiffusionPolicy for our config.json (seeded), batch
  norm statistics made non-trivial, saved with LeRobot's save_pretrained, and its action chunk
  (torch seeded ``seed``).
- "train_forward": the loaded policy in training mode: its global conditioning for ``batch`` and
  its U-Net's output for the given noisy actions, steps and that conditioning.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import draccus
import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
from lerobot.policies.factory import make_pre_post_processors
from safetensors.torch import load_file, save_file

OBS_IMAGES = "observation.images"


def _features(raw: dict) -> dict:
    from lerobot.configs.types import FeatureType, PolicyFeature

    return {
        k: PolicyFeature(type=FeatureType[v["type"]], shape=tuple(v["shape"]))
        for k, v in raw.items()
    }


def defaults(job: dict) -> dict:
    config = DiffusionConfig(
        input_features=_features(job["input_features"]),
        output_features=_features(job["output_features"]),
    )
    encoded = draccus.encode(config, PreTrainedConfig)
    encoded.pop("type", None)
    return json.loads(json.dumps(encoded))


def _stacked(policy: DiffusionPolicy, batch: dict) -> dict:
    batch = dict(batch)
    batch[OBS_IMAGES] = torch.stack([batch[k] for k in policy.config.image_features], dim=-4)
    return batch


def _actions(policy: DiffusionPolicy, batch: dict, seed: int) -> torch.Tensor:
    policy.eval()
    policy.reset()
    torch.manual_seed(seed)
    return policy.predict_action_chunk(batch).contiguous()


def load_and_act(job: dict) -> dict:
    policy = DiffusionPolicy.from_pretrained(job["policy_dir"], strict=True)
    actions = _actions(policy, load_file(job["batch"]), job["seed"])
    save_file({"actions": actions}, job["out"])
    names = {id(p): n for n, p in policy.named_parameters()}
    return {
        "parameter_names": [n for n, _ in policy.named_parameters()],
        "state_dict_keys": sorted(policy.state_dict()),
        "optimizer_order": [names[id(p)] for p in policy.get_optim_params()],
    }


def init_and_save(job: dict) -> dict:
    config = PreTrainedConfig.from_pretrained(job["config_dir"])
    config.device = "cpu"
    torch.manual_seed(job["seed"])
    policy = DiffusionPolicy(config)
    generator = torch.Generator().manual_seed(job["seed"])
    for name, buffer in policy.named_buffers():
        if name.endswith("running_var"):
            buffer.copy_(0.5 + torch.rand(buffer.shape, generator=generator))
        elif name.endswith("running_mean"):
            buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
    policy.save_pretrained(job["out_dir"])
    out_dir = Path(job["out_dir"])
    actions = _actions(policy, load_file(job["batch"]), job["seed"])
    save_file({"actions": actions}, str(out_dir / "actions.safetensors"))
    # LeRobot's processors for the job's statistics, saved beside the policy, and what they
    # compute: the observations normalized, an action chunk unnormalized.
    stats: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in load_file(job["stats"]).items():
        feature, stat = key.rsplit("/", 1)
        stats.setdefault(feature, {})[stat] = value
    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    pre.save_pretrained(out_dir)
    post.save_pretrained(out_dir)
    raw = load_file(job["batch"])
    action_out = torch.randn(
        len(raw["observation.state"]), config.n_action_steps, config.action_feature.shape[0]
    )
    normalized = {k: v.contiguous() for k, v in pre(dict(raw)).items() if k in raw}
    normalized["unnormalized"] = post(action_out).contiguous()
    save_file({**raw, "action_out": action_out}, str(out_dir / "raw.safetensors"))
    save_file(normalized, str(out_dir / "normalized.safetensors"))
    return {"parameter_names": [n for n, _ in policy.named_parameters()]}


def train_forward(job: dict) -> dict:
    policy = DiffusionPolicy.from_pretrained(job["policy_dir"], strict=True)
    policy.train()
    inputs = load_file(job["inputs"])
    with torch.no_grad():
        cond = policy.diffusion._prepare_global_conditioning(
            _stacked(policy, load_file(job["batch"]))
        )
        pred = policy.diffusion.unet(inputs["noisy"], inputs["timesteps"], global_cond=cond)
    save_file({"global_cond": cond.contiguous(), "pred": pred.contiguous()}, job["out"])
    return {}


KINDS = {
    "defaults": defaults,
    "load_and_act": load_and_act,
    "init_and_save": init_and_save,
    "train_forward": train_forward,
}


def main() -> None:
    torch.set_num_threads(1)
    jobs = json.loads(Path(sys.argv[1]).read_text())
    results = {name: KINDS[job["kind"]](job) for name, job in jobs.items()}
    Path(sys.argv[2]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
