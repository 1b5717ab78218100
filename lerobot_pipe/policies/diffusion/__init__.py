"""Diffusion Policy, registered as policy type "diffusion"."""

from lerobot_pipe.policies.diffusion.configuration_diffusion import (
    DIFFUSION_TINY_PRESET,
    DiffusionConfig,
)
from lerobot_pipe.policies.diffusion.modeling_diffusion import (
    DiffusionConditionalResidualBlock1d,
    DiffusionConditionalUnet1d,
    DiffusionModel,
    DiffusionPolicy,
    DiffusionRgbEncoder,
    SpatialSoftmax,
)

__all__ = [
    "DIFFUSION_TINY_PRESET",
    "DiffusionConditionalResidualBlock1d",
    "DiffusionConditionalUnet1d",
    "DiffusionConfig",
    "DiffusionModel",
    "DiffusionPolicy",
    "DiffusionRgbEncoder",
    "SpatialSoftmax",
]
