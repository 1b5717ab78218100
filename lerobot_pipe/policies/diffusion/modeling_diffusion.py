"""Diffusion Policy (Chi et al., "Diffusion Policy: Visuomotor Policy Learning via Action
Diffusion", 2023), with LeRobot 0.6.1's module and parameter names.

Each camera frame of the ``n_obs_steps`` observations is resized and cropped, encoded by a ResNet
up to layer4 (``diffusion.rgb_encoder[.i].backbone.<n>``: torchvision's children as an
``nn.Sequential``, as LeRobot keeps them), reduced to keypoints by a spatial softmax and projected
by a linear layer; with the robot state (and the environment state) the features of every
observation step form the global conditioning. A 1-D convolutional U-Net, FiLM-conditioned on it
and on the diffusion step, denoises a ``horizon``-long action sequence; diffusers' DDPM or DDIM
scheduler adds the training noise and runs the reverse process at inference.

Training randomness (the noise, the diffusion step and the random crop) is drawn per sample from
``batch["sample_key"]`` (:mod:`lerobot_pipe.utils.random`), so it does not depend on the
rank a sample lands on; a batch without keys (a user's own loop) gets keys from torch's global
RNG. Inference draws its initial noise (and DDPM's step noise) from torch's global RNG, as
LeRobot does: the same seed gives LeRobot's actions. An observation batch with keys (the
in-training rollouts give each sub-env a key of its episode and step) draws them from the keys
instead: the initial noise from :func:`keyed_normal`, the scheduler's step noise from one
generator per sample seeded from its key (diffusers draws that noise itself), so the actions do
not depend on the rank or on what else the batch holds.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from lerobot_pipe.constants import SAMPLE_KEY
from lerobot_pipe.policies.diffusion.configuration_diffusion import DiffusionConfig
from lerobot_pipe.policies.pretrained import (
    ACTION,
    OBS_ENV_STATE,
    OBS_STATE,
    PreTrainedPolicy,
)
from lerobot_pipe.policies.vision import (
    BasicBlock,
    BatchNorm2d,
    Bottleneck,
    load_imagenet_weights,
    resnet_backbone,
)
from lerobot_pipe.policies.vision.resnet import group_norm_16
from lerobot_pipe.utils.random import (
    keyed_integers,
    keyed_normal,
    stream_id,
)

ACTION_IS_PAD = "action_is_pad"
# LeRobot's key of the stacked cameras, (B, n_obs_steps, n_cameras, 3, H, W), in its queues.
OBS_IMAGES = "observation.images"
NOISE_STREAM = stream_id("diffusion.noise")
TIMESTEP_STREAM = stream_id("diffusion.timestep")
CROP_STREAM = stream_id("diffusion.crop")
SAMPLING_NOISE_STREAM = stream_id("diffusion.sampling_noise")
SAMPLING_STEP_STREAM = stream_id("diffusion.sampling_step_seed")
# What torch.compile puts between a compiled module and its parameters' names (LeRobot's
# checkpoints saved with compile_model=true have it).
_COMPILED_PREFIX = "_orig_mod."


def _require(batch: dict[str, Tensor], key: str) -> Tensor:
    if key not in batch:
        raise KeyError(f"Diffusion Policy's batch lacks {key!r}; it has {sorted(batch)}")
    return batch[key]


def make_noise_scheduler(config: DiffusionConfig):
    """diffusers' DDPMScheduler or DDIMScheduler with LeRobot's arguments."""
    try:
        from diffusers.schedulers.scheduling_ddim import DDIMScheduler
        from diffusers.schedulers.scheduling_ddpm import DDPMScheduler
    except ImportError:
        raise ImportError(
            "Diffusion Policy's noise schedulers come from diffusers, which is not installed: "
            "pip install 'lerobot_pipe[diffusion]'"
        ) from None
    cls = DDPMScheduler if config.noise_scheduler_type == "DDPM" else DDIMScheduler
    return cls(
        num_train_timesteps=config.num_train_timesteps,
        beta_start=config.beta_start,
        beta_end=config.beta_end,
        beta_schedule=config.beta_schedule,
        clip_sample=config.clip_sample,
        clip_sample_range=config.clip_sample_range,
        prediction_type=config.prediction_type,
    )


class SpatialSoftmax(nn.Module):
    """Spatial soft-argmax (Finn et al. 2016, robomimic's): a 1x1 convolution to ``num_kp``
    channels (when given), a softmax over each channel's pixels, and the expected (x, y) in
    [-1, 1] of each: (B, C, H, W) -> (B, num_kp, 2)."""

    def __init__(self, input_shape: tuple[int, int, int], num_kp: int | None = None) -> None:
        super().__init__()
        self._in_c, self._in_h, self._in_w = input_shape
        self.nets = nn.Conv2d(self._in_c, num_kp, kernel_size=1) if num_kp else None
        self._out_c = num_kp or self._in_c
        # numpy's linspace, as LeRobot's: torch's rounds differently in the last bit.
        pos_x, pos_y = np.meshgrid(
            np.linspace(-1.0, 1.0, self._in_w), np.linspace(-1.0, 1.0, self._in_h)
        )
        grid = np.stack([pos_x.reshape(-1), pos_y.reshape(-1)], axis=1).astype(np.float32)
        self.register_buffer("pos_grid", torch.tensor(grid))

    def forward(self, features: Tensor) -> Tensor:
        if self.nets is not None:
            features = self.nets(features)
        attention = F.softmax(features.reshape(-1, self._in_h * self._in_w), dim=-1)
        return (attention @ self.pos_grid.to(attention.dtype)).view(-1, self._out_c, 2)


class DiffusionRgbEncoder(nn.Module):
    """One camera's encoder: resize, crop, ResNet to layer4, spatial softmax, linear + ReLU:
    (N, 3, H, W) in [0, 1] (normalized) -> (N, 2 * spatial_softmax_num_keypoints)."""

    def __init__(self, config: DiffusionConfig, pretrained_backbone: bool = True) -> None:
        super().__init__()
        self.resize_shape = config.resize_shape
        self.crop_shape = config.crop_shape
        self.crop_is_random = config.crop_is_random
        norm_layer = group_norm_16 if config.use_group_norm else BatchNorm2d
        resnet = resnet_backbone(config.vision_backbone, norm_layer=norm_layer)
        if pretrained_backbone and config.pretrained_backbone_weights:
            load_imagenet_weights(
                resnet, config.vision_backbone, config.pretrained_backbone_weights
            )
        frame = next(iter(config.image_features.values()))["shape"]
        size = self.crop_shape or self.resize_shape or tuple(frame[1:])
        feature_map = (resnet.out_channels, *resnet.feature_map_size(*size))
        # torchvision's children without avgpool and fc, indexed as LeRobot's Sequential is.
        self.backbone = nn.Sequential(*resnet.children())
        self.pool = SpatialSoftmax(feature_map, num_kp=config.spatial_softmax_num_keypoints)
        self.feature_dim = config.spatial_softmax_num_keypoints * 2
        self.out = nn.Linear(config.spatial_softmax_num_keypoints * 2, self.feature_dim)
        self.relu = nn.ReLU()

    def _crop(self, x: Tensor, offsets: Tensor | None) -> Tensor:
        """Centre crop (torchvision's rounding) in eval or without random crops; else each
        frame at its own ``offsets`` (N, 2) (top, left)."""
        height, width = self.crop_shape
        if not (self.training and self.crop_is_random):
            top = int(round((x.shape[-2] - height) / 2.0))
            left = int(round((x.shape[-1] - width) / 2.0))
            return x[..., top : top + height, left : left + width]
        if offsets is None:
            raise ValueError(
                "random crops in training need each frame's offsets: pass the batch's "
                f"{SAMPLE_KEY!r} (or call eval() for centre crops)"
            )
        rows = offsets[:, 0, None] + torch.arange(height, device=x.device)
        cols = offsets[:, 1, None] + torch.arange(width, device=x.device)
        frames = torch.arange(len(x), device=x.device)[:, None, None, None]
        channels = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
        # One gather whose four index tensors broadcast to (N, C, height, width): contiguous NCHW,
        # the backbone's layout (gathering NHWC and permuting back would hand it channels-last
        # frames, on which a CPU's convolutions run 12-18 % slower: bench/bench_memory_format.py).
        return x[frames, channels, rows[:, None, :, None], cols[:, None, None, :]]

    def crop_bounds(self, frame_hw: tuple[int, int]) -> tuple[int, int]:
        """How many top / left offsets a random crop of a (resized) frame can take."""
        height, width = self.resize_shape or frame_hw
        return height - self.crop_shape[0] + 1, width - self.crop_shape[1] + 1

    def forward(self, x: Tensor, crop_offsets: Tensor | None = None) -> Tensor:
        if self.resize_shape is not None and tuple(x.shape[-2:]) != tuple(self.resize_shape):
            x = F.interpolate(
                x, size=self.resize_shape, mode="bilinear", align_corners=False, antialias=True
            )
        if self.crop_shape is not None:
            x = self._crop(x, crop_offsets)
        x = torch.flatten(self.pool(self.backbone(x)), start_dim=1)
        return self.relu(self.out(x))


class DiffusionSinusoidalPosEmb(nn.Module):
    """1-D sinusoidal embedding of the diffusion step: (B,) -> (B, dim), [sin | cos]."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        half_dim = self.dim // 2
        scale = math.log(10000) / (half_dim - 1)
        freqs = torch.exp(torch.arange(half_dim, device=x.device) * -scale)
        angles = x.unsqueeze(-1) * freqs.unsqueeze(0)
        return torch.cat((angles.sin(), angles.cos()), dim=-1)


class DiffusionConv1dBlock(nn.Module):
    """Conv1d -> GroupNorm -> Mish."""

    def __init__(
        self, inp_channels: int, out_channels: int, kernel_size: int, n_groups: int = 8
    ) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv1d(inp_channels, out_channels, kernel_size, padding=kernel_size // 2),
            nn.GroupNorm(n_groups, out_channels),
            nn.Mish(),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class DiffusionConditionalResidualBlock1d(nn.Module):
    """Two Conv1d blocks with FiLM conditioning between them (a per-channel bias, and a scale
    with ``use_film_scale_modulation``) and a residual connection: (B, C_in, T) -> (B, C_out, T).
    The U-Net's FSDP2 wrap unit."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        cond_dim: int,
        kernel_size: int = 3,
        n_groups: int = 8,
        use_film_scale_modulation: bool = False,
    ) -> None:
        super().__init__()
        self.use_film_scale_modulation = use_film_scale_modulation
        self.out_channels = out_channels
        self.conv1 = DiffusionConv1dBlock(in_channels, out_channels, kernel_size, n_groups)
        cond_channels = out_channels * 2 if use_film_scale_modulation else out_channels
        self.cond_encoder = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, cond_channels))
        self.conv2 = DiffusionConv1dBlock(out_channels, out_channels, kernel_size, n_groups)
        self.residual_conv = (
            nn.Conv1d(in_channels, out_channels, 1)
            if in_channels != out_channels
            else nn.Identity()
        )

    def forward(self, x: Tensor, cond: Tensor) -> Tensor:
        out = self.conv1(x)
        cond_embed = self.cond_encoder(cond).unsqueeze(-1)  # (B, cond_channels, 1)
        if self.use_film_scale_modulation:
            scale = cond_embed[:, : self.out_channels]
            bias = cond_embed[:, self.out_channels :]
            out = scale * out + bias
        else:
            out = out + cond_embed
        out = self.conv2(out)
        return out + self.residual_conv(x)


class DiffusionConditionalUnet1d(nn.Module):
    """A 1-D convolutional U-Net over the action sequence with FiLM conditioning on the diffusion
    step embedding and the global conditioning: (B, T, action_dim) -> (B, T, action_dim)."""

    def __init__(self, config: DiffusionConfig, global_cond_dim: int) -> None:
        super().__init__()
        self.config = config
        embed_dim = config.diffusion_step_embed_dim
        self.diffusion_step_encoder = nn.Sequential(
            DiffusionSinusoidalPosEmb(embed_dim),
            nn.Linear(embed_dim, embed_dim * 4),
            nn.Mish(),
            nn.Linear(embed_dim * 4, embed_dim),
        )
        cond_dim = embed_dim + global_cond_dim
        action_dim = config.action_feature["shape"][0]
        in_out = [
            (action_dim, config.down_dims[0]),
            *zip(config.down_dims[:-1], config.down_dims[1:], strict=True),
        ]

        def block(dim_in: int, dim_out: int) -> DiffusionConditionalResidualBlock1d:
            return DiffusionConditionalResidualBlock1d(
                dim_in,
                dim_out,
                cond_dim=cond_dim,
                kernel_size=config.kernel_size,
                n_groups=config.n_groups,
                use_film_scale_modulation=config.use_film_scale_modulation,
            )

        self.down_modules = nn.ModuleList()
        for i, (dim_in, dim_out) in enumerate(in_out):
            is_last = i == len(in_out) - 1
            downsample = nn.Conv1d(dim_out, dim_out, 3, 2, 1) if not is_last else nn.Identity()
            self.down_modules.append(
                nn.ModuleList([block(dim_in, dim_out), block(dim_out, dim_out), downsample])
            )
        mid = config.down_dims[-1]
        self.mid_modules = nn.ModuleList([block(mid, mid), block(mid, mid)])
        # Every decoder stage upsamples (LeRobot's loop never reaches its last-stage test).
        self.up_modules = nn.ModuleList()
        for dim_out, dim_in in reversed(in_out[1:]):
            self.up_modules.append(
                nn.ModuleList(
                    [
                        block(dim_in * 2, dim_out),  # with the encoder's skip connection
                        block(dim_out, dim_out),
                        nn.ConvTranspose1d(dim_out, dim_out, 4, 2, 1),
                    ]
                )
            )
        first = config.down_dims[0]
        self.final_conv = nn.Sequential(
            DiffusionConv1dBlock(first, first, kernel_size=config.kernel_size),
            nn.Conv1d(first, action_dim, 1),
        )

    def _run(self, module: nn.Module, x: Tensor, cond: Tensor) -> Tensor:
        if self.config.gradient_checkpointing and self.training:
            return checkpoint(module, x, cond, use_reentrant=False)
        return module(x, cond)

    def forward(self, x: Tensor, timestep: Tensor, global_cond: Tensor | None = None) -> Tensor:
        x = x.transpose(1, 2)  # (B, action_dim, T): channels first for the 1-D convolutions
        embed = self.diffusion_step_encoder[0](timestep)
        # The embedding is computed in fp32; FSDP2's bf16 parameters want their own dtype.
        embed = embed.to(self.diffusion_step_encoder[1].weight.dtype)
        cond = self.diffusion_step_encoder[1:](embed)
        if global_cond is not None:
            cond = torch.cat([cond, global_cond], dim=-1)
        skips: list[Tensor] = []
        for resnet, resnet2, downsample in self.down_modules:
            x = self._run(resnet2, self._run(resnet, x, cond), cond)
            skips.append(x)
            x = downsample(x)
        for mid_module in self.mid_modules:
            x = self._run(mid_module, x, cond)
        for resnet, resnet2, upsample in self.up_modules:
            x = torch.cat((x, skips.pop()), dim=1)
            x = upsample(self._run(resnet2, self._run(resnet, x, cond), cond))
        return self.final_conv(x).transpose(1, 2)


class DiffusionModel(nn.Module):
    """Observation encoders, the U-Net and the noise scheduler; the loss and the sampler.

    ``pretrained_backbone`` loads ``config.pretrained_backbone_weights`` into each camera's
    ResNet (False: leave them randomly initialized, for weights loaded right after)."""

    def __init__(self, config: DiffusionConfig, pretrained_backbone: bool = True) -> None:
        super().__init__()
        self.config = config
        self.camera_keys = list(config.image_features)
        global_cond_dim = config.robot_state_feature["shape"][0]
        # Modules are registered in LeRobot's order: parameter order is what the integer keys
        # of optimizer_state.safetensors refer to.
        if self.camera_keys:
            n_cameras = len(self.camera_keys)
            if config.use_separate_rgb_encoder_per_camera:
                encoders = [
                    DiffusionRgbEncoder(config, pretrained_backbone) for _ in range(n_cameras)
                ]
                self.rgb_encoder = nn.ModuleList(encoders)
                feature_dim = encoders[0].feature_dim
            else:
                self.rgb_encoder = DiffusionRgbEncoder(config, pretrained_backbone)
                feature_dim = self.rgb_encoder.feature_dim
            global_cond_dim += feature_dim * n_cameras
        if config.env_state_feature is not None:
            global_cond_dim += config.env_state_feature["shape"][0]
        self.unet = DiffusionConditionalUnet1d(config, global_cond_dim * config.n_obs_steps)
        if config.compile_model:
            # In place: the parameters keep the names of the uncompiled model.
            self.unet.compile(mode=config.compile_mode)
        self.register_load_state_dict_pre_hook(_drop_compiled_prefix)
        self.noise_scheduler = make_noise_scheduler(config)
        self.num_inference_steps = (
            config.num_inference_steps
            if config.num_inference_steps is not None
            else config.num_train_timesteps
        )

    @property
    def _encoders(self) -> list[DiffusionRgbEncoder]:
        if isinstance(self.rgb_encoder, nn.ModuleList):
            return list(self.rgb_encoder)
        return [self.rgb_encoder]

    def _crop_offsets(self, keys: Tensor, frame_hw: tuple[int, int]) -> Tensor | None:
        """(B, n_cameras, 2) random crop offsets (top, left) per sample and camera."""
        encoder = self._encoders[0]
        if encoder.crop_shape is None or not (encoder.training and encoder.crop_is_random):
            return None
        bounds = torch.tensor(encoder.crop_bounds(frame_hw), device=keys.device)
        n = len(self.camera_keys)
        offsets = keyed_integers(keys, CROP_STREAM, 2 * n, bounds.repeat(n))
        return offsets.view(len(keys), n, 2)

    def _image_features(self, images: Tensor, keys: Tensor | None) -> Tensor:
        """(B, S, N, 3, H, W) -> (B, S, N * feature_dim), cameras in ``image_features`` order;
        a sample's crop is the same at each of its observation steps."""
        batch_size, n_obs_steps, n_cameras = images.shape[:3]
        offsets = None
        if keys is not None:
            offsets = self._crop_offsets(keys, tuple(images.shape[-2:]))
        if offsets is not None:
            offsets = offsets[:, None].expand(batch_size, n_obs_steps, n_cameras, 2)
        if self.config.use_separate_rgb_encoder_per_camera:
            features = [
                encoder(
                    images[:, :, n].flatten(0, 1),
                    None if offsets is None else offsets[:, :, n].flatten(0, 1),
                )
                for n, encoder in enumerate(self.rgb_encoder)
            ]
            return torch.stack(features, dim=1).view(batch_size, n_obs_steps, -1)
        features = self.rgb_encoder(
            images.flatten(0, 2), None if offsets is None else offsets.flatten(0, 2)
        )
        return features.view(batch_size, n_obs_steps, -1)

    def global_conditioning(self, batch: dict[str, Tensor], keys: Tensor | None) -> Tensor:
        """The state, camera features and environment state of every observation step,
        flattened: (B, n_obs_steps * per-step features)."""
        state = _require(batch, OBS_STATE)
        features = [state]
        if self.camera_keys:
            features.append(self._image_features(_require(batch, OBS_IMAGES), keys))
        if self.config.env_state_feature is not None:
            features.append(_require(batch, OBS_ENV_STATE))
        return torch.cat(features, dim=-1).flatten(start_dim=1)

    def conditional_sample(
        self,
        batch_size: int,
        global_cond: Tensor,
        generator: torch.Generator | list[torch.Generator] | None = None,
        noise: Tensor | None = None,
    ) -> Tensor:
        """Run the reverse diffusion from ``noise`` (default: a draw from torch's RNG); the
        scheduler's step noise from ``generator`` (one per sample in a list, diffusers' rule)."""
        parameter = next(iter(self.parameters()))
        action_dim = self.config.action_feature["shape"][0]
        sample = noise
        if sample is None:
            sample = torch.randn(
                size=(batch_size, self.config.horizon, action_dim),
                dtype=parameter.dtype,
                device=parameter.device,
                generator=generator,
            )
        self.noise_scheduler.set_timesteps(self.num_inference_steps)
        for t in self.noise_scheduler.timesteps:
            timestep = torch.full(sample.shape[:1], t, dtype=torch.long, device=sample.device)
            model_output = self.unet(sample, timestep, global_cond=global_cond)
            sample = self.noise_scheduler.step(
                model_output, t, sample, generator=generator
            ).prev_sample
        return sample

    def generate_actions(self, batch: dict[str, Tensor], noise: Tensor | None = None) -> Tensor:
        """``n_action_steps`` actions from the current observation on: (B, n_action_steps, A)."""
        batch_size, n_obs_steps = _require(batch, OBS_STATE).shape[:2]
        if n_obs_steps != self.config.n_obs_steps:
            raise ValueError(
                f"{OBS_STATE!r} holds {n_obs_steps} observation steps; the policy was built for "
                f"n_obs_steps={self.config.n_obs_steps}"
            )
        global_cond = self.global_conditioning(batch, keys=None)
        keys, generator = batch.get(SAMPLE_KEY), None
        if keys is not None and noise is None:
            action_dim = self.config.action_feature["shape"][0]
            noise = keyed_normal(keys, SAMPLING_NOISE_STREAM, (self.config.horizon, action_dim))
            noise = noise.to(global_cond.dtype)
            seeds = keyed_integers(keys, SAMPLING_STEP_STREAM, 1, 2**62)[:, 0].tolist()
            generator = [torch.Generator().manual_seed(s) for s in seeds]
        actions = self.conditional_sample(batch_size, global_cond, generator, noise=noise)
        start = n_obs_steps - 1
        return actions[:, start : start + self.config.n_action_steps]

    def compute_loss(
        self,
        batch: dict[str, Tensor],
        normalizer: tuple[Tensor, int] | None = None,
        per_sample: bool = False,
    ) -> Tensor:
        """The denoising loss: MSE between the U-Net's prediction and the noise (epsilon) or the
        clean actions (sample); with ``do_mask_loss_for_padding``, over non-padded steps only
        (divided by ``normalizer``'s share of the whole batch's count when given).
        ``per_sample``: each sample's own mean (B,) instead, over its non-padded values with
        ``do_mask_loss_for_padding``, else over all of them."""
        config = self.config
        trajectory = _require(batch, ACTION)
        state = _require(batch, OBS_STATE)
        action_dim = config.action_feature["shape"][0]
        if trajectory.dim() != 3 or tuple(trajectory.shape[1:]) != (config.horizon, action_dim):
            raise ValueError(
                f"batch[{ACTION!r}] must have shape (B, {config.horizon}, {action_dim}) "
                f"(horizon, action_dim), got {tuple(trajectory.shape)}"
            )
        if state.dim() != 3 or state.shape[1] != config.n_obs_steps:
            raise ValueError(
                f"batch[{OBS_STATE!r}] must have shape (B, {config.n_obs_steps}, state_dim) "
                f"(n_obs_steps observations), got {tuple(state.shape)}"
            )
        batch_size = trajectory.shape[0]
        keys = batch.get(SAMPLE_KEY)
        if keys is None:
            keys = torch.randint(0, 2**62, (batch_size,), device=trajectory.device)
        global_cond = self.global_conditioning(batch, keys)
        eps = keyed_normal(keys, NOISE_STREAM, tuple(trajectory.shape[1:]))
        timesteps = keyed_integers(keys, TIMESTEP_STREAM, 1, config.num_train_timesteps)[:, 0]
        noisy = self.noise_scheduler.add_noise(trajectory, eps, timesteps)
        pred = self.unet(noisy, timesteps, global_cond=global_cond)
        target = eps if config.prediction_type == "epsilon" else trajectory
        loss = F.mse_loss(pred.float(), target.float(), reduction="none")
        if not config.do_mask_loss_for_padding:
            return loss.mean(dim=(1, 2)) if per_sample else loss.mean()
        valid = ~_require(batch, ACTION_IS_PAD).bool().unsqueeze(-1)
        if per_sample:
            counts = (valid.sum(dim=(1, 2)) * loss.shape[-1]).clamp_min(1)
            return (loss * valid).sum(dim=(1, 2)) / counts
        if normalizer is not None:
            total, shares = normalizer
            denominator = total.float().clamp_min(1) / shares
        else:
            denominator = (valid.sum() * loss.shape[-1]).clamp_min(1)
        return (loss * valid).sum() / denominator


def _drop_compiled_prefix(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """Load-time hook: a checkpoint of a torch.compile'd U-Net (``unet._orig_mod.*``, LeRobot's
    compile_model=true) loads under the plain names."""
    compiled = f"{prefix}unet.{_COMPILED_PREFIX}"
    for key in [k for k in state_dict if k.startswith(compiled)]:
        state_dict[f"{prefix}unet." + key[len(compiled) :]] = state_dict.pop(key)


class DiffusionPolicy(PreTrainedPolicy):
    """Diffusion Policy: training loss, chunk prediction and step-wise action selection.

    Batches are already normalized: ``observation.state`` (B, n_obs_steps, state_dim), each
    camera ``observation.images.<name>`` (B, n_obs_steps, 3, H, W) and/or
    ``observation.environment_state`` (B, n_obs_steps, env_dim); for training ``action``
    (B, horizon, action_dim) with ``action_is_pad`` (B, horizon), and the loader's
    ``sample_key`` (B,). With ``n_obs_steps`` 1 a camera may come as (B, 3, H, W).
    """

    config_class = DiffusionConfig
    name = "diffusion"
    # The U-Net's residual blocks and each residual block of the camera ResNets (docs/diffusion.md).
    _fsdp_wrap_modules = [
        "DiffusionConditionalResidualBlock1d",
        BasicBlock.__name__,
        Bottleneck.__name__,
    ]
    # The FiLM projections and the U-Net's first convolution of each residual block.
    _peft_target_modules = ["cond_encoder.1", "conv1.block.0"]

    def __init__(self, config: DiffusionConfig, *, pretrained_parts: bool = True) -> None:
        super().__init__(config, pretrained_parts=pretrained_parts)
        self.config: DiffusionConfig
        self.diffusion = DiffusionModel(config, pretrained_backbone=pretrained_parts)
        self.reset()

    def reset(self) -> None:
        """Empty the observation and action queues (call at each episode start)."""
        self._queues: dict[str, deque[Tensor]] = {
            OBS_STATE: deque(maxlen=self.config.n_obs_steps),
            ACTION: deque(maxlen=self.config.n_action_steps),
        }
        if self.config.image_features:
            self._queues[OBS_IMAGES] = deque(maxlen=self.config.n_obs_steps)
        if self.config.env_state_feature is not None:
            self._queues[OBS_ENV_STATE] = deque(maxlen=self.config.n_obs_steps)

    def _stack_cameras(self, batch: dict[str, Tensor], add_step_dim: bool) -> dict[str, Tensor]:
        batch = dict(batch)
        if self.config.image_features:
            frames = [_require(batch, key) for key in self.config.image_features]
            if add_step_dim:
                frames = [f.unsqueeze(1) if f.dim() == 4 else f for f in frames]
            batch[OBS_IMAGES] = torch.stack(frames, dim=-4)
        return batch

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor], noise: Tensor | None = None) -> Tensor:
        """(B, n_action_steps, action_dim) normalized actions, from the queued observations when
        select_action filled them, else from ``batch``'s own windows. Switches to eval mode."""
        self.eval()
        if any(len(q) for q in self._queues.values()):
            keys = batch.get(SAMPLE_KEY)
            batch = {
                k: torch.stack(list(self._queues[k]), dim=1)
                for k in batch
                if k in self._queues and k != ACTION
            }
            if keys is not None:
                batch[SAMPLE_KEY] = keys
        else:
            batch = self._stack_cameras(batch, add_step_dim=True)
        return self.diffusion.generate_actions(batch, noise=noise)

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor], noise: Tensor | None = None) -> Tensor:
        """The next normalized action (B, action_dim) for one observation per sample.

        The last ``n_obs_steps`` observations are queued (the first one repeated to fill the
        queue at an episode start); when the action queue is empty the policy generates a
        chunk and queues its ``n_action_steps`` actions. Call ``reset`` at each episode start.
        """
        batch = self._stack_cameras({k: v for k, v in batch.items() if k != ACTION}, False)
        for key, value in batch.items():
            queue = self._queues.get(key)
            if queue is None:
                continue
            # At an episode start the first observation fills the queue.
            while len(queue) < queue.maxlen - 1:
                queue.append(value)
            queue.append(value)
        if not self._queues[ACTION]:
            actions = self.predict_action_chunk(batch, noise=noise)
            self._queues[ACTION].extend(actions.transpose(0, 1))
        return self._queues[ACTION].popleft()

    def loss_normalizers(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """With ``do_mask_loss_for_padding`` the loss averages over the non-padded action values:
        their count in ``batch``; otherwise it is a plain mean."""
        if not self.config.do_mask_loss_for_padding:
            return {}
        valid = (~_require(batch, ACTION_IS_PAD).bool()).sum()
        return {"mse": valid * self.config.action_feature["shape"][0]}

    def forward(
        self,
        batch: dict[str, Tensor],
        normalizers: dict[str, tuple[Tensor, int]] | None = None,
        reduction: str = "mean",
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The denoising loss on a training batch (and no parts: the loss is one term);
        ``reduction="none"`` (LeRobot's convention): each sample's (B,), its noise and
        diffusion step from its key."""
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
        n_one = self.config.n_obs_steps == 1
        batch = self._stack_cameras(batch, add_step_dim=n_one)
        loss = self.diffusion.compute_loss(
            batch, (normalizers or {}).get("mse"), reduction == "none"
        )
        return loss, {}
