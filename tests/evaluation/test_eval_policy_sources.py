"""What --policy.path takes: a Hub repo id (the local test Hub), a checkpoint step folder, a
LoRA adapter folder; each gives the results of the same policy from a local folder."""

from __future__ import annotations

import json

import pytest
from conftest_hub import hub_server_module  # noqa: F401 - fixture
from tiny import run_train

pytest.importorskip("gymnasium", reason="the [sim] extra (gymnasium) is not installed")

from lerobot_pipe.scripts.eval import main  # noqa: E402

EPISODES = 3


def _evaluate(policy_path, out) -> dict:
    argv = [
        f"--policy.path={policy_path}",
        "--env.type=synthetic",
        f"--eval.n_episodes={EPISODES}",
        "--eval.batch_size=1",
        "--policy.device=cpu",
        f"--output_dir={out}",
    ]
    assert main(argv) == 0
    return json.loads((out / "eval_info.json").read_text())["per_task"][0]["metrics"]


def _episodes(metrics: dict) -> tuple:
    return metrics["sum_rewards"], metrics["max_rewards"], metrics["successes"], metrics["seeds"]


@pytest.fixture(scope="module")
def local(untrained_policy, tmp_path_factory):
    return _evaluate(untrained_policy, tmp_path_factory.mktemp("local") / "eval")


def test_hub_repo_id(hub_server_module, untrained_policy, local, tmp_path):  # noqa: F811
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_server_module.url, token=hub_server_module.token)
    api.create_repo("alice/act_synthetic")
    api.upload_folder(repo_id="alice/act_synthetic", folder_path=str(untrained_policy))
    assert _episodes(_evaluate("alice/act_synthetic", tmp_path / "eval")) == _episodes(local)


def test_checkpoint_step_folder(untrained_policy, local, tmp_path):
    step = untrained_policy.parent
    assert _episodes(_evaluate(step, tmp_path / "eval")) == _episodes(local)


def test_ema_policy_folder(tmp_path):
    """A checkpoint's EMA policy, pretrained_model_ema/, is a policy folder like any other."""
    from tiny import tiny_act_flags

    from lerobot_pipe.datasets import write_synthetic_dataset

    dataset = write_synthetic_dataset(tmp_path / "ds", num_episodes=4, episode_length=20)
    flags = {"dataset.root": dataset, "batch_size": 4, "steps": 1, "save_freq": 1}
    out = tmp_path / "train"
    run_train([*tiny_act_flags(**flags), "--ema.enable=true", f"--output_dir={out}"])
    ema = out / "checkpoints" / "000001" / "pretrained_model_ema"
    metrics = _evaluate(ema, tmp_path / "eval")
    assert metrics["seeds"] == list(range(1000, 1000 + EPISODES))


def test_lora_adapter_folder(untrained_policy, tmp_path):
    """A LoRA run over the policy (its adapter folder names the base): evaluated merged."""
    from lerobot_pipe.datasets import write_synthetic_dataset

    dataset = write_synthetic_dataset(tmp_path / "ds", num_episodes=4, episode_length=20)
    out = tmp_path / "lora"
    run_train(
        [
            "--num_workers=0",
            f"--dataset.root={dataset}",
            "--batch_size=4",
            "--steps=1",
            "--save_freq=1",
            f"--policy.path={untrained_policy}",
            "--peft.r=4",
            f"--output_dir={out}",
        ]
    )
    adapter = out / "checkpoints" / "000001" / "pretrained_model"
    assert (adapter / "adapter_config.json").is_file()
    metrics = _evaluate(adapter, tmp_path / "eval")
    assert metrics["seeds"] == list(range(1000, 1000 + EPISODES))
