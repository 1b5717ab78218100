"""SmolVLA against LeRobot 0.6.1 itself (its Python, torch 2.11 and transformers 5.5), both ways,
on a tiny local SmolVLM in fp32:

- its config's fields and defaults are ours (a ``smolvla_base``-style config.json loads here);
- our checkpoint (pretrained_model/ with its processors) loads in LeRobot's SmolVLAPolicy with
  exactly the model's key set (LeRobot loads non-strictly: the sets are compared here) and its
  processors through ``make_pre_post_processors`` with lerobot-eval's overrides; on the same raw
  batch both give the same tokens, the same loss from the same noise and time and the same
  actions from the same noise (1e-5);
- a LeRobot-initialised, LeRobot-saved SmolVLA loads here strictly and gives LeRobot's loss and
  actions;
- our converted FSDP2 checkpoint and our LoRA adapter (trained on FSDP2, converted) load in
  LeRobot as lerobot-eval loads them (``make_policy``, its PEFT path for the adapter) with exactly
  their files' key sets and give the same loss and actions (1e-5);
- a LeRobot SmolVLA checkpoint fine-tunes here with ``--policy.path`` on FSDP2 and resumes.

LeRobot runs in its own environment (tests/upstream.py) as one subprocess for all jobs, driven by
lerobot_smolvla_driver.py; it needs ``lerobot[smolvla]`` there (transformers, num2words).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from upstream import find_upstream
from vla_tools import run_saved_policy

pytest.importorskip("transformers", reason="SmolVLA needs transformers: lerobot_pipe[smolvla]")

from smolvla_tiny import build_tiny_smolvlm  # noqa: E402

from lerobot_pipe.configs.parser import to_dict  # noqa: E402
from lerobot_pipe.configs.policies import PreTrainedConfig  # noqa: E402
from lerobot_pipe.policies.factory import make_pre_post_processors  # noqa: E402
from lerobot_pipe.policies.smolvla import SmolVLAConfig, SmolVLAPolicy  # noqa: E402

UPSTREAM, WHY_NOT = find_upstream()
DRIVER = Path(__file__).with_name("lerobot_smolvla_driver.py")
# Extra folders put on LeRobot's path (e.g. num2words installed with --target) where its venv
# lacks a package of lerobot[smolvla]; unset in CI, whose LeRobot venv has the extra.
ENV_OVERLAY = "LEROBOT_UPSTREAM_SMOLVLA_OVERLAY"
B, STATE_DIM, ACTION_DIM = 2, 3, 2
TASKS = ["pick it", "put it in the box, then stop\n"]  # the first padded, the second truncated
TASK_INDICES = [0, 7, 8, 15]
TRAINED_TASKS = ["Reach it.", "Move the point to the goal."]
STATS = {
    "observation.state": {"mean": [0.1, -0.2, 0.3], "std": [1.5, 0.5, 2.0]},
    "action": {"mean": [0.05, -0.1], "std": [0.7, 1.3]},
}

pytestmark = [pytest.mark.interop, pytest.mark.skipif(UPSTREAM is None, reason=WHY_NOT)]


@pytest.fixture(scope="module")
def upstream_env() -> dict[str, str]:
    """Extra environment of the LeRobot process; skips, saying what to install, where LeRobot's
    venv lacks lerobot[smolvla]'s num2words (SmolVLM's processor needs it)."""
    import subprocess

    env = {"PYTHONPATH": os.environ[ENV_OVERLAY]} if os.environ.get(ENV_OVERLAY) else {}
    probe = subprocess.run(
        [str(UPSTREAM.python), "-c", "import num2words, transformers"],
        env=UPSTREAM.env(Path("/nonexistent"), **env),
        capture_output=True,
    )
    if probe.returncode:
        pytest.skip(
            f"LeRobot's venv ({UPSTREAM.python}) lacks lerobot[smolvla] (num2words, "
            f"transformers): pip install 'lerobot[smolvla]==0.6.1' there, or set {ENV_OVERLAY}"
        )
    return env


def make_config(vlm: Path) -> SmolVLAConfig:
    # One camera at the VLM's size, one resized with padding; an empty camera; special image
    # tokens; an expert with its own width.
    return SmolVLAConfig.tiny(
        vlm_model_name=str(vlm),
        device="cpu",
        empty_cameras=1,
        add_image_special_tokens=True,
        input_features={
            "observation.images.top": {"type": "VISUAL", "shape": [3, 32, 32]},
            "observation.images.wrist": {"type": "VISUAL", "shape": [3, 24, 40]},
            "observation.state": {"type": "STATE", "shape": [STATE_DIM]},
        },
        output_features={"action": {"type": "ACTION", "shape": [ACTION_DIM]}},
    )


def raw_inputs(cfg: SmolVLAConfig) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "observation.images.top": torch.rand(B, 3, 32, 32, generator=g),
        "observation.images.wrist": torch.rand(B, 3, 24, 40, generator=g),
        "observation.state": torch.randn(B, STATE_DIM, generator=g),
        "action": torch.randn(B, cfg.chunk_size, ACTION_DIM, generator=g),
        "action_is_pad": torch.tensor([[False] * cfg.chunk_size, [False, False, True, True]]),
        "noise": torch.randn(B, cfg.chunk_size, cfg.max_action_dim, generator=g),
        "time": torch.tensor([0.3, 0.85]),
    }


def ours(folder: Path, inputs: dict[str, torch.Tensor], tasks: list[str] = TASKS) -> dict:
    """Our policy and processors loaded from ``folder``, run as the driver runs LeRobot's."""
    return run_saved_policy(folder, inputs, tasks)


def camera_dataset(tmp: Path) -> Path:
    from lerobot_pipe.datasets import write_synthetic_dataset

    return write_synthetic_dataset(
        tmp / "ds", num_episodes=2, episode_length=8, cameras=["top"], image_size=32,
        pixels_only=True, num_tasks=2,
    )  # fmt: skip


def train_flags(root: Path, out: Path, **changes) -> list[str]:
    flags = {
        "dataset.root": str(root),
        "steps": 2,
        "batch_size": 2,
        "num_workers": 0,
        "output_dir": str(out),
        **changes,
    }
    return [f"--{k}={v}" for k, v in flags.items()]


def trained_checkpoint(tmp: Path, vlm: Path, root: Path) -> Path:
    """A short single-process lerobot-train run (in this process) on two-task camera data."""
    from tiny import run_train

    from lerobot_pipe.policies.smolvla import SMOLVLA_TINY_PRESET

    flags = {
        "policy.type": "smolvla",
        "policy.vlm_model_name": str(vlm),
        **{f"policy.{k}": v for k, v in SMOLVLA_TINY_PRESET.items()},
        "policy.resize_imgs_with_padding": "[32,32]",
        "policy.train_expert_only": "false",
    }
    run_train(train_flags(root, tmp / "run", **flags))
    return tmp / "run/checkpoints/last/pretrained_model"


def dataset_stats(root: Path) -> dict:
    """The state and action statistics of the dataset (the normalizer's)."""
    from lerobot_pipe.datasets import LeRobotDataset

    stats = LeRobotDataset(root).stats
    return {
        k: {s: torch.as_tensor(stats[k][s]) for s in ("mean", "std")}
        for k in ("observation.state", "action")
    }


def trained_inputs(cfg: SmolVLAConfig) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {
        "observation.images.top": torch.rand(B, 3, 32, 32, generator=g),
        "observation.state": torch.randn(B, 2, generator=g),
        "action": torch.randn(B, cfg.chunk_size, 2, generator=g),
        "noise": torch.randn(B, cfg.chunk_size, cfg.max_action_dim, generator=g),
        "time": torch.tensor([0.5, 0.05]),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, upstream_env) -> dict:
    """Our checkpoints and LeRobot's, and every job's results, from one LeRobot process."""
    tmp = tmp_path_factory.mktemp("smolvla_interop")
    vlm = build_tiny_smolvlm(tmp / "tiny_smolvlm")
    vlm_weights = build_tiny_smolvlm(tmp / "tiny_smolvlm_weights", with_weights=True)
    cfg = make_config(vlm)
    torch.manual_seed(0)
    policy = SmolVLAPolicy(cfg)
    mine = tmp / "ours"
    policy.save_pretrained(mine)
    pre, post = make_pre_post_processors(cfg, dataset_stats=STATS)
    pre.save_pretrained(mine)
    post.save_pretrained(mine)
    inputs = raw_inputs(cfg)
    save_file(inputs, str(tmp / "inputs.safetensors"))
    root = camera_dataset(tmp)
    trained = trained_checkpoint(tmp, vlm, root)
    trained_cfg = SmolVLAConfig.from_pretrained(trained)
    inputs_trained = trained_inputs(trained_cfg)
    save_file(inputs_trained, str(tmp / "inputs_trained.safetensors"))
    # A smolvla_base-style config: the VLM's own (bf16) weights read from the folder.
    bf16_cfg = tmp / "bf16_config"
    make_config(vlm_weights).__class__(
        **{**vars(make_config(vlm_weights)), "load_vlm_weights": True}
    ).save_pretrained(bf16_cfg)
    theirs = tmp / "lerobot"
    jobs = [
        {"kind": "defaults"},
        {"kind": "init_and_save", "config_dir": str(mine), "seed": 1, "stats": STATS,
         "out_dir": str(theirs)},
        {"kind": "run", "policy_dir": str(mine), "inputs": str(tmp / "inputs.safetensors"),
         "tasks": TASKS, "out": str(tmp / "lerobot_on_ours.safetensors")},
        {"kind": "run", "policy_dir": str(theirs), "inputs": str(tmp / "inputs.safetensors"),
         "tasks": TASKS, "out": str(tmp / "lerobot_on_theirs.safetensors")},
        {"kind": "run", "policy_dir": str(trained),
         "inputs": str(tmp / "inputs_trained.safetensors"), "tasks": TRAINED_TASKS,
         "out": str(tmp / "lerobot_on_trained.safetensors")},
        {"kind": "init_and_save", "config_dir": str(bf16_cfg), "seed": 2, "stats": STATS,
         "out_dir": str(tmp / "lerobot_bf16")},
        {"kind": "init_and_save", "config_dir": str(trained), "seed": 3,
         "stats": {k: {s: v.tolist() for s, v in d.items()} for k, d in dataset_stats(root).items()},
         "out_dir": str(tmp / "lerobot_for_our_data")},
        {"kind": "tasks", "root": str(root), "indices": TASK_INDICES},
        {"kind": "run", "policy_dir": str(tmp / "lerobot_bf16"),
         "inputs": str(tmp / "inputs.safetensors"), "tasks": TASKS,
         "out": str(tmp / "lerobot_on_bf16.safetensors")},
    ]  # fmt: skip
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    UPSTREAM.run_script(
        DRIVER,
        tmp / "jobs.json",
        tmp / "results.json",
        home=tmp / "hf",
        timeout=300,
        **upstream_env,
    )
    results = json.loads((tmp / "results.json").read_text())
    return {
        "defaults": results[0],
        "saved_keys": results[1]["keys"],
        "on_ours": {**load_file(str(tmp / "lerobot_on_ours.safetensors")), **results[2]},
        "on_theirs": {**load_file(str(tmp / "lerobot_on_theirs.safetensors")), **results[3]},
        "on_trained": {**load_file(str(tmp / "lerobot_on_trained.safetensors")), **results[4]},
        "ours_on_ours": ours(mine, inputs),
        "ours_on_theirs": ours(theirs, inputs),
        "ours_on_trained": ours(trained, inputs_trained, TRAINED_TASKS),
        "file_keys_ours": sorted(load_file(str(mine / "model.safetensors"))),
        "file_keys_trained": sorted(load_file(str(trained / "model.safetensors"))),
        "bf16": results[5],
        "on_bf16": {**load_file(str(tmp / "lerobot_on_bf16.safetensors")), **results[8]},
        "ours_on_bf16": ours(tmp / "lerobot_bf16", inputs),
        "bf16_dir": tmp / "lerobot_bf16",
        "bf16_config": bf16_cfg,
        "vlm_weights": vlm_weights,
        "root": root,
        "vlm": vlm,
        "trained": trained,
        "lerobot_for_our_data": tmp / "lerobot_for_our_data",
        "lerobot_tasks": results[7]["tasks"],
    }


def test_config_fields_and_defaults_are_lerobots(runs, tmp_path):
    theirs = dict(runs["defaults"])
    mine = to_dict(SmolVLAConfig())
    mine.pop("type")
    # Documented: push_to_hub defaults to false here; LeRobot resolves device when building.
    assert theirs.pop("push_to_hub") is True and mine.pop("push_to_hub") is False
    theirs.pop("device"), mine.pop("device")
    assert mine == theirs
    # A smolvla_base-style config.json (LeRobot's encoding, pretrained weights) loads here.
    (tmp_path / "config.json").write_text(
        json.dumps({"type": "smolvla", **runs["defaults"], "load_vlm_weights": True})
    )
    loaded = PreTrainedConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, SmolVLAConfig) and loaded.load_vlm_weights
    assert loaded.resize_imgs_with_padding == (512, 512) and loaded.optimizer_betas == (0.9, 0.95)


def test_our_checkpoint_loads_in_lerobot_with_exactly_its_keys(runs):
    on_ours = runs["on_ours"]
    assert on_ours["keys"] == runs["file_keys_ours"] == runs["ours_on_ours"]["keys"]
    assert any(
        k.startswith("model.vlm_with_expert.lm_expert.layers.1.self_attn.k_proj")
        for k in on_ours["keys"]
    )
    assert not any("lm_expert.embed_tokens" in k for k in on_ours["keys"])


def test_our_trained_checkpoint_loads_in_lerobot_with_exactly_its_keys(runs):
    """pretrained_model/ of a lerobot-train run, with its processors."""
    assert runs["on_trained"]["keys"] == runs["file_keys_trained"]
    assert runs["ours_on_trained"]["keys"] == runs["file_keys_trained"]


@pytest.mark.parametrize("which", ["ours", "theirs", "trained"])
def test_same_tokens_loss_and_actions(runs, which):
    lerobot, mine = runs[f"on_{which}"], runs[f"ours_on_{which}"]
    assert torch.equal(lerobot["tokens"], mine["tokens"])
    assert torch.equal(lerobot["mask"], mine["mask"]) and mine["mask"].dtype == torch.bool
    # "longest" padding: the shorter task is padded, so the mask has zeros.
    assert not bool(mine["mask"].all())
    torch.testing.assert_close(mine["state"], lerobot["state"], rtol=0, atol=1e-6)
    for key in ("loss", "per_sample", "actions", "actions_post"):
        torch.testing.assert_close(mine[key], lerobot[key], rtol=1e-5, atol=1e-5, msg=key)
    assert mine["actions"].shape == (B, 4, 2)


def test_lerobot_checkpoint_keys_are_ours(runs):
    assert runs["saved_keys"] == runs["ours_on_theirs"]["keys"]


def test_vlm_weights_load_in_bf16_as_lerobot_and_checkpoints_rebuild_without_them(runs):
    """load_vlm_weights=true (smolvla_base): the VLM's weights are read from its folder in bf16,
    the expert's Llama layers too, the heads and swapped cross-attention k/v stay fp32: per key
    the dtypes LeRobot's policy has. A checkpoint of it then loads without the VLM's weights
    (built from the VLM's config), with LeRobot's dtypes and values."""
    from safetensors.torch import load_file as load

    theirs = runs["bf16"]["dtypes"]
    assert {"torch.bfloat16", "torch.float32"} == set(theirs.values())
    torch.manual_seed(0)
    built = SmolVLAPolicy(SmolVLAConfig.from_pretrained(runs["bf16_config"]))
    assert {k: str(v.dtype) for k, v in built.state_dict().items()} == theirs
    vlm_file = load(str(runs["vlm_weights"] / "model.safetensors"))
    embed = "model.vlm_with_expert.vlm.model.text_model.embed_tokens.weight"
    assert torch.equal(built.state_dict()[embed], vlm_file["model.text_model.embed_tokens.weight"])
    # Without the VLM's weights file: the checkpoint alone supplies every weight.
    (runs["vlm_weights"] / "model.safetensors").rename(runs["vlm_weights"] / "moved.safetensors")
    try:
        loaded = SmolVLAPolicy.from_pretrained(runs["bf16_dir"])
    finally:
        (runs["vlm_weights"] / "moved.safetensors").rename(
            runs["vlm_weights"] / "model.safetensors"
        )
    saved = load(str(runs["bf16_dir"] / "model.safetensors"))
    state = loaded.state_dict()
    assert {k: str(v.dtype) for k, v in state.items()} == theirs
    assert all(torch.equal(state[k], saved[k]) for k in saved)


def test_same_loss_and_actions_on_a_bf16_checkpoint(runs):
    """LeRobot's smolvla_base-style policy (bf16 VLM and expert, fp32 heads and k/v), loaded
    here: the same loss from the same noise and time and the same actions as LeRobot's, in its
    mixed precision (a bf16 layer's residual sums in bf16, as LeRobot's in-place sums)."""
    lerobot, mine = runs["on_bf16"], runs["ours_on_bf16"]
    assert torch.equal(lerobot["tokens"], mine["tokens"])
    for key in ("loss", "per_sample", "actions", "actions_post"):
        torch.testing.assert_close(mine[key], lerobot[key], rtol=1e-5, atol=1e-5, msg=key)


def test_dataset_items_carry_lerobots_task_strings(runs):
    from lerobot_pipe.datasets import LeRobotDataset

    ds = LeRobotDataset(runs["root"])
    assert [ds[i]["task"] for i in TASK_INDICES] == runs["lerobot_tasks"]
    assert len(set(runs["lerobot_tasks"])) == 2


# --- our sharded checkpoints in LeRobot; LeRobot's checkpoint fine-tuned here on FSDP2 ---------

FSDP2 = ["--parallelism.dp_shard=2", "--checkpoint_format=dcp"]


@pytest.fixture(scope="module")
def sharded(runs, tmp_path_factory, upstream_env) -> dict:
    """One 2-process FSDP2 run per case, converted: a SmolVLA trained from scratch; LoRA (LeRobot's
    default SmolVLA targets) on our single-process checkpoint; LeRobot's checkpoint fine-tuned with
    ``--policy.path`` (checkpoints at steps 1 and 2) and resumed from step 1 on FSDP2 again. Then
    LeRobot loads the first two as lerobot-eval does (``make_policy``: the PEFT path for the
    adapter) and runs them, in one LeRobot process."""
    from launch import run_distributed
    from tiny import run_train

    from lerobot_pipe.policies.smolvla import SMOLVLA_TINY_PRESET
    from lerobot_pipe.scripts.convert_dcp import main as convert_dcp

    tmp = tmp_path_factory.mktemp("smolvla_sharded_interop")
    root = runs["root"]
    scratch = {
        "policy.type": "smolvla",
        "policy.vlm_model_name": str(runs["vlm"]),
        **{f"policy.{k}": v for k, v in SMOLVLA_TINY_PRESET.items()},
        "policy.resize_imgs_with_padding": "[32,32]",
        "policy.train_expert_only": "false",
    }
    # A large learning rate: two steps move the adapter far from its zero start.
    lora = {"policy.path": str(runs["trained"]), "peft.r": 4, "policy.optimizer_lr": 0.01}
    fine_tune = {"policy.path": str(runs["lerobot_for_our_data"]), "save_freq": 1, "log_freq": 1}
    folders = {}
    for name, flags in [("fsdp2", scratch), ("lora", lora), ("fine_tune", fine_tune)]:
        out = tmp / name
        run_distributed(run_train, 2, [*train_flags(root, out, **flags), *FSDP2])
        assert convert_dcp([f"--checkpoint_dir={out / 'checkpoints/000002'}"]) == 0
        folders[name] = out / "checkpoints/000002/pretrained_model"
    resumed = tmp / "resumed"
    resume = [
        "--resume=true",
        f"--config_path={tmp / 'fine_tune/checkpoints/000001'}",
        f"--output_dir={resumed}",
        "--steps=2",
    ]
    run_distributed(run_train, 2, resume)
    inputs = tmp / "inputs_trained.safetensors"
    save_file(trained_inputs(SmolVLAConfig.from_pretrained(folders["fsdp2"])), str(inputs))
    jobs = [
        {"kind": "run", "policy_dir": str(folders[name]), "inputs": str(inputs),
         "tasks": TRAINED_TASKS, "dataset_root": str(root), "out": str(tmp / f"{name}.safetensors")}
        for name in ("fsdp2", "lora")
    ]  # fmt: skip
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    UPSTREAM.run_script(
        DRIVER, tmp / "jobs.json", tmp / "results.json", home=tmp / "hf", timeout=300,
        **upstream_env,
    )  # fmt: skip
    results = json.loads((tmp / "results.json").read_text())
    raw = load_file(str(inputs))
    return {
        **{
            f"on_{name}": {**load_file(str(tmp / f"{name}.safetensors")), **result}
            for name, result in zip(("fsdp2", "lora"), results, strict=True)
        },
        "ours_on_fsdp2": ours(folders["fsdp2"], raw, TRAINED_TASKS),
        "ours_on_lora": ours(folders["lora"], raw, TRAINED_TASKS),
        "folders": folders,
        "fine_tune": tmp / "fine_tune",
        "resumed": resumed,
    }


def test_our_converted_fsdp2_checkpoint_loads_in_lerobot_with_exactly_its_keys(sharded):
    keys = sorted(load_file(str(sharded["folders"]["fsdp2"] / "model.safetensors")))
    assert sharded["on_fsdp2"]["keys"] == keys == sharded["ours_on_fsdp2"]["keys"]


def test_our_fsdp2_lora_adapter_loads_in_lerobot_with_exactly_its_keys(sharded):
    """LeRobot took the PEFT path (config.json's use_peft; the base named by adapter_config.json)
    and its PeftModel holds exactly the adapter file's tensors: LeRobot's default SmolVLA targets."""
    folder = sharded["folders"]["lora"]
    assert not (folder / "model.safetensors").exists()
    assert json.loads((folder / "config.json").read_text())["use_peft"] is True
    adapter = sorted(load_file(str(folder / "adapter_model.safetensors")))
    assert sharded["on_lora"]["peft"] == "PeftModel"
    assert sharded["on_lora"]["adapter_keys"] == adapter
    modules = {k.split(".lora_")[0].removeprefix("base_model.model.model.") for k in adapter}
    assert modules == {
        *(f"vlm_with_expert.lm_expert.layers.{i}.self_attn.{p}_proj" for i in (0, 1) for p in "qv"),
        "state_proj", "action_in_proj", "action_out_proj", "action_time_mlp_in",
        "action_time_mlp_out",
    }  # fmt: skip


@pytest.mark.parametrize("which", ["fsdp2", "lora"])
def test_same_tokens_loss_and_actions_on_our_sharded_checkpoints(sharded, runs, which):
    lerobot, mine = sharded[f"on_{which}"], sharded[f"ours_on_{which}"]
    assert torch.equal(lerobot["tokens"], mine["tokens"])
    assert torch.equal(lerobot["mask"], mine["mask"])
    for key in ("loss", "per_sample", "actions", "actions_post"):
        torch.testing.assert_close(mine[key], lerobot[key], rtol=1e-5, atol=1e-5, msg=key)
    if which == "lora":  # the adapter acts: its base alone gives other actions
        base = runs["ours_on_trained"]["actions"]
        assert (lerobot["actions"] - base).abs().max() > 100 * 1e-5


def test_we_fine_tune_lerobots_checkpoint_on_fsdp2_and_resume(runs, sharded):
    """--policy.path=<a LeRobot-written SmolVLA> trains here on FSDP2 (2 processes) from
    LeRobot's weights; resumed from its step-1 checkpoint it goes on as the uninterrupted run."""
    from tiny import losses

    lerobot = runs["lerobot_for_our_data"]
    tuned = load_file(str(sharded["folders"]["fine_tune"] / "model.safetensors"))
    start = load_file(str(lerobot / "model.safetensors"))
    assert tuned.keys() == start.keys()
    frozen = "model.vlm_with_expert.vlm.model.vision_model.embeddings.patch_embedding.weight"
    assert torch.equal(tuned[frozen], start[frozen])  # frozen: LeRobot's weights, unchanged
    head = "model.action_out_proj.weight"
    assert not torch.equal(tuned[head], start[head])  # trained from LeRobot's
    uninterrupted, resumed = losses(sharded["fine_tune"]), losses(sharded["resumed"])
    assert uninterrupted.keys() == {1, 2} and resumed.keys() == {2}
    assert abs(resumed[2] - uninterrupted[2]) < 1e-6
