"""Vision backbones of the camera policies, under torchvision's module and parameter names."""

from lerobot_pipe.policies.vision.imagenet_weights import (
    BackboneWeightsError,
    cached_weights_file,
    ensure_backbone_weights,
    load_imagenet_weights,
    resolve_weights,
)
from lerobot_pipe.policies.vision.resnet import (
    RESNET_VARIANTS,
    BasicBlock,
    BatchNorm2d,
    Bottleneck,
    FrozenBatchNorm2d,
    ResNetBackbone,
    resnet_backbone,
)

__all__ = [
    "RESNET_VARIANTS",
    "BackboneWeightsError",
    "BasicBlock",
    "BatchNorm2d",
    "Bottleneck",
    "FrozenBatchNorm2d",
    "ResNetBackbone",
    "cached_weights_file",
    "ensure_backbone_weights",
    "load_imagenet_weights",
    "resnet_backbone",
    "resolve_weights",
]
