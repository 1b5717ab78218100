"""Config of ACT (Action Chunking Transformer, Zhao et al. 2023), with LeRobot's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lerobot_pipe.configs.optim import AdamWConfig
from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.policies.pretrained import ACTION, OBS_ENV_STATE, OBS_IMAGES_PREFIX, OBS_STATE
from lerobot_pipe.policies.vision.imagenet_weights import resolve_weights
from lerobot_pipe.policies.vision.resnet import RESNET_VARIANTS, BasicBlock

# A model small enough for CPU tests; every other field keeps its default.
ACT_TINY_PRESET: dict = dict(
    chunk_size=10,
    n_action_steps=10,
    dim_model=32,
    n_heads=2,
    dim_feedforward=64,
    n_encoder_layers=2,
    n_decoder_layers=1,
    n_vae_encoder_layers=1,
    latent_dim=8,
)

FEEDFORWARD_ACTIVATIONS = ("relu", "gelu")


@PreTrainedConfig.register_subclass("act")
@dataclass
class ACTConfig(PreTrainedConfig):
    """ACT's hyper-parameters.

    The policy needs at least one camera (``observation.images.<name>``, (3, H, W)) or
    ``observation.environment_state`` among its inputs (LeRobot's rule). Cameras go through
    ``vision_backbone`` (a ResNet, ``lerobot_pipe.policies.vision``) started from
    ``pretrained_backbone_weights`` (torchvision's ImageNet weights; None = random) and trained
    at ``optimizer_lr_backbone``.
    """

    chunk_size: int = 100  # actions predicted per forward pass
    n_action_steps: int = 100  # actions of a chunk executed before predicting again

    # feature type -> normalization mode (LeRobot's: environment state is not normalized)
    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "MEAN_STD", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    )

    vision_backbone: str = "resnet18"  # torchvision ResNet variant for the cameras
    # torchvision weights the backbone starts from (null: random initialization)
    pretrained_backbone_weights: str | None = "ResNet18_Weights.IMAGENET1K_V1"
    replace_final_stride_with_dilation: bool = False  # dilate the backbone's last stage

    dim_model: int = 512  # transformer hidden size
    n_heads: int = 8  # attention heads
    dim_feedforward: int = 3200  # width of the transformer feed-forward layers
    feedforward_activation: str = "relu"  # relu or gelu
    n_encoder_layers: int = 4  # transformer encoder layers
    # The original ACT code builds more decoder layers but only runs the first; 1 matches it.
    n_decoder_layers: int = 1
    pre_norm: bool = False  # layer norm before attention and feed-forward, not after

    use_vae: bool = True  # train with the VAE objective (a latent style variable)
    latent_dim: int = 32  # size of the VAE latent
    n_vae_encoder_layers: int = 4  # layers of the VAE encoder

    # Weight coefficient of the temporal ensembling; None disables it (then chunks are queued).
    temporal_ensemble_coeff: float | None = None

    dropout: float = 0.1  # dropout in the transformer layers
    kl_weight: float = 10.0  # weight of the VAE's KL-divergence term in the loss

    optimizer_lr: float = 1e-5  # lr of the policy's optimizer preset
    optimizer_weight_decay: float = 1e-4  # weight decay of the optimizer preset
    optimizer_lr_backbone: float = 1e-5  # lr of the backbone's parameter group

    @classmethod
    def tiny(cls, **overrides: Any) -> ACTConfig:
        """A config with ``ACT_TINY_PRESET`` applied, then ``overrides``."""
        return cls(**{**ACT_TINY_PRESET, **overrides})

    def __post_init__(self) -> None:
        super().__post_init__()
        positive = (
            "chunk_size",
            "n_action_steps",
            "dim_model",
            "n_heads",
            "dim_feedforward",
            "n_encoder_layers",
            "n_decoder_layers",
            "latent_dim",
            "n_vae_encoder_layers",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)}")
        if self.n_action_steps > self.chunk_size:
            raise ValueError(
                f"n_action_steps ({self.n_action_steps}) must be <= chunk_size ({self.chunk_size}): "
                "each chunk predicts chunk_size actions"
            )
        if self.dim_model % self.n_heads != 0:
            raise ValueError(
                f"dim_model ({self.dim_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.kl_weight < 0:
            raise ValueError(f"kl_weight must be >= 0, got {self.kl_weight}")
        if self.feedforward_activation not in FEEDFORWARD_ACTIVATIONS:
            raise ValueError(
                f"feedforward_activation must be one of {FEEDFORWARD_ACTIVATIONS}, "
                f"got {self.feedforward_activation!r}"
            )
        if not self.vision_backbone.startswith("resnet"):
            raise ValueError(
                f"vision_backbone must be a ResNet variant, got {self.vision_backbone!r}"
            )
        if self.temporal_ensemble_coeff is not None and self.n_action_steps != 1:
            raise ValueError(
                "n_action_steps must be 1 when temporal_ensemble_coeff is set "
                f"(got n_action_steps={self.n_action_steps}): the ensembler queries the "
                "policy at every step"
            )
        if self.n_obs_steps != 1:
            raise ValueError(f"ACT supports n_obs_steps == 1 only, got {self.n_obs_steps}")
        if self.optimizer_lr < 0:
            raise ValueError(
                f"optimizer_lr must be >= 0 (0: a frozen run), got {self.optimizer_lr}"
            )
        if self.optimizer_lr_backbone < 0:
            raise ValueError(
                f"optimizer_lr_backbone must be >= 0 (0: the backbone frozen), got {self.optimizer_lr_backbone}"
            )
        if self.optimizer_weight_decay < 0:
            raise ValueError(
                f"optimizer_weight_decay must be >= 0, got {self.optimizer_weight_decay}"
            )

    def validate_features(self) -> None:
        super().validate_features()
        if not self.image_features and OBS_ENV_STATE not in self.input_features:
            raise ValueError(
                f"ACT needs at least one camera ({OBS_IMAGES_PREFIX}<name>) or {OBS_ENV_STATE!r} "
                f"among its input_features, got {sorted(self.input_features)}"
            )
        for key in (OBS_STATE, OBS_ENV_STATE, ACTION):
            ft = self.input_features.get(key) or self.output_features.get(key)
            if ft is not None and len(ft["shape"]) != 1:
                raise ValueError(f"ACT needs a 1-D {key!r} feature, got shape {ft['shape']}")
        for key, ft in self.image_features.items():
            if len(ft["shape"]) != 3 or ft["shape"][0] != 3:
                raise ValueError(
                    f"ACT's ResNet backbone takes RGB frames: {key!r} must have shape "
                    f"[3, height, width], got {ft['shape']}"
                )
        if self.image_features:
            self._check_backbone()

    def _check_backbone(self) -> None:
        """The backbone fields, checked only when there are cameras (as LeRobot builds the
        backbone only then)."""
        if self.vision_backbone not in RESNET_VARIANTS:
            raise ValueError(
                f"vision_backbone={self.vision_backbone!r}: choose one of "
                f"{', '.join(RESNET_VARIANTS)}"
            )
        block = RESNET_VARIANTS[self.vision_backbone][0]
        if self.replace_final_stride_with_dilation and block is BasicBlock:
            raise ValueError(
                f"replace_final_stride_with_dilation needs resnet50/101/152: "
                f"{self.vision_backbone}'s BasicBlocks have no dilated variant"
            )
        if self.pretrained_backbone_weights is not None:
            resolve_weights(self.vision_backbone, self.pretrained_backbone_weights)

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(self.chunk_size))

    def get_optimizer_preset(self) -> AdamWConfig:
        """LeRobot's ACT preset: AdamW (betas and eps at their defaults), no scheduler; the
        backbone's parameter group takes ``optimizer_lr_backbone``."""
        return AdamWConfig(lr=self.optimizer_lr, weight_decay=self.optimizer_weight_decay)
