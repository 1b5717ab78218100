"""Config of Diffusion Policy (Chi et al. 2023), with LeRobot 0.6.1's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lerobot_pipe.configs.optim import AdamConfig, DiffuserSchedulerConfig
from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.policies.pretrained import ACTION, OBS_ENV_STATE, OBS_IMAGES_PREFIX, OBS_STATE
from lerobot_pipe.policies.vision.imagenet_weights import resolve_weights
from lerobot_pipe.policies.vision.resnet import RESNET_VARIANTS

# A model small enough for CPU tests (about 0.5M parameters besides the ResNet); every other
# field keeps its default.
DIFFUSION_TINY_PRESET: dict = dict(
    horizon=8,
    n_action_steps=4,
    drop_n_last_frames=3,
    down_dims=(16, 32),
    kernel_size=3,
    n_groups=4,
    diffusion_step_embed_dim=16,
    spatial_softmax_num_keypoints=8,
    num_train_timesteps=10,
)

NOISE_SCHEDULERS = ("DDPM", "DDIM")
PREDICTION_TYPES = ("epsilon", "sample")


@PreTrainedConfig.register_subclass("diffusion")
@dataclass
class DiffusionConfig(PreTrainedConfig):
    """Diffusion Policy's hyper-parameters.

    Inputs: ``observation.state`` (required) and at least one camera
    (``observation.images.<name>``, all of one shape) or ``observation.environment_state``;
    each over ``n_obs_steps`` frames. The policy denoises ``horizon`` actions starting at the
    oldest observation and executes ``n_action_steps`` of them from the current one. The sampler
    never draws the last ``drop_n_last_frames`` frames of an episode. Frames are resized to
    ``resize_shape`` (when set), then cropped to ``crop_shape`` (derived from ``crop_ratio``
    when resizing), at random positions in training if ``crop_is_random``, centred in eval.
    Each camera goes through a ResNet (``vision_backbone``; trainable batch norm, or group norm
    with ``use_group_norm``) and a spatial softmax of ``spatial_softmax_num_keypoints``
    keypoints. A 1-D U-Net (``down_dims``) conditioned by FiLM on the diffusion step and the
    observation features predicts the noise (``prediction_type`` epsilon) or the clean actions
    (sample), under diffusers' DDPM or DDIM scheduler.
    """

    n_obs_steps: int = 2  # observation frames per sample: the current one and those before it
    horizon: int = 64  # actions the U-Net denoises per sample (the action window)
    n_action_steps: int = 32  # actions of each predicted chunk that select_action plays out

    # LeRobot's: environment state is not normalized.
    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "MEAN_STD", "STATE": "MIN_MAX", "ACTION": "MIN_MAX"}
    )

    # The original implementation never samples the last frames of an episode (less padding).
    drop_n_last_frames: int = 7

    # Vision backbone: a torchvision ResNet name (resnet18, resnet34, resnet50, ...).
    vision_backbone: str = "resnet18"
    resize_shape: tuple[int, int] | None = None  # frames resized to (H, W) first; None keeps them
    crop_ratio: float = 1.0  # without crop_shape: crop this fraction of each side
    crop_shape: tuple[int, int] | None = None  # (H, W) crop: random in training, centred in eval
    crop_is_random: bool = True  # random crops in training (centre crops when false)
    # torchvision's ImageNet weights for the backbone (null: random initial weights).
    pretrained_backbone_weights: str | None = "ResNet18_Weights.IMAGENET1K_V1"
    use_group_norm: bool = False  # GroupNorm instead of the backbone's (trainable) batch norm
    spatial_softmax_num_keypoints: int = 32  # keypoints of the spatial softmax per camera
    use_separate_rgb_encoder_per_camera: bool = True  # one image encoder per camera

    # U-Net.
    down_dims: tuple[int, ...] = (512, 1024, 2048)  # channels of the U-Net's stages
    kernel_size: int = 5  # 1-D convolution kernel of the U-Net
    n_groups: int = 8  # GroupNorm groups in the U-Net's blocks
    diffusion_step_embed_dim: int = 128  # size of the diffusion step's embedding
    use_film_scale_modulation: bool = True  # FiLM scales as well as shifts the features
    gradient_checkpointing: bool = False  # recompute the U-Net's blocks in backward (less memory)

    # Noise scheduler (diffusers' DDPMScheduler / DDIMScheduler arguments).
    noise_scheduler_type: str = "DDPM"  # DDPM or DDIM
    num_train_timesteps: int = 100  # diffusion steps of the noise schedule
    beta_schedule: str = "squaredcos_cap_v2"  # diffusers' name of the beta schedule
    beta_start: float = 0.0001  # first beta of the schedule
    beta_end: float = 0.02  # last beta of the schedule
    prediction_type: str = "epsilon"  # what the U-Net predicts: epsilon (noise) or sample
    clip_sample: bool = True  # clip denoised samples to clip_sample_range
    clip_sample_range: float = 1.0  # the range of clip_sample: [-range, range]

    # Inference: None runs num_train_timesteps denoising steps.
    num_inference_steps: int | None = None

    compile_model: bool = False  # torch.compile the U-Net (names and numbers unchanged)
    compile_mode: str = "reduce-overhead"  # torch.compile's mode with compile_model

    do_mask_loss_for_padding: bool = False  # leave padded actions out of the loss

    # Training presets.
    optimizer_lr: float = 1e-4  # Adam learning rate of the preset
    optimizer_betas: tuple = (0.95, 0.999)  # Adam betas of the preset
    optimizer_eps: float = 1e-8  # Adam epsilon of the preset
    optimizer_weight_decay: float = 1e-6  # Adam weight decay of the preset
    scheduler_name: str = "cosine"  # diffusers' LR schedule of the preset
    scheduler_warmup_steps: int = 500  # warmup steps of the preset's LR schedule

    @classmethod
    def tiny(cls, **overrides: Any) -> DiffusionConfig:
        """A config with ``DIFFUSION_TINY_PRESET`` applied, then ``overrides``."""
        return cls(**{**DIFFUSION_TINY_PRESET, **overrides})

    def __post_init__(self) -> None:
        super().__post_init__()
        # Values from JSON or flags arrive as lists; LeRobot's fields are tuples.
        self.down_dims = tuple(self.down_dims)
        self.optimizer_betas = tuple(self.optimizer_betas)
        if self.resize_shape is not None:
            self.resize_shape = tuple(self.resize_shape)
        if self.crop_shape is not None:
            self.crop_shape = tuple(self.crop_shape)
        self._validate_sizes_and_choices()
        self._validate_images()
        self._validate_unet()
        self._validate_optimizer()

    def _validate_sizes_and_choices(self) -> None:
        """Positive sizes, and the backbone, prediction type and noise scheduler named."""
        for name in (
            "horizon",
            "n_action_steps",
            "kernel_size",
            "n_groups",
            "diffusion_step_embed_dim",
            "spatial_softmax_num_keypoints",
            "num_train_timesteps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)}")
        if not self.vision_backbone.startswith("resnet"):
            raise ValueError(
                f"vision_backbone must be a ResNet variant, got {self.vision_backbone!r}"
            )
        if self.prediction_type not in PREDICTION_TYPES:
            raise ValueError(
                f"prediction_type must be one of {PREDICTION_TYPES}, got {self.prediction_type!r}"
            )
        if self.noise_scheduler_type not in NOISE_SCHEDULERS:
            raise ValueError(
                f"noise_scheduler_type must be one of {NOISE_SCHEDULERS}, "
                f"got {self.noise_scheduler_type!r}"
            )

    def _validate_images(self) -> None:
        """The camera frames' resize and crop; with a resize, the crop follows from crop_ratio."""
        if self.resize_shape is not None and (
            len(self.resize_shape) != 2 or any(d <= 0 for d in self.resize_shape)
        ):
            raise ValueError(
                f"resize_shape must be a pair of positive ints [height, width], "
                f"got {list(self.resize_shape)}"
            )
        if not 0 < self.crop_ratio <= 1.0:
            raise ValueError(f"crop_ratio must be in (0, 1], got {self.crop_ratio}")
        if self.resize_shape is not None:
            # LeRobot's rule: with a resize, the crop follows from crop_ratio (1.0: no crop).
            self.crop_shape = (
                (
                    int(self.resize_shape[0] * self.crop_ratio),
                    int(self.resize_shape[1] * self.crop_ratio),
                )
                if self.crop_ratio < 1.0
                else None
            )
        if self.crop_shape is not None and (
            len(self.crop_shape) != 2 or self.crop_shape[0] <= 0 or self.crop_shape[1] <= 0
        ):
            raise ValueError(
                f"crop_shape must be a pair of positive ints [height, width], "
                f"got {list(self.crop_shape)}"
            )

    def _validate_unet(self) -> None:
        """The U-Net's stages against the horizon and the action window."""
        if not self.down_dims or any(d < 1 for d in self.down_dims):
            raise ValueError(f"down_dims must be positive ints, got {list(self.down_dims)}")
        factor = 2 ** len(self.down_dims)
        if self.horizon % factor:
            raise ValueError(
                f"horizon ({self.horizon}) must be a multiple of 2**len(down_dims) = {factor}: "
                "each U-Net stage halves the action sequence"
            )
        if any(d % self.n_groups for d in self.down_dims):
            raise ValueError(
                f"every down_dims entry ({list(self.down_dims)}) must be divisible by n_groups "
                f"({self.n_groups}): the U-Net's group norms split channels into n_groups"
            )
        if self.n_action_steps > self.horizon - self.n_obs_steps + 1:
            raise ValueError(
                f"n_action_steps ({self.n_action_steps}) must be <= horizon - n_obs_steps + 1 "
                f"({self.horizon - self.n_obs_steps + 1}): actions are executed from the current "
                "observation on, within the predicted horizon"
            )
        if self.drop_n_last_frames < 0:
            raise ValueError(f"drop_n_last_frames must be >= 0, got {self.drop_n_last_frames}")
        if self.num_inference_steps is not None and not (
            1 <= self.num_inference_steps <= self.num_train_timesteps
        ):
            raise ValueError(
                f"num_inference_steps ({self.num_inference_steps}) must lie in "
                f"[1, num_train_timesteps={self.num_train_timesteps}] (or null for all of them)"
            )

    def _validate_optimizer(self) -> None:
        if self.optimizer_lr < 0:
            raise ValueError(
                f"optimizer_lr must be >= 0 (0: a frozen run), got {self.optimizer_lr}"
            )
        if self.optimizer_weight_decay < 0:
            raise ValueError(
                f"optimizer_weight_decay must be >= 0, got {self.optimizer_weight_decay}"
            )
        if len(self.optimizer_betas) != 2:
            raise ValueError(
                f"optimizer_betas must be two numbers, got {list(self.optimizer_betas)}"
            )
        if self.scheduler_warmup_steps < 0:
            raise ValueError(
                f"scheduler_warmup_steps must be >= 0, got {self.scheduler_warmup_steps}"
            )

    def validate_features(self) -> None:
        super().validate_features()
        if self.robot_state_feature is None:
            raise ValueError(
                f"Diffusion Policy needs {OBS_STATE!r} among its input_features, got "
                f"{sorted(self.input_features)}"
            )
        if not self.image_features and self.env_state_feature is None:
            raise ValueError(
                f"Diffusion Policy needs at least one camera ({OBS_IMAGES_PREFIX}<name>) or "
                f"{OBS_ENV_STATE!r} among its input_features, got {sorted(self.input_features)}"
            )
        for key in (OBS_STATE, OBS_ENV_STATE, ACTION):
            ft = self.input_features.get(key) or self.output_features.get(key)
            if ft is not None and len(ft["shape"]) != 1:
                raise ValueError(
                    f"Diffusion Policy needs a 1-D {key!r} feature, got shape {ft['shape']}"
                )
        shapes = {key: list(ft["shape"]) for key, ft in self.image_features.items()}
        for key, shape in shapes.items():
            if len(shape) != 3 or shape[0] != 3:
                raise ValueError(
                    f"Diffusion Policy's ResNet takes RGB frames: {key!r} must have shape "
                    f"[3, height, width], got {shape}"
                )
        if len({tuple(s) for s in shapes.values()}) > 1:
            raise ValueError(
                f"Diffusion Policy needs every camera at one frame shape, got {shapes}; resize "
                "them in the dataset, or train on cameras of one shape"
            )
        if self.image_features:
            self._check_vision(next(iter(shapes.values())))

    def _check_vision(self, shape: list[int]) -> None:
        """The vision fields, checked only with cameras (the encoder exists only then)."""
        if self.vision_backbone not in RESNET_VARIANTS:
            raise ValueError(
                f"vision_backbone={self.vision_backbone!r}: choose one of "
                f"{', '.join(RESNET_VARIANTS)}"
            )
        if self.use_group_norm and self.pretrained_backbone_weights:
            raise ValueError(
                "use_group_norm=true replaces the backbone's batch norms, which pretrained "
                f"weights ({self.pretrained_backbone_weights}) were trained with: pass "
                "--policy.pretrained_backbone_weights=null, or use_group_norm=false"
            )
        crop = self.crop_shape
        if (
            self.resize_shape is None
            and crop is not None
            and (crop[0] > shape[1] or crop[1] > shape[2])
        ):
            raise ValueError(
                f"crop_shape {list(self.crop_shape)} does not fit in the camera frames "
                f"[{shape[1]}, {shape[2]}]; choose a smaller crop or set resize_shape"
            )
        if self.pretrained_backbone_weights is not None:
            resolve_weights(self.vision_backbone, self.pretrained_backbone_weights)

    @property
    def observation_delta_indices(self) -> list[int]:
        return list(range(1 - self.n_obs_steps, 1))

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(1 - self.n_obs_steps, 1 - self.n_obs_steps + self.horizon))

    def get_optimizer_preset(self) -> AdamConfig:
        """LeRobot's Diffusion preset: Adam with the policy's betas, eps and weight decay."""
        return AdamConfig(
            lr=self.optimizer_lr,
            betas=list(self.optimizer_betas),
            eps=self.optimizer_eps,
            weight_decay=self.optimizer_weight_decay,
        )

    def get_scheduler_preset(self) -> DiffuserSchedulerConfig:
        """LeRobot's: diffusers' ``scheduler_name`` schedule after ``scheduler_warmup_steps``."""
        return DiffuserSchedulerConfig(
            name=self.scheduler_name, num_warmup_steps=self.scheduler_warmup_steps
        )
