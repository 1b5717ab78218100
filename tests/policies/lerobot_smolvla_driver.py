"""Runs inside LeRobot 0.6.1's own environment (its Python, torch and transformers), driven by
tests/policies/test_lerobot_smolvla.py. Files are exchanged as safetensors and JSON.

Usage: python lerobot_smolvla_driver.py <jobs.json> <results.json>; each job is a dict with a
"kind":
- "defaults": LeRobot's SmolVLAConfig() encoded as its config.json holds it.
- "run": LeRobot's SmolVLAPolicy.from_pretrained(policy_dir) (with ``dataset_root``: the policy
  as lerobot-eval builds it, ``make_policy``, which takes the PEFT path for an adapter folder) and
  its processors through make_pre_post_processors(pretrained_path=policy_dir) with lerobot-eval's
  overrides; for the raw batch in ``inputs`` (+ ``tasks``): the preprocessed tokens and mask, the
  loss from the given noise and time, and the actions from the given noise (postprocessed); its
  model's state-dict keys (a PeftModel's: its base policy's, and the adapter's as peft saves
  them).
- "init_and_save": a LeRobot-initialised SmolVLAPolicy (seeded) for our config.json (with
  ``load_vlm_weights`` it reads the VLM folder's weights), saved with its processors (built from
  ``stats``) into ``out_dir``; its state-dict keys and dtypes.
- "tasks": LeRobot's LeRobotDataset(root)[i]["task"] for the job's indices.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import draccus
import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.factory import make_pre_post_processors
from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
from safetensors.torch import load_file, save_file


def defaults(job: dict) -> dict:
    encoded = draccus.encode(SmolVLAConfig(), PreTrainedConfig)
    encoded.pop("type", None)
    return json.loads(json.dumps(encoded))


def run(job: dict) -> dict:
    folder = Path(job["policy_dir"])
    keys = {}
    if "dataset_root" in job:
        from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
        from lerobot.policies.factory import make_policy

        config = PreTrainedConfig.from_pretrained(str(folder))
        config.pretrained_path = folder
        config.device = "cpu"
        meta = LeRobotDatasetMetadata("local/smolvla", root=job["dataset_root"])
        policy = make_policy(config, ds_meta=meta)
        if hasattr(policy, "get_base_model"):  # a PeftModel
            from peft import get_peft_model_state_dict

            keys["adapter_keys"] = sorted(get_peft_model_state_dict(policy))
            keys["peft"] = type(policy).__name__
    else:
        policy = SmolVLAPolicy.from_pretrained(str(folder))
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    policy.eval()
    pre, post = make_pre_post_processors(
        policy.config,
        pretrained_path=str(folder),
        preprocessor_overrides={
            "device_processor": {"device": "cpu"},
            "rename_observations_processor": {"rename_map": {}},
        },
    )
    raw = load_file(job["inputs"])
    batch = {k: v for k, v in raw.items() if k not in ("noise", "time")}
    batch["task"] = list(job["tasks"])
    processed = pre(batch)
    with torch.no_grad():
        loss, _ = policy.forward(dict(processed), noise=raw["noise"], time=raw["time"])
        per_sample, _ = policy.forward(
            dict(processed), noise=raw["noise"], time=raw["time"], reduction="none"
        )
        base.reset()
        actions = base.predict_action_chunk(dict(processed), noise=raw["noise"])
    out = {
        "tokens": processed["observation.language.tokens"].contiguous(),
        "mask": processed["observation.language.attention_mask"].contiguous(),
        "state": processed["observation.state"].contiguous(),
        "loss": loss.detach().reshape(1),
        "per_sample": per_sample.detach(),
        "actions": actions,
        "actions_post": post(actions),
    }
    save_file({k: v.contiguous() for k, v in out.items()}, job["out"])
    if "adapter_keys" in keys:  # the base's names are the base checkpoint's (peft wraps layers)
        return keys
    return {"keys": sorted(base.state_dict())}


def init_and_save(job: dict) -> dict:
    config = PreTrainedConfig.from_pretrained(job["config_dir"])
    config.device = "cpu"
    torch.manual_seed(job["seed"])
    policy = SmolVLAPolicy(config)
    stats = {k: {s: torch.tensor(v) for s, v in d.items()} for k, d in job["stats"].items()}
    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    out = Path(job["out_dir"])
    policy.save_pretrained(out)
    pre.save_pretrained(out)
    post.save_pretrained(out)
    return {
        "keys": sorted(policy.state_dict()),
        "dtypes": {k: str(v.dtype) for k, v in policy.state_dict().items()},
    }


def tasks(job: dict) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/tasks", root=job["root"], video_backend="pyav")
    return {"tasks": [ds[i]["task"] for i in job["indices"]]}


KINDS = {"defaults": defaults, "run": run, "init_and_save": init_and_save, "tasks": tasks}


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    results = [KINDS[job["kind"]](job) for job in jobs]
    Path(sys.argv[2]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
