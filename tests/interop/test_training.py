"""Training across the two: each fine-tunes from (`--policy.path`) and resumes (`--resume=true
--config_path=...`) the other's checkpoints, incl. the round trip LeRobot -> lerobot_pipe on 2
processes -> LeRobot, a LoRA run, a Hub repo id, and a LeRobot 0.4.4 checkpoint."""

from __future__ import annotations

import json
import re

import pytest
from conftest_hub import hub_server  # noqa: F401 - fixture
from huggingface_hub import HfApi
from interop_helpers import (
    BATCH,
    LEROBOT_TIMEOUT,
    STEPS,
    pretrained,
    step_dir,
    tiny_flags,
    training_finished,
)
from tiny import losses, run_train
from upstream import find_upstream_044

from lerobot_pipe.configs.parser import ConfigError
from lerobot_pipe.training.preflight import make_plan

pytestmark = pytest.mark.interop


def _training_step(step_folder) -> dict:
    return json.loads((step_folder / "training_state" / "training_step.json").read_text())


def _resumed_steps(output_dir) -> list[int]:
    return sorted(losses(output_dir))


def test_we_fine_tune_lerobots_checkpoint_on_fsdp2(lerobot_ckpts, our_ckpts):
    """--policy.path=<LeRobot's pretrained_model/> on 2 FSDP2 ranks, DCP shards, converted by
    lerobot-convert-dcp into LeRobot's model.safetensors (which LeRobot loads: test_policies)."""
    folder = pretrained(our_ckpts.fsdp)
    config = json.loads((folder / "train_config.json").read_text())
    assert config["policy"]["pretrained_path"] == str(pretrained(lerobot_ckpts.single))
    assert config["parallelism"]["dp_shard"] == 2 and config["checkpoint_format"] == "dcp"
    assert (folder / "model.safetensors").is_file()
    assert _training_step(step_dir(our_ckpts.fsdp))["sharded"] is True


def test_lerobot_fine_tunes_our_converted_fsdp2_checkpoint(lerobot_trains_ours, our_ckpts):
    """LeRobot's lerobot-train --policy.path=<our converted checkpoint>: its make_policy loads our
    weights, make_pre_post_processors our processors (with lerobot-train's overrides)."""
    run = lerobot_trains_ours.fine_tune
    config = json.loads((pretrained(run) / "train_config.json").read_text())
    assert config["policy"]["pretrained_path"] == str(pretrained(our_ckpts.fsdp))
    assert _training_step(step_dir(run)) == {"step": STEPS, "num_processes": 1, "batch_size": BATCH}


def test_round_trip_lerobot_ours_on_2_processes_lerobot(
    lerobot_ckpts, our_ckpts, lerobot_trains_ours
):
    """LeRobot's DDP checkpoint (step 2) resumed here on 2 processes up to step 4, then resumed by
    LeRobot's lerobot-train on 2 processes (torchrun) up to step 6 from a copy whose
    train_config.json lacks the three documented extra keys."""
    ours = step_dir(our_ckpts.ddp, 2 * STEPS)
    info = _training_step(ours)
    assert info["step"] == 2 * STEPS and info["num_processes"] == 2
    assert _resumed_steps(our_ckpts.ddp) == [STEPS + 1, 2 * STEPS]  # resumed, not restarted
    # LeRobot's fields we do not act on are kept (here: all of them came through).
    theirs = json.loads((pretrained(lerobot_ckpts.ddp) / "train_config.json").read_text())
    kept = json.loads((pretrained(our_ckpts.ddp, 2 * STEPS) / "train_config.json").read_text())
    assert set(theirs) <= set(kept)

    log = lerobot_trains_ours.resumed_log.read_text()
    # LeRobot read our step, num_processes and batch_size: 4 steps x 4 samples x 2 processes.
    assert f"Resuming data order at epoch 0, sample {2 * STEPS * BATCH * 2}" in log
    assert re.search(rf"step:{2 * STEPS + 1} ", log), "LeRobot did not continue at step 5"
    final = _training_step(step_dir(lerobot_trains_ours.resumed, 3 * STEPS))
    assert final == {"step": 3 * STEPS, "num_processes": 2, "batch_size": BATCH}


def test_we_resume_lerobots_lora_checkpoint(lerobot_ckpts, dataset_root, tmp_path):
    """LeRobot's LoRA run (adapter_model.safetensors over the base its adapter_config names)
    resumes here: adapters, optimizer and step restored, LoRA training continues."""
    out = tmp_path / "out"
    run_train(
        [
            "--resume=true",
            f"--config_path={pretrained(lerobot_ckpts.lora) / 'train_config.json'}",
            f"--dataset.root={dataset_root}",
            f"--output_dir={out}",
            f"--steps={STEPS + 1}",
        ]
    )
    assert _resumed_steps(out) == [STEPS + 1]
    folder = pretrained(out, STEPS + 1)
    assert (folder / "adapter_model.safetensors").is_file()
    assert json.loads((folder / "config.json").read_text())["use_peft"] is True


def test_we_resume_from_a_hub_repo_id(hub_server, lerobot_ckpts, dataset_root, tmp_path):  # noqa: F811
    """--config_path=<repo id> of a repo holding LeRobot's checkpoint as checkpoints/<step>/ (the
    layout of LeRobot's --save_checkpoint_to_hub): downloaded and resumed."""
    api = HfApi(endpoint=hub_server.url, token=hub_server.token)
    api.create_repo("alice/act-run")
    step = step_dir(lerobot_ckpts.single)
    api.upload_folder(
        repo_id="alice/act-run", folder_path=step, path_in_repo=f"checkpoints/{step.name}"
    )
    flags = ["--resume=true", "--config_path=alice/act-run", f"--dataset.root={dataset_root}"]
    with pytest.raises(ConfigError, match="resuming from a Hub repository needs --output_dir"):
        make_plan(flags, 1)
    out = tmp_path / "resumed"
    run_train(
        [
            "--resume=true",
            "--config_path=alice/act-run",
            f"--dataset.root={dataset_root}",
            f"--output_dir={out}",
            f"--steps={STEPS + 1}",
        ]
    )
    assert (step_dir(out) / "training_state" / "training_step.json").is_file()  # downloaded
    assert _resumed_steps(out) == [STEPS + 1]
    assert _training_step(step_dir(out, STEPS + 1))["step"] == STEPS + 1


def test_we_fine_tune_a_lerobot_044_checkpoint(upstream, lerobot_flags, dataset_root, tmp_path):
    """A checkpoint of LeRobot 0.4.4 (the newest release for Python 3.11) fine-tunes here, and
    resumes."""
    old, why = find_upstream_044(upstream)
    if old is None:
        pytest.skip(why)
    theirs = tmp_path / "le044"
    launched = old.start(
        ["python", "-m", "lerobot.scripts.lerobot_train", *tiny_flags(), *lerobot_flags]
        + [f"--output_dir={theirs}"],
        cwd=tmp_path,
        log=tmp_path / "le044.log",
    )
    if launched.wait(LEROBOT_TIMEOUT, training_finished(theirs, STEPS, launched.log)) != 0:
        pytest.fail(f"LeRobot 0.4.4 failed:\n{launched.tail()}", pytrace=False)
    out = tmp_path / "ours"
    run_train(
        [
            *tiny_flags(fresh=False),
            f"--policy.path={pretrained(theirs)}",
            f"--dataset.root={dataset_root}",
            f"--output_dir={out}",
        ]
    )
    config = json.loads((pretrained(out) / "train_config.json").read_text())
    assert config["policy"]["pretrained_path"] == str(pretrained(theirs))
    assert config["policy"]["dim_model"] == 32  # the 0.4.4 checkpoint's architecture
    # Its files also resume here: a train_config.json with 0.4.4's fields (eval_freq, use_rabc,
    # ... kept), a training_step.json holding only the step.
    resumed = tmp_path / "resumed"
    run_train(
        [
            "--resume=true",
            f"--config_path={pretrained(theirs) / 'train_config.json'}",
            f"--dataset.root={dataset_root}",
            f"--output_dir={resumed}",
            f"--steps={STEPS + 1}",
        ]
    )
    assert _resumed_steps(resumed) == [STEPS + 1]
    kept = json.loads((pretrained(resumed, STEPS + 1) / "train_config.json").read_text())
    assert kept["eval_freq"] == 20_000 and kept["use_rabc"] is False
