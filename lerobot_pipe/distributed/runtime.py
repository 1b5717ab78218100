"""Process-group start-up and the few collectives the trainer needs, one code path for CPU and GPU.

Backend and device are the only differences: nccl + ``cuda:LOCAL_RANK`` when CUDA is available,
gloo + cpu otherwise. Launchers (torchrun, ``accelerate launch``, srun + torchrun) all export
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


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


def broadcast_from_main(obj: Any, group: dist.ProcessGroup | None = None) -> Any:
    """Rank 0's ``obj`` on every rank (``obj`` itself without a process group); over ``group``
    (which holds rank 0) when given, else the default group."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def run_on_main(
    fn: Callable[..., T],
    *args: Any,
    error_type: type[Exception] = RuntimeError,
    describe: Callable[[BaseException], str] = str,
    what: str = "the main process's work",
    **kwargs: Any,
) -> T:
    """Collective: run ``fn`` on rank 0 only and give every rank the same outcome.

    Without a process group this is ``fn(*args, **kwargs)``. Otherwise rank 0's result (which
    must be picklable) is broadcast; when ``fn`` fails, rank 0 re-raises its exception and every
    other rank raises ``error_type`` with ``describe(exception)`` (saying ``what`` failed and the
    exception's type, unless it is an ``error_type`` itself). Every rank must call this.
    """
    if not dist.is_initialized():
        return fn(*args, **kwargs)
    payload: list[Any] = [None]
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            result = fn(*args, **kwargs)
            pickle.dumps(result)  # fail here, not inside the collective, if it cannot be sent
            payload = [("ok", result)]
        except BaseException as exc:  # broadcast even on KeyboardInterrupt so no rank hangs
            error = exc
            payload = [("error", (type(exc).__name__, describe(exc)))]
    dist.broadcast_object_list(payload, src=0)
    kind, value = payload[0]
    if kind == "ok":
        return value
    if error is not None:
        raise error
    type_name, message = value
    if type_name == error_type.__name__:
        raise error_type(message)
    raise error_type(f"{what} failed on rank 0: {type_name}: {message}")


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
