"""Trainable batch norm across data-parallel ranks: what every topology computes and saves.

A trainable batch norm (Diffusion Policy's ResNet at ``use_group_norm=false``) normalizes each
training batch by its own statistics and keeps running statistics for eval. Data parallelism
splits the batch, so two choices follow:

- Batch statistics. By default each rank normalizes by the statistics of its own part of the
  batch, as DDP and LeRobot do (a data-parallel run then differs from one process by design).
  ``--accelerator.sync_batch_norm=true`` converts every batch norm to :class:`CrossRankBatchNorm`,
  whose training statistics are those of the whole data-parallel batch (one all-reduce per
  layer, differentiable), so DDP, FSDP2 and HSDP compute what one process computes on the global
  batch. torch's ``nn.SyncBatchNorm`` refuses CPU tensors; this one runs on gloo and nccl alike.
- Running statistics. DDP broadcasts rank 0's buffers at every forward; FSDP2 does not, so each
  rank's running statistics follow its own batches. :func:`broadcast_batch_norm_stats` copies
  rank 0's to every rank before each checkpoint, so every topology and every format saves rank
  0's running statistics (the ones DDP saves), and a resumed run starts every rank from them.
  With ``sync_batch_norm`` every rank's are the same anyway.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm


def batch_norms(model: nn.Module) -> list[_BatchNorm]:
    """The batch norms of ``model`` that track running statistics (frozen ones do not)."""
    return [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]


class CrossRankBatchNorm(_BatchNorm):
    """Batch norm whose training statistics are those of the batch over every rank of the
    default process group (the data-parallel world; the local batch without one). The arithmetic
    is one formula in fp32 on every topology, one process included, so runs with the flag
    compare across topologies; the output keeps the input's dtype. State-dict names are
    ``nn.BatchNorm2d``'s."""

    def _check_input_dim(self, x: Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected a (N, C, ...) input, got shape {tuple(x.shape)}")

    def forward(self, x: Tensor) -> Tensor:
        self._check_input_dim(x)
        channels = x.shape[1]
        shape = (1, channels) + (1,) * (x.dim() - 2)
        x32 = x.float()
        if self.training:
            dims = [0, *range(2, x.dim())]
            count = x32.new_tensor([x.numel() // channels])
            # One collective per layer: per-channel sums, sums of squares and the count.
            totals = torch.cat([x32.sum(dims), (x32 * x32).sum(dims), count])
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                totals = dist_fn.all_reduce(totals)
            n = totals[-1]
            mean = totals[:channels] / n
            var = (totals[channels : 2 * channels] / n - mean * mean).clamp_min(0)
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = self.momentum
                if momentum is None:  # a cumulative average
                    momentum = 1.0 / float(self.num_batches_tracked)
                unbiased = var * (n / (n - 1).clamp_min(1))
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), momentum)
        else:
            mean, var = self.running_mean.float(), self.running_var.float()
        y = (x32 - mean.view(shape)) * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.float().view(shape) + self.bias.float().view(shape)
        return y.to(x.dtype)


def convert_sync_batch_norm(model: nn.Module) -> int:
    """Replace every trainable batch norm of ``model`` in place by a :class:`CrossRankBatchNorm`
    holding the same parameters and buffers (names and parameter order unchanged). Returns how
    many were replaced."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, _BatchNorm) and not isinstance(child, CrossRankBatchNorm):
                if not child.track_running_stats:
                    continue
                sync = CrossRankBatchNorm(
                    child.num_features,
                    eps=child.eps,
                    momentum=child.momentum,
                    affine=child.affine,
                    device="meta",
                )
                if child.affine:
                    sync.weight, sync.bias = child.weight, child.bias
                sync.running_mean = child.running_mean
                sync.running_var = child.running_var
                sync.num_batches_tracked = child.num_batches_tracked
                sync.train(child.training)
                setattr(parent, name, sync)
                replaced += 1
    return replaced


def broadcast_batch_norm_stats(model: nn.Module) -> None:
    """Copy global rank 0's batch norm running statistics to every rank (collective)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for module in batch_norms(model):
        for buffer in (module.running_mean, module.running_var, module.num_batches_tracked):
            dist.broadcast(buffer, src=0)
