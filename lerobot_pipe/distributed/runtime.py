"""Process-group start-up and the few collectives the trainer needs, one code path for CPU and GPU.

Backend and device are the only differences: nccl + ``cuda:LOCAL_RANK`` when CUDA is available,
gloo + cpu otherwise. Launchers (torchrun, ``accelerate launch``, srun + torchrun) all export
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def launched_world_size(env: Mapping[str, str] = os.environ) -> int:
    """World size from the launcher's environment (1 without a launcher)."""
    return int(env.get("WORLD_SIZE", "1"))


def launched_rank(env: Mapping[str, str] = os.environ) -> int:
    return int(env.get("RANK", "0"))


def init_distributed(timeout_s: float = 1800.0) -> DistEnv:
    world_size = launched_world_size()
    rank = launched_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if world_size == 1:
        return DistEnv(0, 0, 1, device, None)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            timeout=timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,
        )
    return DistEnv(rank, local_rank, world_size, device, backend)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast_from_main(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (``obj`` itself without a process group)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any, group: dist.ProcessGroup | None = None) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (None elsewhere); over ``group`` (which holds rank 0) when
    given, else the default group."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size(group) if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0, group=group)
    return out


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
