"""Dropout whose CPU mask costs a third of torch's.

On CPU, ``F.dropout`` draws its mask with ``bernoulli_(1 - p)``, which here costs 2-5x a
``uniform_`` of the same size followed by a comparison (docs/benchmarks.md §9, "Dropout"): ACT
calls it ~38 times a step on feed-forward-sized tensors. :class:`Dropout` is ``nn.Dropout`` (the
same module, no state, so checkpoints are unchanged) that draws ``u ~ U[0, 1)`` in float32 from
the same generator and keeps an element where ``u >= p``: the same distribution (keep with
probability ``1 - p``, scale by ``1 / (1 - p)``), different draws than torch's. Elsewhere (CUDA's
fused kernel) and at ``p`` 0 or 1 it is ``F.dropout``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn


def dropout(x: Tensor, p: float, training: bool = True, inplace: bool = False) -> Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p == 1.0:
        return F.dropout(x, p, training, inplace)
    keep = torch.empty(x.shape, dtype=torch.float32, device=x.device).uniform_()
    keep = keep.ge_(p) if x.dtype == torch.float32 else keep.ge(p).to(x.dtype)
    keep.mul_(1.0 / (1.0 - p))
    return x.mul_(keep) if inplace else x * keep


class Dropout(nn.Dropout):
    """``nn.Dropout`` with :func:`dropout`'s CPU mask."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training, self.inplace)
