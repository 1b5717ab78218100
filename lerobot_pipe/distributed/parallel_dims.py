"""The data-parallel topology: ``dp_replicate`` replica groups x ``dp_shard`` FSDP shards.

Axis names, used consistently: ``dp_replicate`` is the mesh axis over which full replicas
all-reduce gradients (DDP, or HSDP's outer axis); ``dp_shard`` is the axis over which FSDP2
shards parameters, gradients and optimizer state. ``dp_replicate * dp_shard == world_size``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lerobot_pipe.configs.parser import ConfigError
from lerobot_pipe.configs.train import ParallelismConfig


@dataclass(frozen=True)
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    world_size: int

    @property
    def dp_world_size(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def is_sharded(self) -> bool:
        return self.dp_shard > 1

    @property
    def is_hsdp(self) -> bool:
        return self.dp_shard > 1 and self.dp_replicate > 1

    @property
    def mode(self) -> str:
        if self.is_hsdp:
            return "hsdp"
        if self.is_sharded:
            return "fsdp2"
        return "ddp" if self.world_size > 1 else "single"

    def describe(self) -> str:
        return f"{self.mode}: dp_replicate={self.dp_replicate}, dp_shard={self.dp_shard}"

    def to_dict(self) -> dict:
        return {**asdict(self), "mode": self.mode}


def _check_degree(name: str, value: int | None) -> None:
    if value is not None and (value == 0 or value < -1):
        raise ConfigError(
            f"--parallelism.{name}={value}: must be a positive integer or -1 (all remaining ranks)"
        )


def resolve_parallelism(cfg: ParallelismConfig, world_size: int) -> ParallelDims:
    """Resolve the requested degrees for ``world_size`` processes (unset = DDP, -1 = the rest)."""
    _check_degree("dp_replicate", cfg.dp_replicate)
    _check_degree("dp_shard", cfg.dp_shard)
    replicate, shard = cfg.dp_replicate, cfg.dp_shard
    if replicate == -1 and shard == -1:
        raise ConfigError("--parallelism.dp_replicate and --parallelism.dp_shard cannot both be -1")
    if shard is None:
        shard = 1
    if replicate is None:
        replicate = -1
    for name, degree, other in (("dp_replicate", replicate, shard), ("dp_shard", shard, replicate)):
        if degree == -1:
            if world_size % other:
                raise ConfigError(
                    f"--parallelism.{name}=-1: world size {world_size} is not divisible by "
                    f"the other degree {other}"
                )
            if name == "dp_replicate":
                replicate = world_size // other
            else:
                shard = world_size // other
    if replicate * shard != world_size:
        raise ConfigError(
            f"--parallelism.dp_replicate={replicate} x --parallelism.dp_shard={shard} = "
            f"{replicate * shard}, but {world_size} process(es) were launched; the product must "
            "equal the world size (WORLD_SIZE)"
        )
    return ParallelDims(dp_replicate=replicate, dp_shard=shard, world_size=world_size)
