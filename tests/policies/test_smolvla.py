"""SmolVLA here, without LeRobot: its config refuses what is not built, its pipelines are LeRobot
0.6.1's, the sampler's shapes and queue, task strings from a several-task synthetic dataset, and
a short single-process ``lerobot-train --policy.type=smolvla`` run on camera frames (in
process) whose checkpoint reloads and acts. Numerical agreement with LeRobot itself:
test_lerobot_smolvla.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest_hub import hub_server  # noqa: F401 - the local test Hub (function scope)
from torch.utils._python_dispatch import TorchDispatchMode

from lerobot_pipe.constants import DATASET_SYNTHETIC_PARAMS
from lerobot_pipe.policies.smolvla import SMOLVLA_TINY_PRESET, SmolVLAConfig

FEATURES = dict(
    input_features={
        "observation.images.top": {"type": "VISUAL", "shape": [3, 32, 32]},
        "observation.state": {"type": "STATE", "shape": [2]},
    },
    output_features={"action": {"type": "ACTION", "shape": [2]}},
)


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("rtc_config", {"enabled": True}, "real-time chunking"),
        ("compile_model", True, "torch.compile"),
        ("adapt_to_pi_aloha", True, "Aloha"),
        ("use_delta_joint_actions_aloha", True, "delta joint actions"),
        ("use_cache", False, "key/value cache"),
        ("attention_mode", "sparse", "attention_mode"),
        ("pad_language_to", "none", "pad_language_to"),
        ("num_expert_layers", 1, "fewer layers"),
        ("n_action_steps", 60, "n_action_steps"),
    ],
)
def test_config_refuses_what_is_not_built(field, value, says):
    with pytest.raises(ValueError, match=says):
        SmolVLAConfig(**{field: value})


def test_config_checks_features():
    cfg = SmolVLAConfig.tiny(empty_cameras=2, **FEATURES)
    cfg.validate_features()
    assert list(cfg.image_features)[1:] == [
        "observation.images.empty_camera_0",
        "observation.images.empty_camera_1",
    ]
    wide = SmolVLAConfig.tiny(
        input_features={
            **FEATURES["input_features"],
            "observation.state": {"type": "STATE", "shape": [9]},
        },
        output_features=FEATURES["output_features"],
    )
    with pytest.raises(ValueError, match="max_state_dim=8"):
        wide.validate_features()
    preset = SmolVLAConfig().get_scheduler_preset()
    assert (preset.num_warmup_steps, preset.num_decay_steps, preset.decay_lr) == (
        1000,
        30000,
        2.5e-6,
    )


def test_synthetic_dataset_with_several_tasks(tmp_path):
    from lerobot_pipe.datasets import LeRobotDataset, write_synthetic_dataset
    from lerobot_pipe.datasets.synthetic import TASKS
    from lerobot_pipe.scripts.cli import main

    root = tmp_path / "ds"
    flags = ["--num_episodes=3", "--episode_length=4", "--num_tasks=2"]
    assert main(["make-dataset", f"--root={root}", *flags]) == 0
    ds = LeRobotDataset(root)
    batch = ds.get_batch([0, 4, 8])
    assert batch["task"] == [TASKS[0], TASKS[1], TASKS[0]]
    assert batch["task_index"].tolist() == [0, 1, 0]
    assert ds[5]["task"] == TASKS[1]
    params = json.loads((root / DATASET_SYNTHETIC_PARAMS).read_text())
    assert params["num_tasks"] == 2
    one = write_synthetic_dataset(tmp_path / "one", num_episodes=1, episode_length=2)
    assert "num_tasks" not in json.loads((one / DATASET_SYNTHETIC_PARAMS).read_text())
    with pytest.raises(ValueError, match="num_tasks"):
        write_synthetic_dataset(tmp_path / "bad", num_tasks=9)


# --- with transformers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory) -> Path:
    pytest.importorskip("transformers", reason="SmolVLA needs transformers: lerobot_pipe[smolvla]")
    from smolvla_tiny import build_tiny_smolvlm

    return build_tiny_smolvlm(tmp_path_factory.mktemp("vlm") / "tiny_smolvlm")


def test_pipelines_are_lerobots(tiny_vlm, tmp_path):
    from lerobot_pipe.policies.factory import make_pre_post_processors

    cfg = SmolVLAConfig.tiny(vlm_model_name=str(tiny_vlm), **FEATURES)
    stats = {"observation.state": {"mean": [0.0, 1.0], "std": [1.0, 2.0]},
             "action": {"mean": [0.0, 0.0], "std": [1.0, 1.0]}}  # fmt: skip
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    pre.save_pretrained(tmp_path)
    post.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "policy_preprocessor.json").read_text())
    assert [s["registry_name"] for s in saved["steps"]] == [
        "rename_observations_processor",
        "to_batch_processor",
        "smolvla_new_line_processor",
        "tokenizer_processor",
        "device_processor",
        "normalizer_processor",
    ]
    assert saved["steps"][3]["config"] == {
        "max_length": 12,
        "task_key": "task",
        "padding_side": "right",
        "padding": "longest",
        "truncation": True,
        "tokenizer_name": str(tiny_vlm),
    }
    assert saved["steps"][5]["state_file"] == (
        "policy_preprocessor_step_5_normalizer_processor.safetensors"
    )
    saved_post = json.loads((tmp_path / "policy_postprocessor.json").read_text())
    assert [s["registry_name"] for s in saved_post["steps"]] == [
        "unnormalizer_processor",
        "device_processor",
    ]
    # One observation, as a robot gives it: batched, the task ended by a newline and tokenized.
    out = pre(
        {"observation.images.top": torch.rand(3, 32, 32), "observation.state": torch.ones(2),
         "task": "go"}
    )  # fmt: skip
    assert out["task"] == ["go\n"]
    assert out["observation.language.tokens"].shape == (1, 3)
    assert out["observation.language.attention_mask"].dtype == torch.bool
    torch.testing.assert_close(out["observation.state"], torch.tensor([[1.0, 0.0]]))


def test_sampler_shapes_and_queue(tiny_vlm):
    from lerobot_pipe.policies.smolvla import SmolVLAPolicy

    torch.manual_seed(0)
    cfg = SmolVLAConfig.tiny(vlm_model_name=str(tiny_vlm), n_action_steps=3, **FEATURES)
    policy = SmolVLAPolicy(cfg)
    assert not any(p.requires_grad for p in policy.model.vlm_with_expert.vlm.parameters())
    assert policy.model.state_proj.weight.requires_grad
    batch = {
        "observation.images.top": torch.rand(2, 3, 32, 32),
        "observation.state": torch.randn(2, 2),
        "observation.language.tokens": torch.randint(0, 20, (2, 5)),
        "observation.language.attention_mask": torch.ones(2, 5, dtype=torch.bool),
    }
    noise = torch.randn(2, cfg.chunk_size, cfg.max_action_dim)
    chunk = policy.predict_action_chunk(batch, noise=noise)
    assert chunk.shape == (2, cfg.chunk_size, 2)
    torch.testing.assert_close(policy.predict_action_chunk(batch, noise=noise), chunk)
    policy.reset()
    steps = [policy.select_action(batch, noise=noise) for _ in range(4)]
    for i in range(3):  # the queue plays the chunk's first n_action_steps actions
        torch.testing.assert_close(steps[i], chunk[:, i])
    torch.testing.assert_close(steps[3], chunk[:, 0])  # then a new chunk (same noise)
    # Training draws from the sample keys: a pure function of each sample's key.
    policy.train()
    train_batch = {**batch, "action": torch.randn(2, 4, 2), "sample_key": torch.tensor([5, 9])}
    first, _ = policy(train_batch)
    again, _ = policy(train_batch)
    torch.testing.assert_close(first, again)
    per_sample, _ = policy({**train_batch, "sample_key": torch.tensor([9, 5])}, reduction="none")
    swapped, _ = policy(train_batch, reduction="none")
    assert not torch.allclose(per_sample, swapped)


def test_the_decoder_layers_run_through_their_unit_entries(tiny_vlm, monkeypatch):
    """SmolVLA calls a decoder layer's parts directly, in training and in inference (the layer's
    forward never runs), through the layer's unit entry: every declared unit counts as running
    (its LlamaAttention, never called, does not); without the entries every decoder layer would
    be bypassed."""
    from lerobot_pipe.distributed import unit_probe
    from lerobot_pipe.distributed.unit_probe import find_bypassed_modules
    from lerobot_pipe.policies.smolvla import SmolVLAPolicy

    policy = SmolVLAPolicy(SmolVLAConfig.tiny(vlm_model_name=str(tiny_vlm), **FEATURES))
    batch = {
        "observation.images.top": torch.rand(2, 3, 32, 32),
        "observation.state": torch.randn(2, 2),
        "observation.language.tokens": torch.randint(0, 20, (2, 5)),
        "observation.language.attention_mask": torch.ones(2, 5, dtype=torch.bool),
    }
    train_batch = {**batch, "action": torch.randn(2, 4, 2)}
    entries = [(name, m) for name, m in policy.named_modules() if unit_probe.has_unit_entry(m)]
    assert [type(m).__name__ for _, m in entries] == ["LlamaDecoderLayer"] * 4

    def probe():
        return find_bypassed_modules(
            policy,
            lambda: policy(train_batch),
            lambda: policy.select_action(batch),
            reset=policy.reset,
        )

    bypassed = probe()
    classes = {type(policy.get_submodule(name)).__name__ for name in bypassed}
    assert not classes & set(SmolVLAPolicy._fsdp_wrap_modules), bypassed
    assert "model.vlm_with_expert.lm_expert.layers.0.self_attn" in bypassed
    # The entries are what makes the layers count: a probe that does not see them finds every
    # decoder layer bypassed.
    monkeypatch.setattr(unit_probe, "has_unit_entry", lambda module: False)
    bypassed = probe()
    assert "model.vlm_with_expert.lm_expert.layers.0" in bypassed
    assert "model.vlm_with_expert.vlm.model.text_model.layers.1" in bypassed


def test_train_run_checkpoint_reloads(tiny_vlm, tmp_path):
    """lerobot-train --policy.type=smolvla, single process, on a camera dataset with two tasks;
    resumed, it repeats the uninterrupted run exactly; the checkpoint reloads and acts."""
    from tiny import run_train

    from lerobot_pipe.datasets import write_synthetic_dataset
    from lerobot_pipe.policies.factory import make_pre_post_processors
    from lerobot_pipe.policies.smolvla import SmolVLAPolicy

    root = write_synthetic_dataset(
        tmp_path / "ds", num_episodes=4, episode_length=10, cameras=["top"], image_size=32,
        pixels_only=True, num_tasks=2,
    )  # fmt: skip
    out = tmp_path / "out"
    flags = {
        "policy.type": "smolvla",
        "policy.vlm_model_name": str(tiny_vlm),
        **{f"policy.{k}": v for k, v in SMOLVLA_TINY_PRESET.items()},
        "policy.resize_imgs_with_padding": "[32,32]",
        "policy.scheduler_warmup_steps": 1,
        "policy.empty_cameras": 1,  # a camera the dataset does not have, masked out
        "dataset.root": str(root),
        "steps": 4,
        "batch_size": 4,
        "num_workers": 0,
        "log_freq": 1,
        "save_freq": 2,
        "output_dir": str(out),
    }

    def train(**changes) -> None:
        run_train([f"--{k}={v}" for k, v in {**flags, **changes}.items()])

    train()  # the policy's preset: AdamW, cosine decay with warmup
    # Resumed from step 2 it ends where the uninterrupted run ends, bit for bit (at a constant
    # lr: the preset's cosine schedule is scaled to each run's --steps).
    flags.update(
        {
            "use_policy_training_preset": "false",
            "optimizer.type": "adamw",
            "scheduler.type": "constant_with_warmup",
            "scheduler.num_warmup_steps": 0,
        }
    )
    train(output_dir=tmp_path / "full")
    train(output_dir=tmp_path / "half", steps=2)
    resumed = run_train(
        [
            "--resume=true",
            f"--config_path={tmp_path / 'half/checkpoints/000002/pretrained_model/train_config.json'}",
            "--steps=4",
        ]
    )
    from safetensors.torch import load_file

    for rel in ("pretrained_model/model.safetensors", "training_state/optimizer_state.safetensors"):
        a = load_file(str(tmp_path / "full/checkpoints/000004" / rel))
        b = load_file(f"{resumed}/{rel}")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), rel
    # LeRobot's optimizer layout: one group of every parameter, state for the trained ones only.
    groups = json.loads(
        (out / "checkpoints/000004/training_state/optimizer_param_groups.json").read_text()
    )
    n_params = len(
        list(
            SmolVLAPolicy.from_pretrained(out / "checkpoints/000004/pretrained_model").parameters()
        )
    )
    assert len(groups) == 1 and groups[0]["params"] == list(range(n_params))
    folder = out / "checkpoints/last/pretrained_model"
    saved = json.loads((folder / "config.json").read_text())
    assert saved["type"] == "smolvla"
    assert saved["input_features"]["observation.images.empty_camera_0"]["shape"] == [3, 480, 640]
    policy = SmolVLAPolicy.from_pretrained(folder)
    pre, post = make_pre_post_processors(policy.config, pretrained_path=folder)
    obs = {"observation.images.top": torch.rand(3, 32, 32), "observation.state": torch.zeros(2),
           "task": "Reach the green dot."}  # fmt: skip
    action = post(policy.select_action(pre(obs)))
    assert action.shape == (1, 2) and torch.isfinite(action).all()


@pytest.mark.parametrize(
    "flag, says",
    [
        ("--policy.compile_model=true", "torch.compile of SmolVLA is not built here"),
        ('--policy.rtc_config={"enabled": true}', "real-time chunking (RTC) is not built here"),
        ("--policy.adapt_to_pi_aloha=true", "Aloha"),
        ("--policy.use_delta_joint_actions_aloha=true", "delta joint actions"),
    ],
)
def test_refused_fields_fail_before_launch(tmp_path, monkeypatch, capsys, flag, says):
    """As rank 0 of a would-be 2-process run: exit status 2, one line, nothing written, no VLM
    read (vlm_model_name names no folder)."""
    from lerobot_pipe.scripts.train import main as train_main

    for key, value in {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.chdir(tmp_path)
    argv = [
        "--policy.type=smolvla",
        "--policy.vlm_model_name=/nonexistent/vlm",
        "--dataset.root=/nonexistent/ds",
        f"--output_dir={tmp_path / 'out'}",
        flag,
    ]
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_vlm_from_a_hub_id_through_the_cache(tiny_vlm, tmp_path, hub_server):  # noqa: F811
    """``vlm_model_name`` as a Hub repo id: the VLM's config and weights (load_vlm_weights)
    and its tokenizer come through huggingface_hub's cache, from the local test Hub."""
    from huggingface_hub import HfApi
    from smolvla_tiny import build_tiny_smolvlm

    from lerobot_pipe.policies.factory import make_pre_post_processors
    from lerobot_pipe.policies.smolvla import SmolVLAPolicy

    folder = build_tiny_smolvlm(tmp_path / "vlm", with_weights=True)
    api = HfApi(endpoint=hub_server.url, token=hub_server.token)
    api.create_repo("tiny/smolvlm")
    api.upload_folder(repo_id="tiny/smolvlm", folder_path=folder)
    cfg = SmolVLAConfig.tiny(vlm_model_name="tiny/smolvlm", load_vlm_weights=True, **FEATURES)
    policy = SmolVLAPolicy(cfg)
    from safetensors.torch import load_file

    embed = load_file(str(folder / "model.safetensors"))["model.text_model.embed_tokens.weight"]
    assert torch.equal(policy.model.vlm_with_expert.vlm.model.text_model.embed_tokens.weight, embed)
    pre, _ = make_pre_post_processors(cfg)
    tokens = pre.step("tokenizer_processor")({"task": ["go\n"]})["observation.language.tokens"]
    assert tokens.shape == (1, 3)
    cached = {p.name for p in Path(hub_server.cache_dir).rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= cached


def test_publishing_a_local_vlm_folder_is_refused_before_upload(
    tiny_vlm, tmp_path, monkeypatch, capsys
):
    """The checkpoint records the folder as given (as LeRobot does); publishing it, after
    training (preflight) or later (publish_checkpoint), fails before any request."""
    from lerobot_pipe.hub.publish import PublishError, publish_checkpoint
    from lerobot_pipe.scripts.train import main as train_main

    cfg = SmolVLAConfig.tiny(vlm_model_name=str(tiny_vlm), **FEATURES)
    cfg.save_pretrained(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt/config.json").read_text())["vlm_model_name"] == str(
        tiny_vlm
    )
    (tmp_path / "ckpt/model.safetensors").write_bytes(b"")
    with pytest.raises(PublishError, match="others could not rebuild this policy's VLM"):
        publish_checkpoint(
            tmp_path / "ckpt", "me/smolvla", intermediate=False, step=1,
            endpoint="http://127.0.0.1:1", token="hf_test",
        )  # fmt: skip
    assert SmolVLAConfig.tiny(**FEATURES).publish_problem() is None  # the default Hub id
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    argv = [
        "--policy.type=smolvla",
        f"--policy.vlm_model_name={tiny_vlm}",
        "--policy.push_to_hub=true",
        "--policy.repo_id=me/smolvla",
        "--dataset.root=/nonexistent/ds",
        f"--output_dir={tmp_path / 'out'}",
    ]
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert "name a Hub id" in err or "Hub repo id" in err, err
    assert not (tmp_path / "out").exists()


def test_policy_path_hub_id_loads_without_the_vlm_weights(tmp_path, hub_server):  # noqa: F811
    """``--policy.path=<hub id>`` of a smolvla_base-style checkpoint (load_vlm_weights=true,
    vlm_model_name a Hub id): the policy comes through huggingface_hub's cache and its VLM is
    built from the VLM repo's config alone; the VLM's own weights are never downloaded."""
    from huggingface_hub import HfApi
    from smolvla_tiny import build_tiny_smolvlm

    from lerobot_pipe.policies.factory import make_policy
    from lerobot_pipe.policies.smolvla import SmolVLAPolicy

    api = HfApi(endpoint=hub_server.url, token=hub_server.token)
    vlm = build_tiny_smolvlm(tmp_path / "vlm", with_weights=True)
    # Its own repo name: transformers remembers the revision a name resolved to in this process.
    api.create_repo("tiny/smolvlm-base")
    api.upload_folder(repo_id="tiny/smolvlm-base", folder_path=vlm)
    torch.manual_seed(0)
    cfg = SmolVLAConfig.tiny(vlm_model_name=str(vlm), load_vlm_weights=True, **FEATURES)
    policy = SmolVLAPolicy(cfg)
    policy.config.vlm_model_name = "tiny/smolvlm-base"
    policy.save_pretrained(tmp_path / "ckpt")
    api.create_repo("me/smolvla")
    api.upload_folder(repo_id="me/smolvla", folder_path=tmp_path / "ckpt")
    # The trainer's --policy.path: make_policy with pretrained_path.
    wanted = SmolVLAConfig.from_pretrained(tmp_path / "ckpt")
    wanted.pretrained_path = "me/smolvla"
    loaded = make_policy(wanted)
    expected = policy.state_dict()
    got = loaded.state_dict()
    assert all(
        torch.equal(got[k], expected[k]) and got[k].dtype == expected[k].dtype for k in expected
    )
    downloaded = [
        p.relative_to(hub_server.cache_dir)
        for p in Path(hub_server.cache_dir).rglob("*.safetensors")
    ]
    assert [p for p in downloaded if "tiny--smolvlm-base" in str(p)] == [], downloaded
    assert any("me--smolvla" in str(p) for p in downloaded), downloaded


def test_the_meta_build_finds_the_vlms_weight_files_through_the_hub_cache(
    tmp_path,
    hub_server,  # noqa: F811
):
    """load_vlm_weights=true on the meta device reads the VLM's own files, found as
    from_pretrained finds them: for a Hub id downloaded into huggingface_hub's cache, one
    model.safetensors or the shards model.safetensors.index.json names (each key's file)."""
    from huggingface_hub import HfApi
    from safetensors.torch import load_file
    from smolvla_tiny import build_tiny_smolvlm

    from lerobot_pipe.policies.smolvla.vlm_expert import vlm_weight_files

    api = HfApi(endpoint=hub_server.url, token=hub_server.token)
    one = build_tiny_smolvlm(tmp_path / "one", with_weights=True)
    shards = build_tiny_smolvlm(tmp_path / "shards", with_weights=True, max_shard_size="40KB")
    for repo, folder in (("tiny/vlm-one-file", one), ("tiny/vlm-in-shards", shards)):
        api.create_repo(repo)
        api.upload_folder(repo_id=repo, folder_path=folder)
    cache = Path(hub_server.cache_dir)
    single = vlm_weight_files("tiny/vlm-one-file")
    assert single.is_relative_to(cache) and single.name == "model.safetensors"
    expected = load_file(single)
    by_key = vlm_weight_files("tiny/vlm-in-shards")
    assert by_key.keys() == expected.keys()
    files = set(by_key.values())
    assert len(files) > 1 and all(f.is_relative_to(cache) for f in files)
    for key, file in by_key.items():
        assert torch.equal(load_file(file)[key], expected[key]), key
    assert vlm_weight_files(str(one)) == one / "model.safetensors"  # a local folder as it is
    with pytest.raises(FileNotFoundError, match="neither model.safetensors"):
        vlm_weight_files(str(build_tiny_smolvlm(tmp_path / "config_only")))


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp2"])
def test_data_parallel_matches_one_process(tiny_vlm, tmp_path, parallelism):
    """2 gloo processes (DDP, or FSDP2 on the declared units: the vision tower's layers) train
    as one process on the same global batch, within 1e-5: the noise and flow times come from the
    sample keys, the loss is normalized over the global batch. The VLM is trained too."""
    from launch import run_distributed
    from tiny import losses, run_train

    from lerobot_pipe.datasets import write_synthetic_dataset

    root = write_synthetic_dataset(
        tmp_path / "ds", num_episodes=4, episode_length=10, cameras=["top"], image_size=32,
        pixels_only=True, num_tasks=2,
    )  # fmt: skip
    flags = {
        "policy.type": "smolvla",
        "policy.vlm_model_name": str(tiny_vlm),
        **{f"policy.{k}": v for k, v in SMOLVLA_TINY_PRESET.items()},
        "policy.resize_imgs_with_padding": "[32,32]",
        "policy.train_expert_only": "false",
        "policy.freeze_vision_encoder": "false",
        "dataset.root": str(root),
        "steps": 3,
        "num_workers": 0,
        "log_freq": 1,
        "save_freq": 0,
    }
    argv = [f"--{k}={v}" for k, v in flags.items()]
    run_train([*argv, "--batch_size=4", f"--output_dir={tmp_path / 'one'}"])
    shard = ["--parallelism.dp_shard=2"] if parallelism == "fsdp2" else []
    run_distributed(
        run_train, 2, [*argv, *shard, "--batch_size=2", f"--output_dir={tmp_path / 'two'}"]
    )
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert one.keys() == two.keys() == {1, 2, 3}
    for step in one:
        assert abs(one[step] - two[step]) < 1e-5, (step, one[step], two[step])


class _MatmulRows(TorchDispatchMode):
    """Counts the multiply-adds of the matrix products run while it is active."""

    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default):
            self.count += args[0].numel() * args[1].shape[-1]
        elif func is torch.ops.aten.addmm.default:
            self.count += args[1].numel() * args[2].shape[-1]
        return out


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"attention_mode": "self_attn", "num_expert_layers": 1},
        {"attention_mode": "self_attn"},
        {"train_expert_only": False},
    ],
    ids=["cross-and-joint", "a-layer-without-expert", "joint-only", "vlm-trained"],
)
def test_frozen_prefix_rows_skip_autograd_with_the_same_loss_and_gradients(
    tiny_vlm, monkeypatch, overrides
):
    """With the VLM's text layers frozen, the prefix rows before the state token (frames and
    task tokens, which never attend to it) run without autograd (vlm_expert.forward_joint's
    split): the loss and every trainable parameter's gradient equal the joint computation's
    (within float rounding; padded task tokens included), and the backward has fewer matrix
    products. Where the VLM trains, nothing is split."""
    from lerobot_pipe.policies.smolvla import SmolVLAPolicy
    from lerobot_pipe.policies.smolvla.vlm_expert import SmolVLMWithExpert

    torch.manual_seed(0)
    policy = SmolVLAPolicy(
        SmolVLAConfig.tiny(vlm_model_name=str(tiny_vlm), **FEATURES, **overrides)
    )
    policy.train()
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False  # padded task tokens: rows that attend to nothing
    batch = {
        "observation.images.top": torch.rand(3, 3, 32, 32),
        "observation.state": torch.randn(3, 2),
        "observation.language.tokens": torch.randint(0, 20, (3, 5)),
        "observation.language.attention_mask": mask,
        "action": torch.randn(3, 4, 2),
    }
    noise, t = torch.randn(3, 4, 8), torch.rand(3)
    trainable = {n: p for n, p in policy.named_parameters() if p.requires_grad}

    def loss_and_grads(split: bool):
        if not split:
            monkeypatch.setattr(SmolVLMWithExpert, "_splits", lambda *a: False)
        policy.zero_grad(set_to_none=True)
        loss, _ = policy.forward(batch, noise=noise, time=t)
        with _MatmulRows() as rows:
            loss.backward()
        monkeypatch.undo()
        grads = {n: p.grad.clone() for n, p in trainable.items() if p.grad is not None}
        return loss.detach(), grads, rows.count

    calls = []
    original = SmolVLMWithExpert._forward_joint_split
    monkeypatch.setattr(
        SmolVLMWithExpert,
        "_forward_joint_split",
        lambda self, *a: calls.append(1) or original(self, *a),
    )
    split_loss, split_grads, split_rows = loss_and_grads(True)
    assert bool(calls) == overrides.get("train_expert_only", True)
    joint_loss, joint_grads, joint_rows = loss_and_grads(False)
    # The backward's matrix products over fewer rows where split (the same where not).
    assert (split_rows < joint_rows) == bool(calls), (split_rows, joint_rows)
    torch.testing.assert_close(split_loss, joint_loss, rtol=1e-6, atol=1e-7)
    assert split_grads.keys() == joint_grads.keys() and "model.state_proj.weight" in split_grads
    for name, grad in joint_grads.items():
        torch.testing.assert_close(split_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
