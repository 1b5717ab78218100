"""config/pi05.yaml through the pipeline: `snakemake --configfile config/pi05.yaml` fine-tunes
pi0.5 from lerobot/pi05_base with its own policy fields alone, and the same file runs end to end
on CPU: training (FSDP2 with bf16 mixed precision and activation checkpointing, the base read
from --policy.path) -> DCP checkpoints -> conversion -> evaluation in the synthetic task.

What a second config file overrides, because this machine cannot run the file as it is:
- the geometry: policy.paligemma_variant / action_expert_variant = dummy, image_resolution 56,
  max_state_dim / max_action_dim 8, chunk_size / n_action_steps 4, num_inference_steps 3
  (PI_TINY_PRESET) instead of PaliGemma 2B + Gemma 300M;
- the base: policy.path = a local folder holding a tiny pi0.5 (save_pretrained and its
  processors, its model.safetensors rewritten in the pi05_base layout: no ``model.`` prefix, the
  embedding only as ``lm_head``) instead of lerobot/pi05_base;
- the tokenizer: google/paligemma-3b-pt-224 (gated on the Hub) made locally in a Hub cache
  (HF_HUB_CACHE, HF_HUB_OFFLINE=1; tests/pi_tiny.py);
- the sizes: 2 processes instead of 8, 2 steps of batch 2 with a checkpoint each, no loader
  threads, every checkpoint kept, 2 evaluation episodes;
- the dataset: 2 episodes of 10 frames of 56 x 56 (the synthetic camera dataset stays).
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from snakemake_runs import Workspace

from lerobot_pipe.constants import PRETRAINED_MODEL_DIR

pytest.importorskip("transformers", reason="pi0.5 needs transformers: lerobot_pipe[pi]")

CONFIG = "config/pi05.yaml"
RUN = "results/pi05"
IMAGE_SIZE = 56
LM_HEAD = "model.paligemma_with_expert.paligemma.lm_head.weight"
EMBED = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"


def test_pi05_config_passes_only_pi05_policy_fields(tmp_path):
    workspace = Workspace.fresh(tmp_path / "repo")
    result = workspace.run_ok("-n", "-p", "--configfile", CONFIG)
    (train,) = [job for job in result.planned_jobs() if job.rule == "validate"]
    flags = {f.split("=", 1)[0] for f in train.shell.split() if f.startswith("--policy.")}
    ours = yaml.safe_load(workspace.path(CONFIG).read_text())["train"]["policy"]
    assert flags == {f"--policy.{key}" for key in ours}
    for flag in (
        "--policy.type=pi05",
        "--policy.path=lerobot/pi05_base",
        "--policy.dtype=float32",
        "--accelerator.mixed_precision=bf16",
        "--accelerator.activation_checkpointing.mode=full",
        "--parallelism.dp_shard=-1",
        "--nproc_per_node=8",
    ):
        assert flag in train.shell, (flag, train.shell)
    assert f"{RUN}/" in train.shell


def write_pi05_base(folder, tokenizer_env) -> dict[str, torch.Tensor]:
    """A tiny pi0.5 (PI_TINY_PRESET, the synthetic dataset's top camera, 2-D state and action)
    saved as a base folder: config.json, model.safetensors in the pi05_base layout, and its
    processors; returns the file's tensors."""
    from lerobot_pipe.policies.factory import make_policy_config, make_pre_post_processors
    from lerobot_pipe.policies.pi0 import PI_TINY_PRESET
    from lerobot_pipe.policies.pi05 import PI05Policy

    cfg = make_policy_config(
        "pi05",
        **PI_TINY_PRESET,
        input_features={
            "observation.images.top": {"type": "VISUAL", "shape": [3, IMAGE_SIZE, IMAGE_SIZE]},
            "observation.state": {"type": "STATE", "shape": [2]},
        },
        output_features={"action": {"type": "ACTION", "shape": [2]}},
        device="cpu",
    )
    torch.manual_seed(0)
    PI05Policy(cfg).save_pretrained(folder)
    with tokenizer_env():
        pre, post = make_pre_post_processors(cfg, dataset_stats={})
    pre.save_pretrained(folder)
    post.save_pretrained(folder)
    # LeRobot's Hub base files: keys without the `model.` prefix, the embedding only as lm_head.
    saved = load_file(folder / "model.safetensors")
    hub = {k.removeprefix("model."): v for k, v in saved.items() if k != EMBED}
    save_file(hub, folder / "model.safetensors", metadata={"format": "pt"})
    return hub


@pytest.mark.slow
def test_pi05_config_runs_end_to_end_with_a_tiny_base(tmp_path):
    from pi_tiny import build_paligemma_tokenizer, paligemma_tokenizer_cache

    from lerobot_pipe.policies.pi0 import PI_TINY_PRESET
    from lerobot_pipe.policies.pi05 import PI05Policy

    hf_home = tmp_path / "hf"
    build_paligemma_tokenizer(hf_home)
    hub_env = {"HF_HUB_CACHE": str(hf_home / "hub"), "HF_HUB_OFFLINE": "1"}
    base = tmp_path / "pi05_base"
    base_file = write_pi05_base(base, lambda: paligemma_tokenizer_cache(hf_home))

    workspace = Workspace.fresh(tmp_path / "repo")
    policy = yaml.safe_load(workspace.path(CONFIG).read_text())["train"]["policy"]
    policy.update(PI_TINY_PRESET, path=str(base))
    policy["image_resolution"] = list(policy["image_resolution"])
    tiny = workspace.write_config(
        "tiny.yaml",
        {
            "dataset": {
                "synthetic": {"num_episodes": 2, "episode_length": 10, "image_size": IMAGE_SIZE}
            },
            # One train job: segments (test_flow_pipeline.py) would build pi0.5 twice.
            "launch": {"nproc_per_node": 2, "segment_steps": 0},
            "train": {
                "steps": 2,
                "save_freq": 1,
                "log_freq": 1,
                "batch_size": 2,
                "num_workers": 0,
                "checkpoint_keep_last": 0,
                "policy": policy,
            },
            "eval": {"n_episodes": 2, "batch_size": 2},
        },
    )
    result = workspace.run_ok("--cores", "2", "--configfile", CONFIG, tiny, env=hub_env)
    jobs = result.jobs()
    assert (jobs["train"], jobs["convert"], jobs["evaluate"], jobs["best"]) == (1, 2, 2, 1)

    # Trained as the file says: FSDP2 over the 2 processes, bf16, activation checkpointing,
    # from the base folder; DCP checkpoints.
    train_config = json.loads(
        workspace.path(
            f"{RUN}/train/checkpoints/000002/{PRETRAINED_MODEL_DIR}/train_config.json"
        ).read_text()
    )
    assert train_config["accelerator"]["mixed_precision"] == "bf16"
    assert train_config["accelerator"]["activation_checkpointing"]["mode"] == "full"
    assert train_config["policy"]["type"] == "pi05"
    assert train_config["policy"]["pretrained_path"] == str(base)
    assert train_config["checkpoint_format"] == "dcp"
    for step in ("000001", "000002"):
        checkpoint = workspace.path(f"{RUN}/train/checkpoints/{step}/{PRETRAINED_MODEL_DIR}")
        assert not (checkpoint / "model.safetensors").exists()

    # Converted: loads strictly, every trainable weight fp32; the base was read (its lm_head,
    # which gets no gradient, is the file's) and trained (the embedding, taken from it, moved).
    folder = workspace.path(f"{RUN}/converted/000002/{PRETRAINED_MODEL_DIR}")
    loaded = PI05Policy.from_pretrained(folder)  # strict
    saved = load_file(folder / "model.safetensors")
    assert saved.keys() == loaded.state_dict().keys()
    assert all(t.dtype == torch.float32 for t in saved.values())
    head = base_file[LM_HEAD.removeprefix("model.")]
    assert torch.equal(saved[LM_HEAD], head)
    assert not torch.equal(saved[EMBED], head)

    # Evaluated in the synthetic task, the best checkpoint chosen.
    for step in ("000001", "000002"):
        info = json.loads(workspace.path(f"{RUN}/eval/{step}/eval_info.json").read_text())
        assert info["overall"]["n_episodes"] == 2, info["overall"]
    best = json.loads(workspace.path(f"{RUN}/eval/best.json").read_text())
    assert best["candidates"].keys() == {"000001", "000002"}
