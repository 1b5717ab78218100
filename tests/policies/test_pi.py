"""pi0 and pi0.5 in one process (issue #38 items 1, 2 and 4): the configs' checks, LeRobot's
sizes and key set on the dummy geometry, the lm_head rule, the dtype rule, the key fixes for
``pi0_base`` / ``pi05_base``-layout files, the unit probe, the policy's own gradient
checkpointing, the processors and the tokenizer's error. Against LeRobot 0.6.1 itself:
test_lerobot_pi.py; sharded: test_pi_sharded.py."""

from __future__ import annotations

import contextlib

import pytest
import torch
from pi_tiny import lerobot_defaults, paligemma_tokenizer_cache
from safetensors.torch import save_file

from lerobot_pipe.configs.parser import to_dict
from lerobot_pipe.policies.factory import get_policy_class, make_policy_config
from lerobot_pipe.policies.pi0 import PI_TINY_PRESET
from lerobot_pipe.policies.pi0.paligemma_expert import KEEP_FLOAT32

KINDS = ("pi0", "pi05")
FEATURES = dict(
    input_features={
        "observation.images.top": {"type": "VISUAL", "shape": [3, 56, 56]},
        "observation.images.wrist": {"type": "VISUAL", "shape": [3, 48, 64]},
        "observation.state": {"type": "STATE", "shape": [6]},
    },
    output_features={"action": {"type": "ACTION", "shape": [6]}},
)
# LeRobot 0.6.1's own build of the dummy geometry (its constructors, patched for "dummy").
LEROBOT_SIZES = {"pi0": (49_771_112, 126), "pi05": (49_878_184, 133)}
LM_HEADS = (
    "model.paligemma_with_expert.paligemma.lm_head.weight",
    "model.paligemma_with_expert.gemma_expert.lm_head.weight",
)


def tiny(kind: str, **changes):
    cfg = make_policy_config(kind, **{**PI_TINY_PRESET, **FEATURES, **changes})
    torch.manual_seed(0)
    return get_policy_class(kind)(cfg)


def batch_of(policy, b: int = 2, seed: int = 5) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.images.top": torch.rand(b, 3, 56, 56, generator=g),
        "observation.images.wrist": torch.rand(b, 3, 48, 64, generator=g),
        "observation.state": torch.randn(b, 6, generator=g),
        "action": torch.randn(b, policy.config.chunk_size, 6, generator=g),
        "observation.language.tokens": torch.randint(4, 250, (b, 10), generator=g),
        "observation.language.attention_mask": torch.tensor(
            [[True] * 10, [True] * 7 + [False] * 3]
        ),
        "sample_key": torch.arange(b) * 7 + 3,
    }


# --- configs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_defaults_are_lerobots(kind):
    """Every field and default of LeRobot 0.6.1's config (pi_tiny holds what its driver reported;
    test_lerobot_pi.py compares against LeRobot itself)."""
    mine = to_dict(make_policy_config(kind))
    theirs = lerobot_defaults(kind)
    assert theirs.pop("push_to_hub") is True and mine.pop("push_to_hub") is False  # documented
    theirs.pop("device"), mine.pop("device")
    assert mine == theirs


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"paligemma_variant": "dummy"}, "dummy geometry is for both stacks or neither"),
        ({"action_expert_variant": "gemma_7b"}, "choose one of"),
        ({"rtc_config": {"enabled": True}}, "real-time chunking"),
        ({"use_relative_actions": True}, "relative actions are not built"),
        ({"image_resolution": (224, 192)}, "must be square"),
        ({"dtype": "float16"}, "choose one of"),
        ({"n_action_steps": 60}, "must be <= chunk_size"),
    ],
)
def test_config_refuses_what_is_not_built_or_inconsistent(changes, message):
    with pytest.raises(ValueError, match=message):
        make_policy_config("pi05", **changes)


def test_pi0_fast_is_refused_by_name_saying_why():
    with pytest.raises(ValueError, match="'pi0_fast' is not built here: .*remote code"):
        make_policy_config("pi0_fast")


def test_compile_model_compiles_the_training_forward_and_the_sampler():
    """Honoured unsharded, as LeRobot's: both wrapped by torch.compile (compiled at their first
    call; on this CPU ~1 min each, giving the eager loss exactly and actions within 2e-7)."""
    policy = tiny("pi0", compile_model=True, compile_mode="default")
    for fn in (policy.model.velocity_loss, policy.model.sample_actions):
        assert getattr(fn, "_torchdynamo_orig_callable", None) is not None


def test_compile_is_refused_under_sharding_with_the_reason():
    cfg = make_policy_config("pi0", compile_model=True)
    assert "torch.compile" in cfg.sharding_problem()
    assert make_policy_config("pi0", dtype="bfloat16").sharding_problem() is None  # see below


# --- the model ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_sizes_and_keys_are_lerobots(kind):
    policy = tiny(kind, max_state_dim=8, max_action_dim=8)
    state = policy.state_dict()
    assert (sum(v.numel() for v in state.values()), len(state)) == LEROBOT_SIZES[kind]
    assert set(LM_HEADS) <= set(state)
    adarms = [k for k in state if k.endswith("layernorm.dense.weight") or ".norm.dense." in k]
    assert bool(adarms) == (kind == "pi05")
    assert ("model.state_proj.weight" in state) == (kind == "pi0")


@pytest.mark.parametrize("kind", KINDS)
def test_the_lm_heads_are_frozen_and_every_trainable_parameter_gets_a_gradient(kind):
    """The two lm_heads never run: frozen (no gradient, no AdamW state); so are the parts whose
    output feeds nothing (the language model's last layer after its keys and values, its final
    norm). Every other parameter gets a gradient: DDP needs no find_unused_parameters."""
    policy = tiny(kind)
    policy.train()
    loss, _ = policy(batch_of(policy))
    loss.backward()
    named = dict(policy.named_parameters())
    for head in LM_HEADS:
        assert not named[head].requires_grad and named[head].grad is None
    assert all(p.grad is not None for p in named.values() if p.requires_grad)
    frozen = sorted(n for n, p in named.items() if not p.requires_grad)
    assert all(".lm_head." in n or "language_model" in n for n in frozen), frozen
    optimizer = torch.optim.AdamW(policy.get_optim_params()[0]["params"])
    optimizer.step()
    assert not any(named[h] in optimizer.state for h in LM_HEADS)


@pytest.mark.parametrize("kind", KINDS)
def test_dtype_bfloat16_keeps_lerobots_float32_parts(kind):
    policy = tiny(kind, dtype="bfloat16")
    for name, p in policy.named_parameters():
        inner = name.removeprefix("model.paligemma_with_expert.")
        float32 = inner == name or any(part in inner for part in KEEP_FLOAT32)
        assert p.dtype == (torch.float32 if float32 else torch.bfloat16), name
    loss, _ = policy(batch_of(policy))
    assert torch.isfinite(loss)


@pytest.mark.parametrize("kind", KINDS)
def test_keyed_draws_do_not_depend_on_the_batch_around_a_sample(kind):
    policy = tiny(kind)
    policy.eval()
    batch = batch_of(policy, b=2)
    pair, _ = policy(batch, reduction="none")
    single = {k: v[1:] for k, v in batch.items()}
    alone, _ = policy(single, reduction="none")
    torch.testing.assert_close(alone, pair[1:], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_base_layout_file_loads_with_lerobots_key_fixes(kind, tmp_path):
    """A ``pi0_base`` / ``pi05_base``-style file: no ``model.`` prefix, no embedding (read from
    lm_head), openpi's time-MLP names; pi0.5's also holds a ``state_proj`` it ignores."""
    policy = tiny(kind)
    state = policy.state_dict()
    file = {}
    for key, value in state.items():
        if key.endswith("embed_tokens.weight"):
            continue
        name = key.removeprefix("model.")
        if kind == "pi0":
            name = name.replace("action_time_mlp_", "time_mlp_")
        else:
            name = name.replace("time_mlp_", "action_time_mlp_")
        file[name] = value.clone()
    if kind == "pi05":
        file["state_proj.weight"] = torch.zeros(64, 8)
    policy.config.save_pretrained(tmp_path)
    save_file(file, str(tmp_path / "model.safetensors"))
    loaded = get_policy_class(kind).from_pretrained(tmp_path)
    for key, value in loaded.state_dict().items():
        want = state[LM_HEADS[0]] if key.endswith("embed_tokens.weight") else state[key]
        assert torch.equal(value, want), key


@pytest.mark.parametrize("kind", KINDS)
def test_the_unit_probe_finds_no_bypassed_unit(kind):
    """Every declared unit's parameters are used while its forward or unit entry runs, in the
    training forward and in sampling, on the real model and on the meta device."""
    from lerobot_pipe.distributed.unit_probe import MetaValues, find_bypassed_modules

    units = get_policy_class(kind)._fsdp_wrap_modules
    for meta in (False, True):
        policy = tiny(kind)
        batch = batch_of(policy)
        if meta:
            policy = policy.to("meta")
            batch = {k: v.to("meta") for k, v in batch.items()}
        observation = {k: v for k, v in batch.items() if k != "action"}
        with MetaValues() if meta else contextlib.nullcontext():
            bypassed = find_bypassed_modules(
                policy,
                lambda p=policy, b=batch: p(b),
                lambda p=policy, o=observation: p.select_action(o),
                reset=policy.reset,
            )
        modules = dict(policy.named_modules())
        assert not [n for n in bypassed if type(modules[n]).__name__ in units], bypassed


EMBEDDING = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens"


@pytest.mark.parametrize(
    ("fsdp", "where"),
    [
        ({}, "rows"),
        ({"cpu_offload": True}, "unit"),
        ({"wrap_modules": ["PiGemmaDecoderLayer", "PiTokenEmbedding"]}, "unit"),
        ({"ignored_modules": "embed_tokens$"}, "ignored"),
        ({"min_num_params": 100_000}, "unit"),  # the size policy makes the 16 M table a unit
    ],
    ids=["default", "cpu_offload", "wrap_modules", "ignored_modules", "min_num_params"],
)
def test_the_token_embedding_is_sharded_by_rows_unless_a_unit_or_a_flag_takes_it(fsdp, where):
    """The sharding plan (decided before launch): the 257,152-row embedding is vocab-parallel
    (distributed/vocab_parallel.py), never a unit and never left in the root, unless the flags
    make it a unit (CPU offload, wrap_modules naming it, the size policy) or ignore it."""
    from lerobot_pipe.configs.train import AcceleratorConfig, FSDPConfig
    from lerobot_pipe.distributed.parallelize import plan_sharding

    policy = tiny("pi0").to("meta")
    accelerator = AcceleratorConfig(fsdp=FSDPConfig(**fsdp))
    plan = plan_sharding(policy, accelerator, type(policy)._fsdp_wrap_modules)
    placed = {
        "rows": EMBEDDING in plan.vocab_parallel,
        "unit": EMBEDDING in plan.wrap_units,
        "ignored": EMBEDDING in plan.ignored_modules,
    }
    assert [k for k, v in placed.items() if v] == [where], plan


@pytest.mark.parametrize("kind", KINDS)
def test_each_decoder_layer_and_its_mlp_are_units_and_nothing_large_stays_in_the_root(kind):
    """The default plan: each SigLIP layer, each decoder layer of both stacks with its MLP as a
    unit inside it (gathered only while the MLP runs), the two lm_heads; the embedding by rows.
    What the root keeps is small (norms, projections, the action and time MLPs)."""
    from lerobot_pipe.configs.train import AcceleratorConfig
    from lerobot_pipe.distributed.parallelize import plan_sharding

    policy = tiny(kind).to("meta")
    plan = plan_sharding(policy, AcceleratorConfig(), type(policy)._fsdp_wrap_modules)
    backbone = policy.model.paligemma_with_expert
    stacks = {
        "model.paligemma_with_expert.paligemma.model.language_model": backbone.language_model,
        "model.paligemma_with_expert.gemma_expert.model": backbone.expert,
    }
    want = {
        f"{prefix}.layers.{i}{part}"
        for prefix, stack in stacks.items()
        for i in range(len(stack.layers))
        for part in ("", ".mlp")
    }
    assert want <= set(plan.wrap_units)
    assert sum(u.endswith("lm_head") for u in plan.wrap_units) == 2
    covered = plan.wrap_units + plan.vocab_parallel
    root = [
        n for n, _ in policy.named_parameters() if not any(n.startswith(u + ".") for u in covered)
    ]
    total = sum(p.numel() for p in policy.parameters())
    in_root = sum(policy.get_parameter(n).numel() for n in root)
    assert in_root < 0.05 * total, root


def test_the_policys_gradient_checkpointing_gives_the_same_gradients():
    plain, checkpointed = tiny("pi05"), tiny("pi05", gradient_checkpointing=True)
    checkpointed.load_state_dict(plain.state_dict())
    grads = []
    for policy in (plain, checkpointed):
        policy.train()
        loss, _ = policy(batch_of(policy))
        loss.backward()
        grads.append({n: p.grad for n, p in policy.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=0, msg=name)


# --- processors ---------------------------------------------------------------------------------


def test_pi05_prompt_holds_the_discretized_state(tmp_path):
    from lerobot_pipe.policies.pi0.processor_pi0 import Pi05PrepareStateTokenizerProcessorStep

    step = Pi05PrepareStateTokenizerProcessorStep()
    out = step(
        {
            "observation.state": torch.tensor([[-1.0, 0.0, 0.999, 1.0017, -1.2]]),
            "task": ["pick_up the\ncube\n"],
        }
    )
    assert out["task"] == ["Task: pick up the cube, State: 0 128 255 255 -1;\nAction: "]
    assert step.get_config() == {}  # LeRobot 0.6.1 saves it empty


def test_processors_tokenize_with_paligemmas_tokenizer(tmp_path):
    from lerobot_pipe.policies.factory import make_pre_post_processors

    stats = {
        k: {
            s: torch.zeros(6) if s in ("mean", "q01") else torch.ones(6)
            for s in ("mean", "std", "q01", "q99")
        }
        for k in ("observation.state", "action")
    }
    with paligemma_tokenizer_cache(tmp_path / "hf"):
        for kind in KINDS:
            cfg = make_policy_config(kind, **PI_TINY_PRESET, **FEATURES)
            pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
            names = [type(s).registry_name for s in pre.steps]
            assert "relative_actions_processor" in names and "tokenizer_processor" in names
            batch = pre(
                {
                    "observation.state": torch.full((6,), 0.5),
                    "observation.images.top": torch.rand(3, 56, 56),
                    "task": "pick up the cube",
                }
            )
            tokens = batch["observation.language.tokens"]
            assert tokens.shape == (1, cfg.tokenizer_max_length) and tokens[0, 0] == 2  # <bos>


def test_a_missing_gated_tokenizer_names_the_license_page_and_the_login(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from lerobot_pipe.policies.smolvla.processor_smolvla import load_tokenizer

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError) as err:
        load_tokenizer("google/paligemma-3b-pt-224")
    assert "https://huggingface.co/google/paligemma-3b-pt-224" in str(err.value)
    assert "hf auth login" in str(err.value)
