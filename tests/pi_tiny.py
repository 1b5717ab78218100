"""A tiny pi0 / pi0.5 as LeRobot 0.6.1 writes its config.json, and a small PaliGemma-like
tokenizer that transformers loads offline as ``google/paligemma-3b-pt-224`` (the gated tokenizer
LeRobot's pi processors name), built in a second without the network.

The geometry is openpi's dummy Gemma for both stacks and a tiny SigLIP; LeRobot 0.6.1 knows only
its full-size variants, so tests/policies/lerobot_pi_driver.py patches it to build ``"dummy"``
with exactly these sizes. At the image size 56 and patch 14 a camera is 16 image tokens."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

# openpi's dummy Gemma (src/openpi/models/gemma.py), for the PaliGemma and the action expert.
DUMMY_GEMMA = dict(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16)
DUMMY_SIGLIP = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=14
)
IMAGE_SIZE = 56
TOKENIZER_REPO = "google/paligemma-3b-pt-224"
PALIGEMMA_VOCAB = 257152
# PaliGemma's special tokens and ids; the 256 byte symbols follow them.
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
PAD_ID, EOS_ID, BOS_ID, UNK_ID = range(4)
STATE_DIM = ACTION_DIM = 6
MAX_DIM = 8  # the padded state / action width: the noise is (B, chunk_size, MAX_DIM)
CAMERAS = {"observation.images.top": [3, 56, 56], "observation.images.wrist": [3, 48, 64]}

# PI0Config() as LeRobot 0.6.1 encodes it in config.json (its "defaults" job); the device is
# resolved when the config is built.
_PI0_DEFAULTS = {
    "type": "pi0",
    "n_obs_steps": 1,
    "input_features": {},
    "output_features": {},
    "device": "cpu",
    "use_amp": False,
    "use_peft": False,
    "push_to_hub": True,
    "repo_id": None,
    "private": None,
    "tags": None,
    "license": None,
    "pretrained_path": None,
    "pretrained_revision": None,
    "paligemma_variant": "gemma_2b",
    "action_expert_variant": "gemma_300m",
    "dtype": "float32",
    "chunk_size": 50,
    "n_action_steps": 50,
    "max_state_dim": 32,
    "max_action_dim": 32,
    "num_inference_steps": 10,
    "time_sampling_beta_alpha": 1.5,
    "time_sampling_beta_beta": 1.0,
    "time_sampling_scale": 0.999,
    "time_sampling_offset": 0.001,
    "min_period": 0.004,
    "max_period": 4.0,
    "use_relative_actions": False,
    "relative_exclude_joints": ["gripper"],
    "action_feature_names": None,
    "rtc_config": None,
    "image_resolution": [224, 224],
    "empty_cameras": 0,
    "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
    "gradient_checkpointing": False,
    "compile_model": False,
    "compile_mode": "max-autotune",
    "freeze_vision_encoder": False,
    "train_expert_only": False,
    "optimizer_lr": 2.5e-05,
    "optimizer_betas": [0.9, 0.95],
    "optimizer_eps": 1e-08,
    "optimizer_weight_decay": 0.01,
    "optimizer_grad_clip_norm": 1.0,
    "scheduler_warmup_steps": 1000,
    "scheduler_decay_steps": 30000,
    "scheduler_decay_lr": 2.5e-06,
    "tokenizer_max_length": 48,
}
# PI05Config() differs in these fields only.
_PI05_CHANGES = {
    "type": "pi05",
    "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"},
    "tokenizer_max_length": 200,
}


def lerobot_defaults(kind: str) -> dict:
    """LeRobot 0.6.1's PI0Config() / PI05Config() as its config.json holds them."""
    if kind not in ("pi0", "pi05"):
        raise ValueError(f"kind must be 'pi0' or 'pi05', not {kind!r}")
    defaults = copy.deepcopy(_PI0_DEFAULTS)
    if kind == "pi05":
        defaults.update(copy.deepcopy(_PI05_CHANGES))
    return defaults


def lerobot_pi_config(
    kind: str,
    *,
    state_dim: int = STATE_DIM,
    action_dim: int = ACTION_DIM,
    cameras: dict[str, list[int]] | None = None,
    **overrides,
) -> dict:
    """The config.json dict LeRobot 0.6.1 writes for a tiny pi0 / pi0.5 (``kind``): dummy
    variants, 56x56 images, a state and an action feature padded to 8, ``cameras`` (key -> [C, H, W]; by
    default a 56x56 camera and a 48x64 one that is resized with padding), chunks of 4 from 3
    denoising steps, on the CPU; ``overrides`` replace any field."""
    cameras = CAMERAS if cameras is None else cameras
    config = lerobot_defaults(kind)
    config.update(
        input_features={
            **{key: {"type": "VISUAL", "shape": list(shape)} for key, shape in cameras.items()},
            "observation.state": {"type": "STATE", "shape": [state_dim]},
        },
        output_features={"action": {"type": "ACTION", "shape": [action_dim]}},
        paligemma_variant="dummy",
        action_expert_variant="dummy",
        image_resolution=[IMAGE_SIZE, IMAGE_SIZE],
        max_state_dim=MAX_DIM,
        max_action_dim=MAX_DIM,
        chunk_size=4,
        n_action_steps=4,
        num_inference_steps=3,
        device="cpu",
        push_to_hub=False,
    )
    unknown = overrides.keys() - config.keys()
    if unknown:
        raise ValueError(f"not fields of LeRobot's {kind} config: {sorted(unknown)}")
    config.update(overrides)
    return config


def write_config(folder: Path, config: dict) -> Path:
    """``config`` as ``folder``/config.json (created), the folder LeRobot's from_pretrained reads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=4) + "\n")
    return folder


def _tokenizer_files() -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and config.json of the tiny tokenizer: a byte-level
    BPE without merges over PaliGemma's four special tokens and the 256 byte symbols, that
    prepends ``<bos>`` as PaliGemma's tokenizer does (``add_bos_token``, no ``<eos>``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIALS + byte_symbols)}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)]
    )
    bpe.add_special_tokens(SPECIALS)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "padding_side": "right",
        "model_max_length": 1000000000000000019884624838656,
        "clean_up_tokenization_spaces": False,
    }
    return {
        "tokenizer.json": bpe.to_str(pretty=True),
        "tokenizer_config.json": json.dumps(tokenizer_config, indent=2) + "\n",
        # transformers 5.5's AutoTokenizer reads config.json before the tokenizer's files.
        "config.json": json.dumps({"model_type": "paligemma"}) + "\n",
    }


def build_paligemma_tokenizer(hf_home: Path) -> Path:
    """Write the tiny tokenizer into the Hub cache of ``hf_home`` (``HF_HOME``; the cache itself,
    ``HF_HUB_CACHE``, is ``hf_home/hub``) under ``google/paligemma-3b-pt-224``, so that
    ``AutoTokenizer.from_pretrained("google/paligemma-3b-pt-224")`` loads it with
    ``HF_HUB_OFFLINE=1``; returns its snapshot folder."""
    files = _tokenizer_files()
    sha = hashlib.sha1("".join(files[name] for name in sorted(files)).encode()).hexdigest()
    repo = Path(hf_home) / "hub" / f"models--{TOKENIZER_REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / sha
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(sha)
    return snapshot


@contextlib.contextmanager
def paligemma_tokenizer_cache(hf_home: Path) -> Iterator[Path]:
    """The tiny tokenizer built into ``hf_home`` and this process (huggingface_hub's constants,
    read at each call) and its subprocesses (the environment) pointed at that Hub cache, offline,
    while the context lasts."""
    from huggingface_hub import constants

    build_paligemma_tokenizer(hf_home)
    cache = str(Path(hf_home) / "hub")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "HF_HUB_CACHE", cache)
        mp.setattr(constants, "HF_HUB_OFFLINE", True)
        mp.setenv("HF_HUB_CACHE", cache)
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield Path(cache)
