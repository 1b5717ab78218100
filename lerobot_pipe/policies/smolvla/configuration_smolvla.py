"""Config of SmolVLA (Shukor et al. 2025): a SmolVLM vision-language model and a smaller Llama
"action expert" trained by flow matching. Field names and defaults are LeRobot 0.6.1's, so a
``lerobot/smolvla_base`` config.json decodes here unchanged.

Fields that ask for what lerobot_pipe does not build (real-time chunking, torch.compile, the
Aloha joint-space conversions, sampling without the prefix cache) are accepted at their defaults
only; another value fails when the config is built, i.e. before any process is launched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.policies.flow_matching_config import FlowMatchingConfig
from lerobot_pipe.policies.pretrained import OBS_IMAGES_PREFIX

DEFAULT_VLM = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"
ATTENTION_MODES = ("cross_attn", "self_attn")
PAD_LANGUAGE = ("longest", "max_length")
# The frame shape LeRobot gives each camera it adds with ``empty_cameras``.
EMPTY_CAMERA_SHAPE = [3, 480, 640]

# Sizes for a tiny VLM folder (tests/smolvla_tiny.py builds one); every other field keeps its
# default. resize_imgs_with_padding must equal the vision tower's image_size.
SMOLVLA_TINY_PRESET: dict = dict(
    chunk_size=4,
    n_action_steps=4,
    max_state_dim=8,
    max_action_dim=8,
    resize_imgs_with_padding=(32, 32),
    tokenizer_max_length=12,
    num_steps=3,
    num_vlm_layers=2,
    num_expert_layers=-1,
    self_attn_every_n_layers=2,
    expert_width_multiplier=0.75,
)

# Field -> (its only supported value, why another one is refused).
_ONLY_DEFAULT: dict[str, tuple[Any, str]] = {
    "adapt_to_pi_aloha": (False, "the Aloha <-> pi joint-space conversion is not built here"),
    "use_delta_joint_actions_aloha": (
        False,
        "delta joint actions are not built here (LeRobot 0.6.1 refuses them too)",
    ),
    "rtc_config": (None, "real-time chunking (RTC) is not built here"),
    "compile_model": (False, "torch.compile of SmolVLA is not built here"),
    "use_cache": (
        True,
        "sampling without the prefix key/value cache is not built here (LeRobot 0.6.1's "
        "cross-attention layers need the cache to sample)",
    ),
}


@PreTrainedConfig.register_subclass("smolvla")
@dataclass
class SmolVLAConfig(FlowMatchingConfig):
    """SmolVLA's hyper-parameters (LeRobot 0.6.1's fields, in its order).

    Inputs: at least one camera ``observation.images.<name>`` (frames in [0, 1], resized with
    left/top padding to ``resize_imgs_with_padding`` = (width, height)), ``observation.state``
    (zero-padded to ``max_state_dim``) and the frame's ``task`` string (tokenized by the
    preprocessor into ``observation.language.tokens`` / ``.attention_mask``). Output: chunks of
    ``chunk_size`` actions (zero-padded to ``max_action_dim`` inside the model), of which
    ``select_action`` plays ``n_action_steps``.

    The VLM is transformers' SmolVLM built from ``vlm_model_name`` (a Hub id or a local folder):
    its config only (random weights, which the checkpoint then overwrites) unless
    ``load_vlm_weights``, which loads its bf16 weights. Only its first ``num_vlm_layers`` text
    layers are kept. The expert has ``expert_width_multiplier`` times its width and one layer
    per VLM layer (``num_expert_layers`` <= 0); with ``attention_mode`` cross_attn every layer
    except each ``self_attn_every_n_layers``-th cross-attends to the VLM's keys and values.
    """

    # Input / output structure.
    n_obs_steps: int = 1
    chunk_size: int = 50  # actions predicted per sample
    n_action_steps: int = 50  # actions of each chunk that select_action plays out

    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    )

    max_state_dim: int = 32  # the state is zero-padded to this width
    max_action_dim: int = 32  # actions (and the sampling noise) have this width in the model

    resize_imgs_with_padding: tuple[int, int] | None = (512, 512)  # (width, height); null: as is

    empty_cameras: int = 0  # cameras added as all-black, masked-out frames (smolvla_aloha_sim)

    adapt_to_pi_aloha: bool = False  # refused when true (not built)
    use_delta_joint_actions_aloha: bool = False  # refused when true (not built)

    tokenizer_max_length: int = 48  # the task's tokens are truncated (and padded) to this

    num_steps: int = 10  # Euler steps of the flow-matching sampler

    use_cache: bool = True  # sample with the prefix's key/value cache (false is refused)

    freeze_vision_encoder: bool = True  # the vision tower is frozen (and kept in eval mode)
    train_expert_only: bool = True  # the whole VLM is frozen
    train_state_proj: bool = True  # the state projection is trained

    # Training presets (AdamW, cosine decay with warmup).
    optimizer_lr: float = 1e-4
    optimizer_betas: tuple[float, float] = (0.9, 0.95)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 1e-10
    optimizer_grad_clip_norm: float = 10  # gradient clipping norm of the preset

    scheduler_warmup_steps: int = 1_000
    scheduler_decay_steps: int = 30_000  # steps of the preset's cosine decay
    scheduler_decay_lr: float = 2.5e-6  # the preset's lr at the end of the decay

    vlm_model_name: str = DEFAULT_VLM  # Hub id or local folder of the SmolVLM (and tokenizer)
    load_vlm_weights: bool = False  # load the VLM's own (bf16) weights, not only its config

    add_image_special_tokens: bool = False  # <fake_token_around_image><global-img> around frames

    attention_mode: str = "cross_attn"  # cross_attn or self_attn

    prefix_length: int = -1  # > 0: the prefix is zero-padded to this many tokens

    pad_language_to: str = "longest"  # tokenizer padding: longest or max_length

    num_expert_layers: int = -1  # <= 0: one expert layer per VLM layer
    num_vlm_layers: int = 16  # the VLM's first text layers kept (<= 0: all)
    self_attn_every_n_layers: int = 2  # in cross_attn mode, each n-th layer is self-attention
    expert_width_multiplier: float = 0.75  # the expert's hidden size relative to the VLM's

    min_period: float = 4e-3  # the flow time's sine-cosine embedding: shortest period
    max_period: float = 4.0  # and longest period

    rtc_config: dict[str, Any] | None = None  # real-time chunking: refused when set
    compile_model: bool = False  # torch.compile: refused when true
    compile_mode: str = "max-autotune"  # (used with compile_model only)

    @classmethod
    def tiny(cls, **overrides: Any) -> SmolVLAConfig:
        """A config with ``SMOLVLA_TINY_PRESET`` applied, then ``overrides``."""
        return cls(**{**SMOLVLA_TINY_PRESET, **overrides})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.refuse_unbuilt(_ONLY_DEFAULT)
        self.check_chunking()
        if self.tokenizer_max_length < 1 or self.num_steps < 1:
            raise ValueError("tokenizer_max_length and num_steps must be positive ints")
        if self.resize_imgs_with_padding is not None and (
            len(self.resize_imgs_with_padding) != 2 or min(self.resize_imgs_with_padding) < 1
        ):
            raise ValueError(
                "resize_imgs_with_padding must be [width, height] (positive) or null, got "
                f"{self.resize_imgs_with_padding!r}"
            )
        if self.attention_mode not in ATTENTION_MODES:
            raise ValueError(
                f"attention_mode must be one of {ATTENTION_MODES}, got {self.attention_mode!r}"
            )
        if self.pad_language_to not in PAD_LANGUAGE:
            raise ValueError(
                f"pad_language_to must be one of {PAD_LANGUAGE}, got {self.pad_language_to!r}"
            )
        if self.expert_width_multiplier <= 0:
            raise ValueError(
                f"expert_width_multiplier must be > 0, got {self.expert_width_multiplier}"
            )
        if (
            self.attention_mode == "cross_attn"
            and self.num_expert_layers > 0
            and self.num_expert_layers != self.num_vlm_layers
        ):
            raise ValueError(
                f"num_expert_layers={self.num_expert_layers} with attention_mode=cross_attn: an "
                "expert with fewer layers than the VLM is not built here (LeRobot 0.6.1 fails on "
                "it with a shape mismatch); use num_expert_layers=-1"
            )
        if (
            self.num_expert_layers > 0
            and self.num_vlm_layers > 0
            and self.num_vlm_layers % self.num_expert_layers
        ):
            raise ValueError(
                f"num_vlm_layers ({self.num_vlm_layers}) must be a multiple of "
                f"num_expert_layers ({self.num_expert_layers})"
            )

    def validate_features(self) -> None:
        # LeRobot adds the empty cameras to the inputs (and so to config.json) when validating.
        for i in range(self.empty_cameras):
            key = f"{OBS_IMAGES_PREFIX}empty_camera_{i}"
            self.input_features.setdefault(
                key, {"type": "VISUAL", "shape": list(EMPTY_CAMERA_SHAPE)}
            )
        super().validate_features()
        self.check_vla_features()

    @property
    def observation_delta_indices(self) -> list[int]:
        return [0]

    def publish_problem(self) -> str | None:
        """A ``vlm_model_name`` that is a local folder is recorded as it is (as LeRobot does),
        but nobody else can rebuild the VLM from it."""
        from lerobot_pipe.utils.repo_id import looks_like_repo_id

        name = self.vlm_model_name
        if looks_like_repo_id(name) and not Path(name).expanduser().exists():
            return None
        return (
            f"policy.vlm_model_name={name!r} is a local folder: others could not rebuild this "
            "policy's VLM from the published checkpoint; train with "
            f"--policy.vlm_model_name=<Hub repo id> (e.g. {DEFAULT_VLM})"
        )

    def processor_steps(self, defaults: Any) -> tuple[list, list]:
        """LeRobot 0.6.1's SmolVLA pipelines: rename, to_batch, new-line, tokenizer, device,
        normalizer; unnormalizer, device (cpu)."""
        from lerobot_pipe.policies.smolvla.processor_smolvla import (
            NewLineTaskProcessorStep,
            TokenizerProcessorStep,
        )

        pre = [
            defaults.rename,
            defaults.to_batch,
            NewLineTaskProcessorStep(),
            TokenizerProcessorStep(
                tokenizer_name=self.vlm_model_name,
                max_length=self.tokenizer_max_length,
                padding=self.pad_language_to,
                padding_side="right",
            ),
            defaults.to_device,
            defaults.normalize,
        ]
        return pre, [defaults.unnormalize, defaults.to_cpu]
