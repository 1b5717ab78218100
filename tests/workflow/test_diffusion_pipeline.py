"""`policy.type: diffusion` through the pipeline: a synthetic dataset with a camera, validate,
FSDP2 training on 2 processes with DCP checkpoints, conversion, publishing with a model card to a
local Hub server; the converted folder and the Hub repository load strictly as a DiffusionPolicy
with its processors."""

from __future__ import annotations

import pytest
import torch
import yaml
from snakemake_runs import RUN, Workspace
from tiny import TINY_DIFFUSION

from lerobot_pipe.constants import PRETRAINED_MODEL_DIR
from lerobot_pipe.policies.diffusion import DiffusionPolicy
from lerobot_pipe.policies.factory import make_pre_post_processors

pytestmark = pytest.mark.slow


def diffusion_config(workspace: Workspace) -> dict:
    """The default config with a 48x48 camera and a tiny Diffusion Policy instead of ACT."""
    config = yaml.safe_load(workspace.path("config/config.yaml").read_text())
    config["dataset"]["synthetic"].update(
        num_episodes=3, episode_length=30, cameras=["top"], image_size=48
    )
    config["train"].update(steps=4, save_freq=2, log_freq=1, batch_size=4)
    # One train job: segments (test_flow_pipeline.py) would add a trainer start.
    config["launch"]["segment_steps"] = 0
    config["eval"]["env"] = None  # no evaluation: tests/workflow/test_evaluate_pipeline.py
    policy = {k.removeprefix("policy."): v for k, v in TINY_DIFFUSION.items()}
    policy.update(down_dims=[16, 32], pretrained_backbone_weights=None, crop_shape=[40, 40])
    config["train"]["policy"] = policy
    return config


def test_diffusion_policy_runs_end_to_end(hub_server, tmp_path):
    workspace = Workspace.fresh(tmp_path / "repo")
    # The whole config file: a --configfile on top would merge ACT's policy keys into ours.
    workspace.write_config("config/config.yaml", diffusion_config(workspace))
    repo_id = "alice/tiny-diffusion"
    hub = ["--config", f"hub_repo_id={repo_id}", f"hub_endpoint={hub_server.url}"]
    result = workspace.run_ok("--cores", "2", *hub, env=hub_server.env())
    jobs = result.jobs()
    assert (jobs["train"], jobs["convert"], jobs["publish"]) == (1, 2, 1)
    assert workspace.complete_checkpoints() == ["000002", "000004"]
    assert workspace.converted_steps() == ["000002", "000004"]
    final = workspace.final_checkpoint()
    assert final["step"] == 4 and final["world_size"] == 2
    folder = workspace.path(f"{RUN}/converted/000004/{PRETRAINED_MODEL_DIR}")
    policy = DiffusionPolicy.from_pretrained(folder)  # strict
    assert policy.config.crop_shape == (40, 40) and "observation.images.top" in (
        policy.config.image_features
    )
    pre, _ = make_pre_post_processors(policy.config, pretrained_path=folder)
    assert pre.steps[-1].norm_map == {"VISUAL": "MEAN_STD", "STATE": "MIN_MAX", "ACTION": "MIN_MAX"}
    card = hub_server.read_file(repo_id, "README.md").decode()
    assert "diffusion" in card.split("---")[1]  # the policy type is a tag of the model card
    published = DiffusionPolicy.from_pretrained(repo_id)  # from the Hub, strict
    for key, value in policy.state_dict().items():
        assert torch.equal(published.state_dict()[key], value), key
