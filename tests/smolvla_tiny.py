"""A tiny SmolVLM folder (config, tokenizer, processor; optionally weights) that transformers
and LeRobot 0.6.1 accept as ``vlm_model_name``, built offline in a second. The tokenizer is a
byte-level BPE without merges over SmolVLM's special tokens and the 256 byte symbols. The
benchmarks write larger geometries with the same tokenizer (``text`` / ``vision`` overrides)."""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    "<end_of_utterance>",
    "<video>",
]
IMAGE_SIZE = 32
_HALF = [0.5, 0.5, 0.5]
_COMMON = dict(
    do_convert_rgb=True,
    do_normalize=True,
    do_pad=True,
    do_rescale=True,
    do_resize=True,
    image_mean=_HALF,
    image_std=_HALF,
    resample=1,
    rescale_factor=1 / 255,
)
TEXT = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "tie_word_embeddings": False,
}
VISION = {
    "model_type": "smolvlm_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": IMAGE_SIZE,
    "patch_size": 8,
}


def processor_config(image_size: int, image_seq_len: int) -> dict:
    """The processor's file as transformers 5.5 writes it, for frames of ``image_size``."""
    return {
        "image_processor": {
            **_COMMON,
            "do_image_splitting": False,
            "image_processor_type": "SmolVLMImageProcessor",
            "max_image_size": {"longest_edge": image_size},
            "size": {"longest_edge": image_size},
        },
        "image_seq_len": image_seq_len,
        "processor_class": "SmolVLMProcessor",
        "video_processor": {
            **_COMMON,
            "do_sample_frames": False,
            "max_image_size": {"longest_edge": 364},
            "return_metadata": False,
            "size": {"longest_edge": 1456},
            "video_processor_type": "SmolVLMVideoProcessor",
        },
    }


def build_tiny_smolvlm(
    folder: Path,
    *,
    with_weights: bool = False,
    seed: int = 0,
    text: dict | None = None,
    vision: dict | None = None,
    scale_factor: int = 2,
    max_shard_size: str | None = None,
) -> Path:
    """Write the tiny SmolVLM into ``folder`` (created) and return it. ``text`` / ``vision``
    override fields of its text (llama) and vision configs (the vocabulary is the tokenizer's
    unless ``text`` names a larger one); ``scale_factor`` is the connector's pixel shuffle.
    ``with_weights``: bf16 weights too, in shards of ``max_shard_size`` when given
    (``model.safetensors.index.json``)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
    )

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIALS + byte_symbols)}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|endoftext|>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
    )
    vision_config = {**VISION, **(vision or {})}
    config = SmolVLMConfig(
        text_config={**TEXT, "vocab_size": len(vocab), **(text or {})},
        vision_config=vision_config,
        scale_factor=scale_factor,
        image_token_id=vocab["<image>"],
        tie_word_embeddings=False,
    )
    if with_weights:
        torch.manual_seed(seed)
        model = SmolVLMForConditionalGeneration(config).to(torch.bfloat16)
        shards = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
        model.save_pretrained(folder, **shards)
    else:
        config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # The processor's file as transformers 5.5 writes it (LeRobot 0.6.1 builds an AutoProcessor
    # from the folder; transformers >= 5.18 cannot save one without torchvision's video
    # processor, so it is written here).
    image_size = vision_config["image_size"]
    seq_len = (image_size // vision_config["patch_size"] // scale_factor) ** 2
    processor = processor_config(image_size, seq_len)
    (folder / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return folder
