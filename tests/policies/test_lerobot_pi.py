"""pi0 and pi0.5 against LeRobot 0.6.1 itself (its Python, torch 2.11 and transformers 5.5), both
ways, on the dummy geometry in fp32 (issue #38 item 3):

- its configs' fields and defaults are ours (a ``pi0_base`` / ``pi05_base``-style config.json
  loads here);
- our checkpoint (with its processors) loads in LeRobot's PI0Policy / PI05Policy with every
  tensor equal to the file's after loading (LeRobot's pi ``from_pretrained`` keeps random weights
  where a load fails: checked tensor by tensor) and exactly its key set; on the same raw batch
  both give the same tokens and prompts, the same loss from the same noise and time (1e-5) and
  the same actions from the same noise (1e-4);
- a LeRobot-initialised, LeRobot-saved policy loads here strictly and gives LeRobot's numbers;
  both sides save the same processor steps.

LeRobot runs in its own environment (tests/upstream.py) as one subprocess for all jobs, driven by
lerobot_pi_driver.py, which patches LeRobot to build the dummy geometry (tests/pi_tiny.py); the
tokenizer is a tiny one placed in the Hub cache under PaliGemma's name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pi_tiny import (
    ACTION_DIM,
    CAMERAS,
    MAX_DIM,
    STATE_DIM,
    lerobot_defaults,
    lerobot_pi_config,
    paligemma_tokenizer_cache,
    write_config,
)
from safetensors.torch import load_file, save_file
from upstream import find_upstream
from vla_tools import run_saved_policy

pytest.importorskip("transformers", reason="pi0's tokenizer needs transformers")

from lerobot_pipe.configs.parser import to_dict  # noqa: E402
from lerobot_pipe.configs.policies import PreTrainedConfig  # noqa: E402
from lerobot_pipe.policies.factory import get_policy_class, make_pre_post_processors  # noqa: E402

UPSTREAM, WHY_NOT = find_upstream()
DRIVER = Path(__file__).with_name("lerobot_pi_driver.py")
B, CHUNK = 2, 4
KINDS = ("pi0", "pi05")
TASKS = ["pick up the cube", "put_it in the box\n"]


def _stats() -> dict:
    g = torch.Generator().manual_seed(3)
    out = {}
    for key, dim in (("observation.state", STATE_DIM), ("action", ACTION_DIM)):
        low = -1 - torch.rand(dim, generator=g)
        high = 1 + torch.rand(dim, generator=g)
        out[key] = {
            "mean": (torch.rand(dim, generator=g) - 0.5).tolist(),
            "std": (0.5 + torch.rand(dim, generator=g)).tolist(),
            "min": (low - 0.2).tolist(),
            "max": (high + 0.2).tolist(),
            "q01": low.tolist(),
            "q99": high.tolist(),
        }
    return out


STATS = _stats()

pytestmark = [pytest.mark.interop, pytest.mark.skipif(UPSTREAM is None, reason=WHY_NOT)]


def raw_inputs(seed: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    inputs = {key: torch.rand(B, *shape, generator=g) for key, shape in sorted(CAMERAS.items())}
    return {
        **inputs,
        "observation.state": torch.randn(B, STATE_DIM, generator=g),
        "action": torch.randn(B, CHUNK, ACTION_DIM, generator=g),
        "action_is_pad": torch.tensor([[False] * CHUNK, [False, False, True, True]]),
        "noise": torch.randn(B, CHUNK, MAX_DIM, generator=g),
        "time": torch.tensor([0.3, 0.85]),
    }


def ours(folder: Path, inputs: dict[str, torch.Tensor], tasks: list[str] = TASKS) -> dict:
    """Our policy and processors loaded from ``folder``, run as the driver runs LeRobot's."""
    return run_saved_policy(folder, inputs, tasks)


def save_ours(kind: str, folder: Path, seed: int) -> Path:
    """Our freshly initialised policy for LeRobot's tiny config, saved with its processors."""
    config = PreTrainedConfig.from_pretrained(write_config(folder, lerobot_pi_config(kind)))
    torch.manual_seed(seed)
    policy = get_policy_class(kind)(config)
    policy.save_pretrained(folder)
    stats = {k: {s: torch.tensor(v) for s, v in d.items()} for k, d in STATS.items()}
    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    pre.save_pretrained(folder)
    post.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Our checkpoints and LeRobot's for both policies, and every job's results, from one
    LeRobot process."""
    tmp = tmp_path_factory.mktemp("pi_interop")
    with paligemma_tokenizer_cache(tmp / "hf"):
        inputs = raw_inputs()
        save_file(inputs, str(tmp / "inputs.safetensors"))
        jobs, out = [], {}
        for kind in KINDS:
            mine = save_ours(kind, tmp / f"ours_{kind}", seed=0)
            theirs = tmp / f"lerobot_{kind}"
            jobs += [
                {"kind": "defaults", "policy": kind},
                {"kind": "init_and_save", "config_dir": str(mine), "seed": 1, "stats": STATS,
                 "out_dir": str(theirs)},
                {"kind": "run", "policy_dir": str(mine), "inputs": str(tmp / "inputs.safetensors"),
                 "tasks": TASKS, "out": str(tmp / f"lerobot_on_ours_{kind}.safetensors")},
                {"kind": "run", "policy_dir": str(theirs),
                 "inputs": str(tmp / "inputs.safetensors"), "tasks": TASKS,
                 "out": str(tmp / f"lerobot_on_theirs_{kind}.safetensors")},
            ]  # fmt: skip
            out[kind] = {"mine": mine, "theirs": theirs}
        (tmp / "jobs.json").write_text(json.dumps(jobs))
        UPSTREAM.run_script(
            DRIVER, tmp / "jobs.json", tmp / "results.json", home=tmp / "hf", timeout=600
        )
        results = json.loads((tmp / "results.json").read_text())
        for i, kind in enumerate(KINDS):
            r = results[4 * i : 4 * i + 4]
            mine, theirs = out[kind]["mine"], out[kind]["theirs"]
            out[kind] |= {
                "defaults": r[0],
                "saved": r[1],
                "on_ours": {**load_file(str(tmp / f"lerobot_on_ours_{kind}.safetensors")), **r[2]},
                "on_theirs": {
                    **load_file(str(tmp / f"lerobot_on_theirs_{kind}.safetensors")),
                    **r[3],
                },
                "ours_on_ours": ours(mine, inputs),
                "ours_on_theirs": ours(theirs, inputs),
            }
        yield out


@pytest.mark.parametrize("kind", KINDS)
def test_config_fields_and_defaults_are_lerobots(runs, kind, tmp_path):
    theirs = dict(runs[kind]["defaults"])
    assert theirs == {k: v for k, v in lerobot_defaults(kind).items() if k != "type"}
    mine = to_dict(PreTrainedConfig.get_choice_class(kind)())
    mine.pop("type")
    # Documented: push_to_hub defaults to false here; LeRobot resolves device when building.
    assert theirs.pop("push_to_hub") is True and mine.pop("push_to_hub") is False
    theirs.pop("device"), mine.pop("device")
    assert mine == theirs
    # A pi0_base-style config.json (LeRobot's encoding) loads here.
    (tmp_path / "config.json").write_text(json.dumps({"type": kind, **runs[kind]["defaults"]}))
    loaded = PreTrainedConfig.from_pretrained(tmp_path)
    assert loaded.type == kind and tuple(loaded.image_resolution) == (224, 224)


@pytest.mark.parametrize("kind", KINDS)
def test_our_checkpoint_loads_in_lerobot_tensor_by_tensor(runs, kind):
    on_ours = runs[kind]["on_ours"]
    assert on_ours["mismatched"] == on_ours["missing"] == on_ours["unexpected"] == []
    assert on_ours["keys"] == runs[kind]["ours_on_ours"]["keys"]
    assert on_ours["keys"] == sorted(load_file(str(runs[kind]["mine"] / "model.safetensors")))


@pytest.mark.parametrize("kind", KINDS)
def test_lerobot_checkpoint_loads_here_with_its_keys(runs, kind):
    saved = runs[kind]["saved"]
    assert sorted(saved["keys"]) == runs[kind]["ours_on_theirs"]["keys"]
    policy = runs[kind]["ours_on_theirs"]["policy"]
    assert sum(p.numel() for p in policy.parameters()) == saved["parameters"]
    file = load_file(str(runs[kind]["theirs"] / "model.safetensors"))
    for key, value in policy.state_dict().items():
        assert torch.equal(value, file[key]), key


@pytest.mark.parametrize("which", ["ours", "theirs"])
@pytest.mark.parametrize("kind", KINDS)
def test_same_tokens_loss_and_actions(runs, kind, which):
    lerobot, mine = runs[kind][f"on_{which}"], runs[kind][f"ours_on_{which}"]
    assert torch.equal(mine["tokens"], lerobot["tokens"])
    assert torch.equal(mine["mask"], lerobot["mask"])
    torch.testing.assert_close(mine["state"], lerobot["state"], atol=1e-6, rtol=0)
    torch.testing.assert_close(mine["loss"], lerobot["loss"], atol=1e-5, rtol=0)
    torch.testing.assert_close(mine["per_sample"], lerobot["per_sample"], atol=1e-5, rtol=0)
    torch.testing.assert_close(mine["actions"], lerobot["actions"], atol=1e-4, rtol=0)
    torch.testing.assert_close(mine["actions_post"], lerobot["actions_post"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_both_save_the_same_processor_steps(runs, kind):
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        mine = json.loads((runs[kind]["mine"] / name).read_text())
        theirs = json.loads((runs[kind]["theirs"] / name).read_text())
        assert mine == theirs, name


# --- sharded checkpoints both ways ------------------------------------------------------------

FSDP2 = ["--parallelism.dp_shard=2", "--checkpoint_format=dcp"]
TRAINED_TASKS = ["Reach it.", "Move the point to the goal."]


def tiny_flags(kind: str) -> dict:
    """The dummy geometry as command-line flags (LeRobot's and ours alike)."""
    return {
        "policy.type": kind,
        "policy.paligemma_variant": "dummy",
        "policy.action_expert_variant": "dummy",
        "policy.chunk_size": CHUNK,
        "policy.n_action_steps": CHUNK,
        "policy.max_state_dim": MAX_DIM,
        "policy.max_action_dim": MAX_DIM,
        "policy.num_inference_steps": 3,
        "policy.image_resolution": "[56,56]",
    }


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


def trained_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {
        "observation.images.top": torch.rand(B, 3, 56, 56, generator=g),
        "observation.state": torch.randn(B, 2, generator=g),
        "action": torch.randn(B, CHUNK, 2, generator=g),
        "noise": torch.randn(B, CHUNK, MAX_DIM, generator=g),
        "time": torch.tensor([0.5, 0.05]),
    }


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> dict:
    """LeRobot's own lerobot-train runs pi0.5 (2 steps); here, on FSDP2 (2 processes, converted):
    a pi0.5 from scratch, LoRA (LeRobot's default targets) on LeRobot's checkpoint, and LeRobot's
    checkpoint fine-tuned with ``--policy.path`` (checkpoints at steps 1 and 2) then resumed from
    step 1. LeRobot loads the first two as lerobot-eval does and runs them."""
    from launch import run_distributed
    from tiny import run_train

    from lerobot_pipe.datasets import write_synthetic_dataset
    from lerobot_pipe.scripts.convert_dcp import main as convert_dcp

    tmp = tmp_path_factory.mktemp("pi_sharded_interop")
    root = write_synthetic_dataset(
        tmp / "ds", num_episodes=2, episode_length=8, cameras=["top"], image_size=56,
        pixels_only=True, num_tasks=2,
    )  # fmt: skip
    with paligemma_tokenizer_cache(tmp / "hf"):
        theirs = tmp / "lerobot_run"
        lerobot_argv = train_flags(
            root, theirs, **tiny_flags("pi05"), **{"dataset.repo_id": "local/pi"},
            **{"wandb.enable": "false", "policy.device": "cpu", "policy.push_to_hub": "false"},
        )  # fmt: skip
        (tmp / "train.json").write_text(json.dumps([{"kind": "train", "argv": lerobot_argv}]))
        UPSTREAM.run_script(
            DRIVER, tmp / "train.json", tmp / "train_results.json", home=tmp / "hf", timeout=600
        )
        assert json.loads((tmp / "train_results.json").read_text()) == [{}]
        lerobot = theirs / "checkpoints/000002/pretrained_model"
        lora = {"policy.path": str(lerobot), "peft.r": 4, "policy.optimizer_lr": 0.01}
        fine_tune = {"policy.path": str(lerobot), "save_freq": 1, "log_freq": 1}
        folders = {}
        for name, flags in [
            ("fsdp2", tiny_flags("pi05")),
            ("lora", lora),
            ("fine_tune", fine_tune),
        ]:
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
        save_file(trained_inputs(), str(inputs))
        jobs = [
            {"kind": "run", "policy_dir": str(folders[name]), "inputs": str(inputs),
             "tasks": TRAINED_TASKS, "dataset_root": str(root),
             "out": str(tmp / f"{name}.safetensors")}
            for name in ("fsdp2", "lora")
        ]  # fmt: skip
        (tmp / "jobs.json").write_text(json.dumps(jobs))
        UPSTREAM.run_script(
            DRIVER, tmp / "jobs.json", tmp / "results.json", home=tmp / "hf", timeout=600
        )
        results = json.loads((tmp / "results.json").read_text())
        raw = load_file(str(inputs))
        yield {
            **{
                f"on_{name}": {**load_file(str(tmp / f"{name}.safetensors")), **result}
                for name, result in zip(("fsdp2", "lora"), results, strict=True)
            },
            "ours_on_fsdp2": ours(folders["fsdp2"], raw, TRAINED_TASKS),
            "ours_on_lora": ours(folders["lora"], raw, TRAINED_TASKS),
            "ours_on_lerobot": ours(lerobot, raw, TRAINED_TASKS),
            "folders": folders,
            "lerobot": lerobot,
            "fine_tune": tmp / "fine_tune",
            "resumed": resumed,
        }


def test_our_converted_fsdp2_checkpoint_loads_in_lerobot_tensor_by_tensor(sharded):
    on = sharded["on_fsdp2"]
    assert on["mismatched"] == on["missing"] == on["unexpected"] == []
    keys = sorted(load_file(str(sharded["folders"]["fsdp2"] / "model.safetensors")))
    assert on["keys"] == keys == sharded["ours_on_fsdp2"]["keys"]


def test_our_fsdp2_lora_adapter_loads_in_lerobot_with_every_tensor(sharded):
    """LeRobot took the PEFT path (config.json's use_peft; the base named by adapter_config.json)
    and its PeftModel holds exactly the adapter file's tensors, on LeRobot's default targets."""
    folder = sharded["folders"]["lora"]
    assert not (folder / "model.safetensors").exists()
    assert json.loads((folder / "config.json").read_text())["use_peft"] is True
    on = sharded["on_lora"]
    assert on["peft"] == "PeftModel" and on["mismatched"] == on["missing"] == on["unexpected"] == []
    adapter = sorted(load_file(str(folder / "adapter_model.safetensors")))
    assert on["adapter_keys"] == adapter
    modules = {k.split(".lora_")[0].removeprefix("base_model.model.model.") for k in adapter}
    expert = "paligemma_with_expert.gemma_expert.model.layers"
    assert modules == {
        *(f"{expert}.{i}.self_attn.{p}_proj" for i in range(4) for p in "qv"),
        "action_in_proj", "action_out_proj",
    }  # fmt: skip


@pytest.mark.parametrize("which", ["fsdp2", "lora"])
def test_same_tokens_loss_and_actions_on_our_sharded_checkpoints(sharded, which):
    lerobot, mine = sharded[f"on_{which}"], sharded[f"ours_on_{which}"]
    assert torch.equal(lerobot["tokens"], mine["tokens"])
    assert torch.equal(lerobot["mask"], mine["mask"])
    torch.testing.assert_close(mine["loss"], lerobot["loss"], atol=1e-5, rtol=0)
    torch.testing.assert_close(mine["per_sample"], lerobot["per_sample"], atol=1e-5, rtol=0)
    torch.testing.assert_close(mine["actions"], lerobot["actions"], atol=1e-4, rtol=0)
    torch.testing.assert_close(mine["actions_post"], lerobot["actions_post"], atol=1e-4, rtol=0)
    if which == "lora":  # the adapter acts: its base alone gives other actions
        base = sharded["ours_on_lerobot"]["actions"]
        assert (lerobot["actions"] - base).abs().max() > 100 * 1e-5


def test_we_fine_tune_lerobots_trained_pi05_on_fsdp2_and_resume(sharded):
    """--policy.path=<a pi0.5 trained by LeRobot's own lerobot-train> trains here on FSDP2 from
    LeRobot's weights; resumed from its step-1 checkpoint it goes on as the uninterrupted run."""
    from tiny import losses

    tuned = load_file(str(sharded["folders"]["fine_tune"] / "model.safetensors"))
    start = load_file(str(sharded["lerobot"] / "model.safetensors"))
    assert tuned.keys() == start.keys()
    head = "model.paligemma_with_expert.paligemma.lm_head.weight"
    assert torch.equal(tuned[head], start[head])  # never used: LeRobot's, unchanged
    out = "model.action_out_proj.weight"
    assert not torch.equal(tuned[out], start[out])  # trained from LeRobot's
    uninterrupted, resumed = losses(sharded["fine_tune"]), losses(sharded["resumed"])
    assert uninterrupted.keys() == {1, 2} and resumed.keys() == {2}
    assert abs(resumed[2] - uninterrupted[2]) < 1e-6
