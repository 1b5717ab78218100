"""The project's randomness: :func:`seed_everything` seeds the global RNGs; the keyed draws are a
pure function of a per-sample key, computed on the key's device.

The loader gives every sample it draws a key (``batch["sample_key"]``, int64: the run's seed and
the sample's position in the sampler's stream, the same key that seeds its image augmentations).
A policy that draws its training randomness per sample from that key (Diffusion Policy: the noise,
the diffusion step, the crop) makes a data-parallel run compute what one process computes on the
same global batch, however the batch is split across ranks, and makes a resumed run repeat an
uninterrupted one on any topology: nothing depends on which rank drew which sample, or on an RNG
state to restore.

The hash is integer arithmetic on int64 tensors that never overflows (32-bit words, products
below 2**49), so it gives the same bits on every device and backend; the uniforms are 24-bit
floats. ``stream`` separates independent draws of one sample (e.g. noise and crop offsets).
"""

from __future__ import annotations

import math
import random
import zlib

import numpy as np
import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF
# lowbias32 (C. Wellons' hash-prospector): two multiply-xorshift rounds on 32-bit words.
_ROUND1, _ROUND2 = 0x7FEB352D, 0x846CA68B
_FLOAT_BITS = 24  # a float32 mantissa's worth of each hash


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs (every device's), as LeRobot's ``set_seed``.

    numpy takes seeds below 2**32 only: it is seeded with ``seed % 2**32``, which is ``seed``
    itself for every seed LeRobot accepts, so the draws match LeRobot's wherever it runs at all.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def stream_id(name: str) -> int:
    """A 32-bit stream number from a readable name (``"diffusion.noise"``)."""
    return zlib.crc32(name.encode())


def _mul32(x: Tensor, constant: int) -> Tensor:
    """``x * constant mod 2**32`` for ``x`` < 2**32, with every product below 2**49."""
    low = x * (constant & _MASK16)
    high = ((x * (constant >> 16)) & _MASK16) << 16
    return (low + high) & _MASK32


def _hash32(x: Tensor) -> Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _ROUND1)
    x = x ^ (x >> 15)
    x = _mul32(x, _ROUND2)
    return x ^ (x >> 16)


def _python_hash32(value: int) -> int:
    return int(_hash32(torch.tensor([value & _MASK32], dtype=torch.int64))[0])


def keyed_uniform(keys: Tensor, stream: int, count: int) -> Tensor:
    """``(len(keys), count)`` float32 uniforms in (0, 1), a pure function of (key, stream,
    column), on ``keys``' device."""
    if keys.dtype != torch.int64 or keys.dim() != 1:
        raise ValueError(f"keys must be a 1-D int64 tensor, got {keys.dtype} {tuple(keys.shape)}")
    salt_a = _python_hash32(stream)
    salt_b = _python_hash32(stream ^ _ROUND1)
    low, high = keys & _MASK32, (keys >> 32) & _MASK32
    first = _hash32(low ^ _hash32(high ^ salt_a))[:, None]
    second = _hash32(high ^ _hash32(low ^ salt_b))[:, None]
    columns = torch.arange(count, dtype=torch.int64, device=keys.device)[None, :]
    bits = _hash32(_hash32(columns ^ first) ^ second)
    return ((bits >> (32 - _FLOAT_BITS)).float() + 0.5) * 2.0**-_FLOAT_BITS


def keyed_normal(keys: Tensor, stream: int, shape: tuple[int, ...]) -> Tensor:
    """``(len(keys), *shape)`` float32 standard normals (Box-Muller on keyed uniforms)."""
    count = math.prod(shape)
    uniform = keyed_uniform(keys, stream, 2 * count)
    radius = torch.sqrt(-2.0 * torch.log(uniform[:, :count]))
    normal = radius * torch.cos((2.0 * math.pi) * uniform[:, count:])
    return normal.reshape(len(keys), *shape)


def keyed_integers(keys: Tensor, stream: int, count: int, high: int | Tensor) -> Tensor:
    """``(len(keys), count)`` int64 in ``[0, high)`` (``high`` a number, or a tensor that
    broadcasts against the result, e.g. one bound per column)."""
    uniform = keyed_uniform(keys, stream, count).double()
    bound = torch.as_tensor(high, device=keys.device)
    return torch.minimum((uniform * bound).long(), bound - 1)
