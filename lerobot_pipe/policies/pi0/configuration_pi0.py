"""Config of pi0 (Black et al. 2024): a PaliGemma vision-language model (SigLIP So400m/14 and
Gemma 2B) and a Gemma 300M "action expert" trained by flow matching. Field names and defaults
are LeRobot 0.6.1's, so a ``lerobot/pi0_base`` config.json decodes here unchanged; pi0.5
(``pi05``) shares them (configuration_pi05.py).

Our extension (docs/compatibility.md): ``paligemma_variant`` and ``action_expert_variant`` also
accept ``dummy``, openpi's tiny Gemma (width 64, depth 4, mlp 128, 8 heads, 1 KV head, head_dim
16) with a tiny SigLIP tower (width 32, 2 layers), for tests; both are dummy or neither.

Fields that ask for what lerobot_pipe does not build (real-time chunking, relative actions) are
accepted at their defaults only; another value fails when the config is built, i.e. before any
process is launched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.policies.flow_matching_config import FlowMatchingConfig
from lerobot_pipe.policies.pretrained import ACTION, OBS_IMAGES_PREFIX, OBS_STATE

PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"
DTYPES = ("bfloat16", "float32")


@dataclass(frozen=True)
class GemmaGeometry:
    """One Gemma stack's sizes (openpi's ``gemma.get_config``)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


GEMMA_VARIANTS = {
    "gemma_2b": GemmaGeometry(2048, 18, 16_384, 8, 1, 256),
    "gemma_300m": GemmaGeometry(1024, 18, 4096, 8, 1, 256),
    "dummy": GemmaGeometry(64, 4, 128, 8, 1, 16),
}


@dataclass(frozen=True)
class SiglipGeometry:
    """The vision tower's sizes; its patch grid is ``image_size // patch_size`` squared."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    patch_size: int = 14


# PaliGemma's So400m/14 tower (transformers' SigLIP defaults with LeRobot's intermediate size),
# and the tiny one built with paligemma_variant=dummy.
SIGLIP_SO400M = SiglipGeometry(1152, 4304, 27, 16)
SIGLIP_DUMMY = SiglipGeometry(32, 64, 2, 2)

# Sizes for tests (every other field keeps its default); the two variants go together.
PI_TINY_PRESET: dict = dict(
    paligemma_variant="dummy",
    action_expert_variant="dummy",
    chunk_size=4,
    n_action_steps=4,
    max_state_dim=8,
    max_action_dim=8,
    image_resolution=(56, 56),
    num_inference_steps=3,
)

# Field -> (its only supported value, why another one is refused).
_ONLY_DEFAULT: dict[str, tuple[Any, str]] = {
    "rtc_config": (None, "real-time chunking (RTC) is not built here"),
    "use_relative_actions": (
        False,
        "relative actions are not built here (their processor steps are saved, disabled, as "
        "LeRobot saves them)",
    ),
}


@dataclass
class PiConfigBase(FlowMatchingConfig):
    """pi0's and pi0.5's hyper-parameters (LeRobot 0.6.1's fields, in its order).

    Inputs: at least one camera ``observation.images.<name>`` (frames in [0, 1], resized with
    centred padding to ``image_resolution``, square), ``observation.state`` (zero-padded to
    ``max_state_dim``) and the frame's ``task`` string (tokenized by the preprocessor with
    PaliGemma's tokenizer into ``observation.language.tokens`` / ``.attention_mask``). Output:
    chunks of ``chunk_size`` actions (zero-padded to ``max_action_dim`` inside the model), of
    which ``select_action`` plays ``n_action_steps``.

    ``dtype`` bfloat16 stores the language model and the expert in bf16 (norms, vision tower and
    projector stay float32, as LeRobot's). FSDP2 needs one dtype among a unit's trainable
    parameters: a sharded run trains it with ``--accelerator.mixed_precision=bf16`` (trainable
    parameters kept in float32, bf16 compute; frozen ones, a LoRA base, stay bf16) and refuses
    it without, before launch, naming the unit (distributed/parallelize.check_unit_dtypes).
    """

    paligemma_variant: str = "gemma_2b"  # gemma_2b, gemma_300m (or dummy: tests)
    action_expert_variant: str = "gemma_300m"  # the expert's geometry (same choices)
    dtype: str = "float32"  # float32 or bfloat16 (see the class docstring)

    n_obs_steps: int = 1
    chunk_size: int = 50  # actions predicted per sample (openpi's action_horizon)
    n_action_steps: int = 50  # actions of each chunk that select_action plays out

    max_state_dim: int = 32  # the state is zero-padded to this width
    max_action_dim: int = 32  # actions (and the sampling noise) have this width in the model

    # Flow matching: time ~ Beta(alpha, beta) * scale + offset; Euler steps when sampling.
    num_inference_steps: int = 10
    time_sampling_beta_alpha: float = 1.5  # the flow time's Beta(alpha, beta): alpha
    time_sampling_beta_beta: float = 1.0  # and beta
    time_sampling_scale: float = 0.999  # time = Beta draw * scale + offset
    time_sampling_offset: float = 0.001  # (so that time > 0)
    min_period: float = 4e-3  # the flow time's sine-cosine embedding: shortest period
    max_period: float = 4.0  # and longest period

    use_relative_actions: bool = False  # refused when true (not built)
    # Joints kept absolute by relative actions (which are not built here).
    relative_exclude_joints: list[str] = field(default_factory=lambda: ["gripper"])  # names
    action_feature_names: list[str] | None = None  # filled from the dataset by LeRobot

    rtc_config: dict[str, Any] | None = None  # real-time chunking: refused when set

    image_resolution: tuple[int, int] = (224, 224)  # (height, width), square

    empty_cameras: int = 0  # cameras added as all -1, masked-out frames

    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    )

    gradient_checkpointing: bool = False  # recompute each layer pair in the backward
    compile_model: bool = False  # torch.compile the training forward and the sampler
    compile_mode: str = "max-autotune"  # torch.compile's mode
    device: str | None = None

    freeze_vision_encoder: bool = False  # the vision tower is frozen (and kept in eval mode)
    train_expert_only: bool = False  # the whole PaliGemma is frozen

    # Training presets (openpi's AdamW and cosine decay with warmup).
    optimizer_lr: float = 2.5e-5
    optimizer_betas: tuple[float, float] = (0.9, 0.95)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 0.01
    optimizer_grad_clip_norm: float = 1.0  # gradient clipping norm of the preset

    scheduler_warmup_steps: int = 1_000
    scheduler_decay_steps: int = 30_000  # steps of the preset's cosine decay
    scheduler_decay_lr: float = 2.5e-6  # the preset's lr at the end of the decay

    tokenizer_max_length: int = 48  # the prompt's tokens are padded/truncated to this

    @classmethod
    def tiny(cls, **overrides: Any) -> PiConfigBase:
        """A config with ``PI_TINY_PRESET`` applied, then ``overrides``."""
        return cls(**{**PI_TINY_PRESET, **overrides})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.refuse_unbuilt(_ONLY_DEFAULT)
        for name in ("paligemma_variant", "action_expert_variant"):
            if getattr(self, name) not in GEMMA_VARIANTS:
                raise ValueError(
                    f"policy.{name}={getattr(self, name)!r}: choose one of {sorted(GEMMA_VARIANTS)}"
                )
        if (self.paligemma_variant == "dummy") != (self.action_expert_variant == "dummy"):
            raise ValueError(
                f"policy.paligemma_variant={self.paligemma_variant!r} with "
                f"action_expert_variant={self.action_expert_variant!r}: the dummy geometry is "
                "for both stacks or neither (their layers are run pairwise, with the same "
                "depth, heads and head_dim)"
            )
        pali, expert = self.gemma_geometry
        if (pali.depth, pali.num_heads, pali.num_kv_heads, pali.head_dim) != (
            expert.depth,
            expert.num_heads,
            expert.num_kv_heads,
            expert.head_dim,
        ):
            raise ValueError("the two Gemma stacks need the same depth, heads and head_dim")
        if self.dtype not in DTYPES:
            raise ValueError(f"policy.dtype={self.dtype!r}: choose one of {DTYPES}")
        self.check_chunking()
        if self.tokenizer_max_length < 1 or self.num_inference_steps < 1:
            raise ValueError("tokenizer_max_length and num_inference_steps must be positive ints")
        res = tuple(self.image_resolution)
        if len(res) != 2 or res[0] != res[1] or res[0] < 1:
            raise ValueError(
                "policy.image_resolution must be square [size, size] (PaliGemma's frames), got "
                f"{self.image_resolution!r}"
            )
        if res[0] % self.siglip_geometry.patch_size:
            raise ValueError(
                f"policy.image_resolution {res[0]} must be a multiple of SigLIP's patch size "
                f"{self.siglip_geometry.patch_size}"
            )

    @property
    def gemma_geometry(self) -> tuple[GemmaGeometry, GemmaGeometry]:
        """(the language model's, the expert's) sizes."""
        return GEMMA_VARIANTS[self.paligemma_variant], GEMMA_VARIANTS[self.action_expert_variant]

    @property
    def siglip_geometry(self) -> SiglipGeometry:
        return SIGLIP_DUMMY if self.paligemma_variant == "dummy" else SIGLIP_SO400M

    def validate_features(self) -> None:
        # LeRobot adds the empty cameras (and a padded state/action when missing) when validating.
        for i in range(self.empty_cameras):
            key = f"{OBS_IMAGES_PREFIX}empty_camera_{i}"
            self.input_features.setdefault(
                key, {"type": "VISUAL", "shape": [3, *self.image_resolution]}
            )
        self.input_features.setdefault(OBS_STATE, {"type": "STATE", "shape": [self.max_state_dim]})
        self.output_features.setdefault(ACTION, {"type": "ACTION", "shape": [self.max_action_dim]})
        super().validate_features()
        self.check_vla_features()

    @property
    def observation_delta_indices(self) -> None:
        return None

    def sharding_problem(self) -> str | None:
        if self.compile_model:
            return (
                "--policy.compile_model=true: torch.compile of a sharded pi model is not built "
                "here (FSDP2's hooks run around each layer pair's unit entry, which the compiled "
                "graph would bypass); train sharded without it"
            )
        return None


@PreTrainedConfig.register_subclass("pi0")
@dataclass
class PI0Config(PiConfigBase):
    """pi0: the state is a token of the expert's stream (``state_proj``); the flow time is
    fused with each action token (``action_time_mlp_*``)."""

    def processor_steps(self, defaults: Any) -> tuple[list, list]:
        """LeRobot 0.6.1's pi0 pipelines: rename, to_batch, new-line, tokenizer, device,
        relative actions (disabled), normalizer; unnormalizer, absolute actions (disabled),
        device (cpu)."""
        from lerobot_pipe.policies.pi0.processor_pi0 import pi_processor_steps

        return pi_processor_steps(self, defaults)
