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
    """Resolve the requested degrees for ``world_size`` processes.

    Unset ``dp_shard`` is 1; unset ``dp_replicate`` and ``-1`` take whatever the other degree
    leaves (or 1 when dp_shard is -1), so no flags on N processes is DDP and
    ``--parallelism.dp_shard=-1`` is FSDP2 over all of them.
    """
    _check_degree("dp_replicate", cfg.dp_replicate)
    _check_degree("dp_shard", cfg.dp_shard)
    if cfg.dp_replicate == -1 and cfg.dp_shard == -1:
        raise ConfigError("--parallelism.dp_replicate and --parallelism.dp_shard cannot both be -1")
    shard = 1 if cfg.dp_shard is None else cfg.dp_shard
    if cfg.dp_replicate is None:
        replicate = 1 if shard == -1 else -1
    else:
        replicate = cfg.dp_replicate
    fixed_name, fixed = ("dp_shard", shard) if replicate == -1 else ("dp_replicate", replicate)
    if -1 in (replicate, shard):
        if world_size % fixed:
            raise ConfigError(
                f"--parallelism.{fixed_name}={fixed} does not divide the world size {world_size} "
                f"(WORLD_SIZE); launch a multiple of {fixed} processes or change the degree"
            )
        if replicate == -1:
            replicate = world_size // shard
        else:
            shard = world_size // replicate
    if replicate * shard != world_size:
        raise ConfigError(
            f"--parallelism.dp_replicate={replicate} x --parallelism.dp_shard={shard} = "
            f"{replicate * shard}, but {world_size} process(es) were launched; the product must "
            "equal the world size (WORLD_SIZE)"
        )
    return ParallelDims(dp_replicate=replicate, dp_shard=shard, world_size=world_size)
