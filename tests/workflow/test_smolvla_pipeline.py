"""config/smolvla.yaml through the pipeline: `snakemake --configfile config/smolvla.yaml` trains
SmolVLA with its own policy fields alone (Snakemake merges a config file over config/config.yaml
key by key; the default's ACT fields are dropped), and the file runs end to end on CPU with a
tiny local VLM in place of SmolVLM2-500M (a second config file): FSDP2 on 2 processes with bf16
mixed precision, DCP checkpoints, conversion; the converted folder loads strictly as a
SmolVLAPolicy with fp32 trainable weights and LeRobot's frozen bf16 ones."""

from __future__ import annotations

import pytest
import torch
import yaml
from safetensors.torch import load_file
from snakemake_runs import Workspace

from lerobot_pipe.constants import PRETRAINED_MODEL_DIR

pytest.importorskip("transformers", reason="SmolVLA needs transformers: lerobot_pipe[smolvla]")

CONFIG = "config/smolvla.yaml"


def test_smolvla_config_passes_only_smolvla_policy_fields(tmp_path):
    workspace = Workspace.fresh(tmp_path / "repo")
    result = workspace.run_ok("-n", "-p", "--configfile", CONFIG)
    (train,) = [job for job in result.planned_jobs() if job.rule == "validate"]
    flags = {f.split("=", 1)[0] for f in train.shell.split() if f.startswith("--policy.")}
    ours = yaml.safe_load(workspace.path(CONFIG).read_text())["train"]["policy"]
    assert flags == {f"--policy.{key}" for key in ours}
    assert "results/smolvla/" in train.shell
    # The default config alone still gives ACT with its fields.
    default = workspace.run_ok("-n", "-p")
    (act,) = [job for job in default.planned_jobs() if job.rule == "validate"]
    assert "--policy.type=act" in act.shell and "--policy.dim_model=32" in act.shell


@pytest.mark.slow
def test_smolvla_config_runs_end_to_end_with_a_tiny_vlm(tmp_path):
    from smolvla_tiny import build_tiny_smolvlm

    from lerobot_pipe.policies.smolvla import SMOLVLA_TINY_PRESET, SmolVLAPolicy

    workspace = Workspace.fresh(tmp_path / "repo")
    vlm = build_tiny_smolvlm(tmp_path / "tiny_vlm", with_weights=True)
    policy = yaml.safe_load(workspace.path(CONFIG).read_text())["train"]["policy"]
    policy.update(SMOLVLA_TINY_PRESET, vlm_model_name=str(vlm))
    policy["resize_imgs_with_padding"] = [32, 32]
    tiny = workspace.write_config(
        "tiny.yaml",
        {
            "dataset": {"synthetic": {"num_episodes": 2, "episode_length": 10, "image_size": 32}},
            # One train job: segments (test_flow_pipeline.py) would build SmolVLA twice.
            "launch": {"segment_steps": 0},
            "train": {"steps": 2, "save_freq": 1, "log_freq": 1, "batch_size": 2, "policy": policy},
        },
    )
    result = workspace.run_ok("--cores", "2", "--configfile", CONFIG, tiny)
    jobs = result.jobs()
    assert (jobs["train"], jobs["convert"]) == (1, 2)
    folder = workspace.path(f"results/smolvla/converted/000002/{PRETRAINED_MODEL_DIR}")
    loaded = SmolVLAPolicy.from_pretrained(folder)  # strict
    assert loaded.config.load_vlm_weights and loaded.config.vlm_model_name == str(vlm)
    saved = load_file(folder / "model.safetensors")
    assert saved.keys() == loaded.state_dict().keys()
    # Trainable weights kept (and saved) in fp32 by FSDP2's mixed precision; the frozen VLM bf16.
    assert saved["model.action_out_proj.weight"].dtype == torch.float32
    assert saved["model.vlm_with_expert.lm_expert.layers.0.mlp.up_proj.weight"].dtype == (
        torch.float32
    )
    assert saved[
        "model.vlm_with_expert.vlm.model.text_model.layers.0.mlp.up_proj.weight"
    ].dtype == (torch.bfloat16)
