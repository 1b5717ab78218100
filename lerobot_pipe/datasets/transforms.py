"""LeRobot's image augmentations (``--dataset.image_transforms.*``), in torch alone, per batch.

The configuration is lerobot_pipe.configs.train.ImageTransformsConfig: LeRobot's names and
defaults, its ``tfs`` entries ``{"weight", "type", "kwargs"}`` dicts. Each sample and
camera draws which transforms apply (up to ``max_num_transforms``, weighted, without
replacement) and their parameters, as LeRobot's RandomSubsetApply and torchvision's
ColorJitter, SharpnessJitter and RandomAffine do; the frames of one sample's window share them.
Unlike LeRobot, which draws from torch's global RNG in each DataLoader worker, every draw here
is a pure function of a per-sample key (the sampler supplies the sample's stream position), so a
resumed run sees the same augmentations, however many loader threads prepared the batches.
The work is batched and runs on the frames' device (float32 in [0, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lerobot_pipe.configs.train import ImageTransformsConfig

GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # ITU-R 601-2 luma, as torchvision's rgb_to_grayscale
SHARPNESS_KERNEL = ((1.0, 1.0, 1.0), (1.0, 5.0, 1.0), (1.0, 1.0, 1.0))  # / 13, as PIL's SMOOTH
COLOR_JITTER_PARTS = ("brightness", "contrast", "saturation", "hue")
SUPPORTED_TYPES = ("ColorJitter", "SharpnessJitter", "RandomAffine", "Identity")


@dataclass
class ImageTransformConfig:
    """One ``tfs`` entry: ``weight`` to be drawn, torchvision/LeRobot class ``type``, ``kwargs``."""

    weight: float = 1.0
    type: str = "Identity"
    kwargs: dict[str, Any] = field(default_factory=dict)


def _range(value: Any, name: str, centre: float, low: float | None = None) -> tuple[float, float]:
    """torchvision's convention: a number ``v`` means ``[centre - v, centre + v]``."""
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{name}={value} must be non-negative")
        lo, hi = centre - value, centre + value
        if low is not None:
            lo = max(lo, low)
    elif isinstance(value, list | tuple) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
    else:
        raise ValueError(f"{name}={value!r} must be a number or a [min, max] pair")
    if lo > hi or (low is not None and lo < low):
        raise ValueError(f"{name}=[{lo}, {hi}] must satisfy {low or '-inf'} <= min <= max")
    return lo, hi


def _uniform(u: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    return bounds[0] + u * (bounds[1] - bounds[0])


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A well-mixed 64-bit hash (SplitMix64's finaliser), elementwise on uint64."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def uniforms(keys: np.ndarray, stream: int, count: int) -> np.ndarray:
    """``(len(keys), count)`` uniforms in [0, 1), a pure function of (key, stream, column)."""
    base = _splitmix64(keys.astype(np.uint64) ^ _splitmix64(np.uint64(stream)))
    with np.errstate(over="ignore"):
        bits = _splitmix64(base[:, None] + np.arange(count, dtype=np.uint64)[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def to_grayscale(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(dim=-3)
    return (GRAY_WEIGHTS[0] * r + GRAY_WEIGHTS[1] * g + GRAY_WEIGHTS[2] * b).unsqueeze(-3)


def _blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (factor * x + (1 - factor) * other).clamp_(0.0, 1.0)


def _rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """Hexcone HSV with hue in [0, 1): the sector of the largest channel, then the offset."""
    r, g, b = x.unbind(dim=-3)
    value, _ = x.max(dim=-3)
    low, _ = x.min(dim=-3)
    spread = value - low
    grey = spread == 0
    saturation = torch.where(grey, torch.zeros_like(value), spread / torch.where(grey, 1, value))
    safe = torch.where(grey, torch.ones_like(spread), spread)
    hue = torch.where(
        value == r,
        (g - b) / safe,
        torch.where(value == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe),
    )
    hue = torch.where(grey, torch.zeros_like(hue), hue)
    hue = torch.remainder(hue / 6.0, 1.0)
    return torch.stack((hue, saturation, value), dim=-3)


def _hsv_to_rgb(x: torch.Tensor) -> torch.Tensor:
    hue, saturation, value = x.unbind(dim=-3)
    sector = hue * 6.0
    whole = torch.floor(sector)
    frac = sector - whole
    k = torch.remainder(whole, 6).to(torch.int64)
    p = (value * (1 - saturation)).clamp(0, 1)
    q = (value * (1 - saturation * frac)).clamp(0, 1)
    t = (value * (1 - saturation * (1 - frac))).clamp(0, 1)
    # Per sector (0..5): which of (v, p, q, t) each of r, g, b takes.
    table = torch.tensor(
        [[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]], device=x.device
    )
    candidates = torch.stack((value, p, q, t), dim=-3)
    choice = table[:, k].movedim(0, -3)
    return candidates.gather(-3, choice)


def adjust_brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (x * factor).clamp_(0.0, 1.0)


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    mean = to_grayscale(x).mean(dim=(-3, -2, -1), keepdim=True)
    return _blend(x, mean, factor)


def adjust_saturation(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(x, to_grayscale(x), factor)


def adjust_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    hsv = _rgb_to_hsv(x)
    hue = torch.remainder(hsv[..., 0:1, :, :] + shift, 1.0)
    return _hsv_to_rgb(torch.cat((hue, hsv[..., 1:, :, :]), dim=-3))


def adjust_sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with a 3x3-smoothed copy (border pixels stay): factor 0 blurs, 2 sharpens."""
    height, width = x.shape[-2:]
    if height <= 2 or width <= 2:
        return x
    channels = x.shape[-3]
    flat = x.reshape(-1, channels, height, width)
    kernel = torch.tensor(SHARPNESS_KERNEL, dtype=x.dtype, device=x.device) / 13.0
    smooth = F.conv2d(flat, kernel.expand(channels, 1, 3, 3), groups=channels)
    degenerate = flat.clone()
    degenerate[..., 1:-1, 1:-1] = smooth
    return _blend(x, degenerate.reshape(x.shape), factor)


def affine(x: torch.Tensor, angle: np.ndarray, shift: np.ndarray) -> torch.Tensor:
    """Rotate by ``angle`` degrees about the centre, then shift by whole pixels ``(dx, dy)``;
    nearest neighbour, zeros outside (torchvision's RandomAffine defaults). One set of
    parameters per leading index of ``x`` ``(n, ..., C, H, W)``."""
    n, height, width = x.shape[0], x.shape[-2], x.shape[-1]
    rad = np.radians(angle)
    cos, sin = np.cos(rad), np.sin(rad)
    # Output pixel centre (relative to the image centre) -> source position: the inverse map.
    inverse = np.zeros((n, 2, 3))
    inverse[:, 0, 0], inverse[:, 0, 1] = cos, sin
    inverse[:, 1, 0], inverse[:, 1, 1] = -sin, cos
    inverse[:, 0, 2] = -(cos * shift[:, 0] + sin * shift[:, 1])
    inverse[:, 1, 2] = sin * shift[:, 0] - cos * shift[:, 1]
    theta = torch.as_tensor(inverse, dtype=x.dtype, device=x.device)
    xs = torch.arange(width, dtype=x.dtype, device=x.device) + 0.5 - width / 2
    ys = torch.arange(height, dtype=x.dtype, device=x.device) + 0.5 - height / 2
    points = torch.stack(
        (
            xs.expand(height, width),
            ys[:, None].expand(height, width),
            torch.ones_like(xs).expand(height, width),
        ),
        dim=-1,
    )
    source = torch.einsum("hwk,njk->nhwj", points, theta)
    grid = source / torch.tensor([width / 2, height / 2], dtype=x.dtype, device=x.device)
    flat = x.reshape(n, -1, height, width)
    out = F.grid_sample(flat, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.reshape(x.shape)


class _Transform:
    """One configured augmentation: ``draws`` uniforms per sample become its parameters."""

    draws = 0

    def apply(self, x: torch.Tensor, u: np.ndarray) -> torch.Tensor:
        return x


class _ColorJitter(_Transform):
    def __init__(self, kwargs: dict[str, Any], name: str) -> None:
        unknown = sorted(set(kwargs) - set(COLOR_JITTER_PARTS))
        if unknown:
            raise ValueError(f"{name}: ColorJitter has no argument(s) {unknown}")
        self.parts: dict[str, tuple[float, float]] = {}
        for part in COLOR_JITTER_PARTS:
            value = kwargs.get(part)
            if value is None:
                continue
            if part == "hue":
                bounds = _range(value, f"{name}.hue", 0.0)
                if not -0.5 <= bounds[0] <= bounds[1] <= 0.5:
                    raise ValueError(f"{name}.hue={list(bounds)} must lie in [-0.5, 0.5]")
            else:
                bounds = _range(value, f"{name}.{part}", 1.0, low=0.0)
            self.parts[part] = bounds
        # One uniform per part plus one per part for the order they are applied in.
        self.draws = 2 * len(COLOR_JITTER_PARTS)

    def apply(self, x: torch.Tensor, u: np.ndarray) -> torch.Tensor:
        order = np.argsort(u[:, len(COLOR_JITTER_PARTS) :], axis=1)
        functions = {
            "brightness": adjust_brightness,
            "contrast": adjust_contrast,
            "saturation": adjust_saturation,
            "hue": adjust_hue,
        }
        shape = (len(x),) + (1,) * (x.dim() - 1)
        for slot in range(len(COLOR_JITTER_PARTS)):
            for p, part in enumerate(COLOR_JITTER_PARTS):
                if part not in self.parts:
                    continue
                rows = np.flatnonzero(order[:, slot] == p)
                if rows.size == 0:
                    continue
                value = _uniform(u[rows, p], self.parts[part])
                factor = torch.as_tensor(value, dtype=x.dtype, device=x.device).reshape(
                    (len(rows),) + shape[1:]
                )
                index = torch.as_tensor(rows, device=x.device)
                x = x.index_copy(0, index, functions[part](x.index_select(0, index), factor))
        return x


class _Sharpness(_Transform):
    draws = 1

    def __init__(self, kwargs: dict[str, Any], name: str) -> None:
        unknown = sorted(set(kwargs) - {"sharpness"})
        if unknown or "sharpness" not in kwargs:
            raise ValueError(f"{name}: SharpnessJitter takes exactly `sharpness`, got {kwargs}")
        self.bounds = _range(kwargs["sharpness"], f"{name}.sharpness", 1.0, low=0.0)

    def apply(self, x: torch.Tensor, u: np.ndarray) -> torch.Tensor:
        factor = torch.as_tensor(_uniform(u[:, 0], self.bounds), dtype=x.dtype, device=x.device)
        return adjust_sharpness(x, factor.reshape((len(x),) + (1,) * (x.dim() - 1)))


class _Affine(_Transform):
    draws = 3

    def __init__(self, kwargs: dict[str, Any], name: str) -> None:
        unknown = sorted(set(kwargs) - {"degrees", "translate"})
        if unknown:
            raise ValueError(
                f"{name}: RandomAffine arguments {unknown} are not supported here "
                "(supported: degrees, translate)"
            )
        self.degrees = _range(kwargs.get("degrees", 0.0), f"{name}.degrees", 0.0)
        translate = kwargs.get("translate")
        if translate is None:
            self.translate = (0.0, 0.0)
        elif len(translate) != 2 or not all(0 <= t <= 1 for t in translate):
            raise ValueError(f"{name}.translate={translate!r} must be two fractions in [0, 1]")
        else:
            self.translate = (float(translate[0]), float(translate[1]))

    def apply(self, x: torch.Tensor, u: np.ndarray) -> torch.Tensor:
        height, width = x.shape[-2:]
        angle = _uniform(u[:, 0], self.degrees)
        max_dx, max_dy = self.translate[0] * width, self.translate[1] * height
        shift = np.stack(
            [
                np.round(_uniform(u[:, 1], (-max_dx, max_dx))),
                np.round(_uniform(u[:, 2], (-max_dy, max_dy))),
            ],
            axis=1,
        )
        return affine(x, angle, shift)


def _build(name: str, cfg: ImageTransformConfig) -> _Transform:
    if cfg.type == "ColorJitter":
        return _ColorJitter(dict(cfg.kwargs), name)
    if cfg.type == "SharpnessJitter":
        return _Sharpness(dict(cfg.kwargs), name)
    if cfg.type == "RandomAffine":
        return _Affine(dict(cfg.kwargs), name)
    if cfg.type == "Identity":
        return _Transform()
    raise ValueError(
        f"--dataset.image_transforms.tfs.{name}.type={cfg.type!r} is not supported; choose one "
        f"of {list(SUPPORTED_TYPES)}"
    )


class ImageTransforms:
    """Applies ``cfg`` to batches of camera frames ``(B, [T,] 3, H, W)`` in [0, 1]."""

    def __init__(self, cfg: ImageTransformsConfig) -> None:
        self.cfg = cfg
        tfs = {
            name: tf if isinstance(tf, ImageTransformConfig) else ImageTransformConfig(**tf)
            for name, tf in cfg.tfs.items()
        }
        chosen = {name: tf for name, tf in tfs.items() if tf.weight > 0}
        self.names = list(chosen)
        self.transforms = [_build(f"tfs.{name}", tf) for name, tf in chosen.items()]
        weights = np.array([tf.weight for tf in chosen.values()], dtype=np.float64)
        self.weights = weights / weights.sum() if len(weights) else weights
        if cfg.max_num_transforms < 1:
            raise ValueError(
                f"--dataset.image_transforms.max_num_transforms={cfg.max_num_transforms} must be "
                "at least 1"
            )
        self.num_subset = min(len(self.transforms), cfg.max_num_transforms)
        self.enabled = cfg.enable and self.num_subset > 0
        self._offsets = np.cumsum([len(self.transforms)] + [t.draws for t in self.transforms])

    def __call__(self, x: torch.Tensor, keys: np.ndarray, stream: int) -> torch.Tensor:
        """Augment each ``x[b]`` with draws from ``keys[b]`` (``stream`` tells cameras apart)."""
        if not self.enabled:
            return x
        u = uniforms(keys, stream, int(self._offsets[-1]))
        # Weighted sampling without replacement (Efraimidis-Spirakis): the largest u**(1/w).
        rank = np.log(np.maximum(u[:, : len(self.transforms)], 1e-300)) / self.weights
        picked = np.argsort(-rank, axis=1)[:, : self.num_subset]
        if not self.cfg.random_order:
            picked = np.sort(picked, axis=1)
        for slot in range(self.num_subset):
            for i, transform in enumerate(self.transforms):
                rows = np.flatnonzero(picked[:, slot] == i)
                if rows.size == 0:
                    continue
                draws = u[rows, self._offsets[i] : self._offsets[i + 1]]
                index = torch.as_tensor(rows, device=x.device)
                out = transform.apply(x.index_select(0, index), draws)
                x = x.index_copy(0, index, out)
        return x


def sample_keys(seed: int, positions: np.ndarray) -> np.ndarray:
    """Augmentation keys of the samples at sampler stream ``positions`` of a run seeded
    ``seed``: distinct per (seed, position), so no two draws of a run share augmentations."""
    with np.errstate(over="ignore"):
        return _splitmix64(np.uint64(seed % 2**64)) + positions.astype(np.uint64)
