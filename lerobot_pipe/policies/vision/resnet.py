"""ResNet feature extractors (He et al. 2016) written with torch alone, under torchvision's names.

LeRobot builds its camera backbones as ``torchvision.models.<resnetNN>(norm_layer=
FrozenBatchNorm2d, replace_stride_with_dilation=[False, False, d])`` (ACT) or with torchvision's
default trainable ``nn.BatchNorm2d``, optionally replaced by ``nn.GroupNorm`` (Diffusion Policy),
and keeps layer4's feature map. :class:`ResNetBackbone` is that network: the same modules in the
same order (``conv1``, ``bn1``, ``relu``, ``maxpool``, ``layer1`` .. ``layer4``; no
``avgpool``/``fc``) with the normalization layer ``norm_layer`` makes, so its state dict has
torchvision's keys and LeRobot's checkpoints load into it strictly and back; for the same weights
it computes the same features as torchvision's model (tests/policies/test_lerobot_act_vision.py
runs torchvision itself, in LeRobot's environment, to check it).

Why not depend on torchvision (measured 2026-12 on the 2-core CI machine, see docs/vision.md):
torchvision's registry wheels load only beside torch's CUDA build (their ``_C`` extension links
libtorch_cuda), while this project's CPU machines and CI install the 0.9 GB CPU wheel of torch in
43 s. Taking torchvision means the CUDA pair torch 2.14.1 + torchvision 0.29.1 in every fresh
environment and CI run: 90 s and 5.5 GB (3.2 GB of NVIDIA libraries), and 0.5 s more to import
torch in each of the many processes the tests and launchers start. What the policies need from
torchvision is two residual blocks, a frozen batch norm and the stage builder, about a hundred
lines; the pretrained weights are torchvision's own files, fetched with torch.hub
(:mod:`lerobot_pipe.policies.vision.imagenet_weights`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

# Builds the normalization layer of ``num_features`` channels that follows each convolution.
NormLayer = Callable[[int], nn.Module]


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed statistics and affine terms, all four stored as buffers (never
    trained, never synchronized), under BatchNorm2d's state-dict names.

    The affine map is computed in the buffers' precision and the result cast back to the input's
    dtype, so a bf16 activation stays bf16 (as ``nn.BatchNorm2d`` behaves) even where FSDP2's
    mixed precision casts the parameters but not these buffers."""

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # A trained nn.BatchNorm2d also saves its update counter, which frozen statistics lack.
        state_dict.pop(prefix + "num_batches_tracked", None)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def forward(self, x: Tensor) -> Tensor:
        scale = (
            self.weight.reshape(1, -1, 1, 1)
            * (self.running_var.reshape(1, -1, 1, 1) + self.eps).rsqrt()
        )
        shift = self.bias.reshape(1, -1, 1, 1) - self.running_mean.reshape(1, -1, 1, 1) * scale
        return (x * scale + shift).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class BatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` (same state, names and arithmetic) whose affine terms take its running
    statistics' precision when they differ: FSDP2's mixed precision casts parameters to bf16 but
    not buffers, and batch norm kernels accept a low-precision input only with fp32 affine terms
    and statistics. The output keeps the input's dtype."""

    def forward(self, x: Tensor) -> Tensor:
        stats = self.running_mean
        if not self.affine or stats is None or self.weight.dtype == stats.dtype:
            return super().forward(x)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative average
                momentum = 1.0 / float(self.num_batches_tracked)
        return F.batch_norm(
            x,
            stats,
            self.running_var,
            self.weight.to(stats.dtype),
            self.bias.to(stats.dtype),
            self.training,
            momentum,
            self.eps,
        )


def group_norm_16(num_features: int) -> nn.GroupNorm:
    """LeRobot's replacement of batch norm in Diffusion Policy's encoder: groups of 16 channels."""
    return nn.GroupNorm(num_groups=num_features // 16, num_channels=num_features)


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1, dilation: int = 1) -> nn.Conv2d:
    return nn.Conv2d(
        in_planes,
        out_planes,
        kernel_size=3,
        stride=stride,
        padding=dilation,
        dilation=dilation,
        bias=False,
    )


def _conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
        dilation: int = 1,
        norm_layer: NormLayer = FrozenBatchNorm2d,
    ) -> None:
        super().__init__()
        if dilation > 1:
            raise ValueError("BasicBlock has no dilated variant (torchvision's neither)")
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = norm_layer(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = norm_layer(planes)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided, or dilated), 1x1 expand, and a shortcut (ResNet-50/101/152;
    the stride sits on the 3x3 convolution, as in torchvision's "ResNet v1.5")."""

    expansion = 4

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
        dilation: int = 1,
        norm_layer: NormLayer = FrozenBatchNorm2d,
    ) -> None:
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = norm_layer(planes)
        self.conv2 = _conv3x3(planes, planes, stride, dilation)
        self.bn2 = norm_layer(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = norm_layer(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


Block = type[BasicBlock] | type[Bottleneck]

# torchvision's depths of each variant's four stages.
RESNET_VARIANTS: dict[str, tuple[Block, tuple[int, int, int, int]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet34": (BasicBlock, (3, 4, 6, 3)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet101": (Bottleneck, (3, 4, 23, 3)),
    "resnet152": (Bottleneck, (3, 8, 36, 3)),
}


class ResNetBackbone(nn.Module):
    """A ResNet up to layer4: (B, 3, H, W) -> (B, out_channels, H/32, W/32) (H/16, W/16 with a
    dilated last stage). Convolutions start as torchvision's (Kaiming normal, fan-out); the
    normalization layers (``norm_layer``: frozen batch norm by default) as identities."""

    def __init__(
        self,
        block: Block,
        depths: tuple[int, int, int, int],
        dilate_last_stage: bool = False,
        norm_layer: NormLayer = FrozenBatchNorm2d,
    ) -> None:
        super().__init__()
        if dilate_last_stage and block is BasicBlock:
            raise ValueError(
                "a dilated last stage needs Bottleneck blocks (resnet50/101/152); "
                "resnet18/34 are built of BasicBlocks, which have no dilated variant"
            )
        self._inplanes = 64
        self._dilation = 1
        self._norm_layer = norm_layer
        self.dilate_last_stage = dilate_last_stage
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = norm_layer(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_stage(block, 64, depths[0], stride=1)
        self.layer2 = self._make_stage(block, 128, depths[1], stride=2)
        self.layer3 = self._make_stage(block, 256, depths[2], stride=2)
        self.layer4 = self._make_stage(block, 512, depths[3], stride=2, dilate=dilate_last_stage)
        self.out_channels = 512 * block.expansion
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def _make_stage(
        self, block: Block, planes: int, depth: int, stride: int, dilate: bool = False
    ) -> nn.Sequential:
        first_dilation = self._dilation
        if dilate:  # keep the resolution: trade the stride for dilation from here on
            self._dilation *= stride
            stride = 1
        downsample = None
        if stride != 1 or self._inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self._inplanes, planes * block.expansion, stride),
                self._norm_layer(planes * block.expansion),
            )
        norm = self._norm_layer
        blocks = [block(self._inplanes, planes, stride, downsample, first_dilation, norm)]
        self._inplanes = planes * block.expansion
        blocks += [
            block(self._inplanes, planes, dilation=self._dilation, norm_layer=norm)
            for _ in range(1, depth)
        ]
        return nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def feature_map_size(self, height: int, width: int) -> tuple[int, int]:
        """The (h, w) of layer4's feature map for (height, width) frames, by the convolution
        arithmetic (no forward pass: the model may sit on the meta device)."""

        def down(size: int, kernel: int, stride: int, padding: int) -> int:
            return (size + 2 * padding - kernel) // stride + 1

        sizes = []
        for size in (height, width):
            size = down(down(size, 7, 2, 3), 3, 2, 1)  # conv1, maxpool
            size = down(down(size, 3, 2, 1), 3, 2, 1)  # layer2, layer3
            if not self.dilate_last_stage:
                size = down(size, 3, 2, 1)  # layer4
            sizes.append(size)
        return sizes[0], sizes[1]


def resnet_backbone(
    name: str,
    replace_final_stride_with_dilation: bool = False,
    norm_layer: NormLayer = FrozenBatchNorm2d,
) -> ResNetBackbone:
    """The backbone ``name`` (one of :data:`RESNET_VARIANTS`), randomly initialized, with
    ``norm_layer`` after each convolution (frozen batch norm, as ACT's, by default)."""
    if name not in RESNET_VARIANTS:
        raise ValueError(f"unknown ResNet {name!r}; choose one of {', '.join(RESNET_VARIANTS)}")
    block, depths = RESNET_VARIANTS[name]
    return ResNetBackbone(
        block,
        depths,
        dilate_last_stage=replace_final_stride_with_dilation,
        norm_layer=norm_layer,
    )
