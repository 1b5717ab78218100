"""make_model_card: Hub metadata, tables, no secrets."""

import yaml
from huggingface_hub import ModelCard

from lerobot_pipe.hub import make_model_card

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz012345"


def split_card(card: str) -> tuple[dict, str]:
    assert card.startswith("---\n")
    front, body = card[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


def test_front_matter_and_body():
    card = make_model_card(
        repo_id="alice/act-pusht",
        policy_type="act",
        dataset_repo_id="lerobot/pusht",
        base_model="alice/act-base",
        train_summary={
            "steps": 5000,
            "batch_size": {"per_device": 8, "global": 64},
            "topology": "2 nodes x 4 GPUs (FSDP2)",
            "precision": "bf16",
            "lr": 1e-4,
            "hub_token": TOKEN,
            "wandb": {"api_token": TOKEN, "project": "x|y"},
            "notes": f"pushed with {TOKEN}",
        },
        metrics={"train/loss": 0.012345678, "eval": {"success_rate": 0.8}},
        tags=["pusht", "act"],
    )
    meta, body = split_card(card)
    assert meta["library_name"] == "lerobot"
    assert meta["pipeline_tag"] == "robotics"
    assert meta["datasets"] == ["lerobot/pusht"]
    assert meta["base_model"] == "alice/act-base"
    assert meta["license"] == "apache-2.0"
    assert meta["model_name"] == "act"  # LeRobot's card names the policy type
    assert meta["tags"] == ["lerobot", "robotics", "act", "lerobot_pipe", "pusht"]

    assert "alice/act-pusht" in body.splitlines()[1]
    for row in (
        "| `steps` | 5000 |",
        "| `batch_size.per_device` | 8 |",
        "| `batch_size.global` | 64 |",
        "| `topology` | 2 nodes x 4 GPUs (FSDP2) |",
        "| `precision` | bf16 |",
        "| `lr` | 0.0001 |",
        "| `wandb.project` | x\\|y |",
        "| `train/loss` | 0.0123457 |",
        "| `eval.success_rate` | 0.8 |",
    ):
        assert row in body, row
    assert "## How to use" in body and 'from_pretrained("alice/act-pusht")' in body
    assert TOKEN not in card
    assert "token" not in card.lower().replace("tokens", "")
    # huggingface_hub reads the card back with the same metadata.
    data = ModelCard(card).data
    assert (data.library_name, data.pipeline_tag, data.model_name) == ("lerobot", "robotics", "act")


def test_minimal_card():
    card = make_model_card(
        repo_id="bob/diffusion",
        policy_type="diffusion",
        dataset_repo_id=None,
        base_model=None,
        train_summary={},
        metrics=None,
        license=None,
    )
    meta, body = split_card(card)
    assert set(meta) == {"library_name", "pipeline_tag", "model_name", "tags"}
    assert meta["tags"] == ["lerobot", "robotics", "diffusion", "lerobot_pipe"]
    assert "## Metrics" not in body
