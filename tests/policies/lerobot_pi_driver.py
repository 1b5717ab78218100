"""Runs inside LeRobot 0.6.1's own environment (its Python, torch and transformers) for the pi0 /
pi0.5 interop tests. Files are exchanged as safetensors and JSON.

LeRobot 0.6.1 builds only the full-size Gemma variants (gemma_2b, gemma_300m) with a full-size
SigLIP. At import this script patches LeRobot, in this process only, so that the variant
``"dummy"`` is openpi's dummy Gemma (width 64, depth 4, mlp 128, 8 heads, 1 KV head, head_dim 16)
for either stack, and a PaliGemma whose text width is the dummy's gets the tiny SigLIP of
tests/pi_tiny.py (hidden 32, intermediate 64, 2 layers, 2 heads, patch 14) projected to width 64.
Three things are patched and nothing else: the variant check of PI0Config / PI05Config's
``__post_init__``, ``get_gemma_config`` of modeling_pi0 and modeling_pi05, and the PaliGemma
constructor those modules call (its vision config is set before the model is built).

Usage: python lerobot_pi_driver.py <jobs.json> <results.json>; each job is a dict with a "kind":
- "defaults": LeRobot's PI0Config() or PI05Config() (job's "policy": "pi0" | "pi05") encoded as
  its config.json holds it (without "type").
- "init_and_save": a LeRobot-initialised PI0Policy / PI05Policy (seeded) for the config.json in
  ``config_dir``, saved with its processors (built from ``stats``) into ``out_dir``; its
  state-dict keys, dtypes and shapes.
- "run": LeRobot's Policy.from_pretrained(policy_dir) and its processors through
  make_pre_post_processors(pretrained_path=policy_dir) with lerobot-eval's overrides. Every
  tensor of the model is checked against the file (LeRobot's pi ``from_pretrained`` prints a
  failed load and keeps random weights): ``mismatched`` / ``missing`` / ``unexpected`` must be
  empty. For the raw batch in ``inputs`` (observation.state, observation.images.*, action,
  action_is_pad, noise, time) and ``tasks``, writes to ``out``: the preprocessed tokens, mask
  and state, the loss (mean) and per-sample loss (reduction="none") from the given noise
  (B, chunk_size, max_action_dim) and time (B,), the action chunk from the given noise and the
  postprocessed chunk. Returns the state-dict keys and the prompts the tokenizer was given.
  With ``dataset_root``: the policy as lerobot-eval builds it (``make_policy``, which takes the
  PEFT path for an adapter folder; the adapter's tensors are checked against its file).
- "train": LeRobot's own lerobot-train with the job's ``argv``, in this (patched) process.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import draccus
import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.factory import make_pre_post_processors
from lerobot.policies.pi0 import configuration_pi0, modeling_pi0
from lerobot.policies.pi05 import configuration_pi05, modeling_pi05
from safetensors.torch import load_file, save_file

DUMMY = "dummy"
# openpi's dummy Gemma (src/openpi/models/gemma.py) and the tiny SigLIP of tests/pi_tiny.py.
DUMMY_GEMMA = dict(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16)
DUMMY_SIGLIP = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    patch_size=14,
)
POLICIES = {
    "pi0": (configuration_pi0.PI0Config, modeling_pi0.PI0Policy),
    "pi05": (configuration_pi05.PI05Config, modeling_pi05.PI05Policy),
}


def _patch_variant_check(config_class: type) -> None:
    """``__post_init__`` accepts only gemma_300m / gemma_2b: it sees gemma_2b in place of dummy."""
    original = config_class.__post_init__

    def post_init(self) -> None:
        dummies = [
            name
            for name in ("paligemma_variant", "action_expert_variant")
            if getattr(self, name) == DUMMY
        ]
        for name in dummies:
            setattr(self, name, "gemma_2b")
        try:
            original(self)
        finally:
            for name in dummies:
                setattr(self, name, DUMMY)

    config_class.__post_init__ = post_init


def _patch_gemma_config(module) -> None:
    original = module.get_gemma_config

    def get_gemma_config(variant: str):
        if variant == DUMMY:
            return module.GemmaConfig(**DUMMY_GEMMA)
        return original(variant)

    module.get_gemma_config = get_gemma_config


def _patch_siglip(module) -> None:
    """PaliGemmaWithExpertModel sets SigLIP's intermediate size 4304 and projection 2048 on
    transformers' So400m defaults, then builds the PaliGemma: a dummy-width one gets the tiny
    SigLIP, projected to the dummy width, just before it is built."""
    original = module.PaliGemmaForConditionalGenerationWithPiGemma

    def build(config):
        width = config.text_config.hidden_size
        if width == DUMMY_GEMMA["width"]:
            for name, value in DUMMY_SIGLIP.items():
                setattr(config.vision_config, name, value)
            config.vision_config.projection_dim = width
            config.projection_dim = width
            vision = config.vision_config
            config.text_config.num_image_tokens = (vision.image_size // vision.patch_size) ** 2
        return original(config=config)

    module.PaliGemmaForConditionalGenerationWithPiGemma = build


for _config_class in (configuration_pi0.PI0Config, configuration_pi05.PI05Config):
    _patch_variant_check(_config_class)
for _module in (modeling_pi0, modeling_pi05):
    _patch_gemma_config(_module)
    _patch_siglip(_module)


def defaults(job: dict) -> dict:
    config_class, _ = POLICIES[job["policy"]]
    encoded = draccus.encode(config_class(), PreTrainedConfig)
    encoded.pop("type", None)
    return json.loads(json.dumps(encoded))


def _state_dict_facts(policy) -> dict:
    state = policy.state_dict()
    return {
        "keys": sorted(state),
        "dtypes": {k: str(v.dtype).removeprefix("torch.") for k, v in state.items()},
        "shapes": {k: list(v.shape) for k, v in state.items()},
    }


def init_and_save(job: dict) -> dict:
    config = PreTrainedConfig.from_pretrained(job["config_dir"])
    config.device = "cpu"
    _, policy_class = POLICIES[config.type]
    torch.manual_seed(job["seed"])
    policy = policy_class(config)
    stats = {k: {s: torch.tensor(v) for s, v in d.items()} for k, d in job["stats"].items()}
    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    out = Path(job["out_dir"])
    policy.save_pretrained(out)
    pre.save_pretrained(out)
    post.save_pretrained(out)
    return {"parameters": sum(p.numel() for p in policy.parameters()), **_state_dict_facts(policy)}


def _loaded_as_filed(policy, folder: Path) -> dict:
    """Which of the model's tensors differ from model.safetensors: each is compared with the
    file's own tensor of that name (``model.``-prefixed), or, for a name only LeRobot's key fixes
    give (``_fix_pytorch_state_dict_keys``: lm_head copied into embed_tokens), with that."""
    raw = load_file(str(folder / "model.safetensors"))
    prefixed = {k if k.startswith("model.") else f"model.{k}": v for k, v in raw.items()}
    fixed = policy._fix_pytorch_state_dict_keys(raw, policy.config)
    fixed = {k if k.startswith("model.") else f"model.{k}": v for k, v in fixed.items()}
    filed = {**fixed, **{k: v for k, v in prefixed.items() if k in fixed}}
    state = policy.state_dict()
    return {
        "mismatched": sorted(
            k
            for k in state.keys() & filed.keys()
            if not torch.equal(state[k], filed[k].to(state[k].dtype))
        ),
        "missing": sorted(state.keys() - filed.keys()),
        "unexpected": sorted(fixed.keys() - state.keys()),
    }


@contextlib.contextmanager
def _drawn(model, noise: torch.Tensor, time: torch.Tensor):
    """LeRobot's pi forward draws its noise and time itself: it gets these instead."""

    def sample_noise(shape, device):
        if tuple(shape) != tuple(noise.shape):
            raise ValueError(f"noise has shape {tuple(noise.shape)}, the model draws {shape}")
        return noise.to(device)

    def sample_time(bsize, device):
        if bsize != time.shape[0]:
            raise ValueError(f"time has {time.shape[0]} values, the batch {bsize}")
        return time.to(device)

    model.sample_noise, model.sample_time = sample_noise, sample_time
    try:
        yield
    finally:
        del model.sample_noise, model.sample_time


def _prompts(pre) -> list[list[str]]:
    """Records the texts the tokenizer step is given (pi0.5 builds them from the state)."""
    seen = []
    for step in pre.steps:
        if type(step).__name__ == "TokenizerProcessorStep":
            tokenize = step._tokenize_text

            def recording(text, tokenize=tokenize):
                seen.append(list(text) if isinstance(text, list) else [text])
                return tokenize(text)

            step._tokenize_text = recording
    return seen


def _as_lerobot_eval_loads(folder: Path, dataset_root: str) -> tuple[object, object, dict]:
    """The policy as lerobot-eval builds it (``make_policy``: the PEFT path for an adapter
    folder), its base model and what was checked: a plain policy tensor by tensor against its
    file; an adapter's LoRA tensors against adapter_model.safetensors."""
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
    from lerobot.policies.factory import make_policy

    config = PreTrainedConfig.from_pretrained(str(folder))
    config.pretrained_path = folder
    config.device = "cpu"
    meta = LeRobotDatasetMetadata("local/pi", root=dataset_root)
    policy = make_policy(config, ds_meta=meta)
    if not hasattr(policy, "get_base_model"):
        return policy, policy, _loaded_as_filed(policy, folder)
    from peft import get_peft_model_state_dict

    adapter = get_peft_model_state_dict(policy)
    filed = load_file(str(folder / "adapter_model.safetensors"))
    mismatched = sorted(
        k for k in adapter.keys() & filed.keys() if not torch.equal(adapter[k], filed[k])
    )
    checked = {
        "mismatched": mismatched,
        "missing": sorted(adapter.keys() - filed.keys()),
        "unexpected": sorted(filed.keys() - adapter.keys()),
        "adapter_keys": sorted(adapter),
        "peft": type(policy).__name__,
    }
    return policy, policy.get_base_model(), checked


def run(job: dict) -> dict:
    folder = Path(job["policy_dir"])
    if "dataset_root" in job:
        policy, base, checked = _as_lerobot_eval_loads(folder, job["dataset_root"])
    else:
        config = PreTrainedConfig.from_pretrained(str(folder))
        _, policy_class = POLICIES[config.type]
        policy = base = policy_class.from_pretrained(str(folder))
        checked = _loaded_as_filed(policy, folder)
    policy.eval()
    pre, post = make_pre_post_processors(
        policy.config,
        pretrained_path=str(folder),
        preprocessor_overrides={
            "device_processor": {"device": "cpu"},
            "rename_observations_processor": {"rename_map": {}},
        },
    )
    prompts = _prompts(pre)
    raw = load_file(job["inputs"])
    batch = {k: v for k, v in raw.items() if k not in ("noise", "time")}
    batch["task"] = list(job["tasks"])
    processed = pre(batch)
    noise, time = raw["noise"], raw["time"]
    with torch.no_grad(), _drawn(base.model, noise, time):
        loss, _ = policy.forward(dict(processed))
        per_sample, _ = policy.forward(dict(processed), reduction="none")
    base.reset()
    actions = base.predict_action_chunk(dict(processed), noise=noise)
    out = {
        "tokens": processed["observation.language.tokens"],
        "mask": processed["observation.language.attention_mask"],
        "state": processed["observation.state"],
        "loss": loss.detach().reshape(1),
        "per_sample": per_sample.detach(),
        "actions": actions,
        "actions_post": post(actions),
    }
    save_file({k: v.contiguous() for k, v in out.items()}, job["out"])
    return {"keys": sorted(base.state_dict()), "prompts": prompts, **checked}


def train(job: dict) -> dict:
    """LeRobot's own lerobot-train (in this process, so that the dummy variant is patched in)
    with the job's ``argv``."""
    from lerobot.scripts.lerobot_train import main as train_main

    argv = sys.argv
    sys.argv = ["lerobot-train", *job["argv"]]
    try:
        train_main()
    finally:
        sys.argv = argv
    return {}


KINDS = {"defaults": defaults, "init_and_save": init_and_save, "run": run, "train": train}


def main() -> None:
    jobs_file, results_file = Path(sys.argv[1]), Path(sys.argv[2])
    results = [KINDS[job["kind"]](job) for job in json.loads(jobs_file.read_text())]
    results_file.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
