from __future__ import annotations

import pytest

from lerobot_pipe.configs.parser import ConfigError
from lerobot_pipe.configs.train import ParallelismConfig
from lerobot_pipe.distributed.parallel_dims import resolve_parallelism


@pytest.mark.parametrize(
    ("replicate", "shard", "world", "expected"),
    [
        (None, None, 1, (1, 1, "single")),
        (None, None, 4, (4, 1, "ddp")),
        (None, -1, 4, (1, 4, "fsdp2")),
        (None, 2, 4, (2, 2, "hsdp")),
        (2, -1, 4, (2, 2, "hsdp")),
        (-1, 2, 4, (2, 2, "hsdp")),
        (1, 2, 2, (1, 2, "fsdp2")),
    ],
)
def test_resolution(replicate, shard, world, expected):
    dims = resolve_parallelism(ParallelismConfig(replicate, shard), world)
    assert (dims.dp_replicate, dims.dp_shard, dims.mode) == expected
    assert dims.dp_world_size == world


@pytest.mark.parametrize(
    ("replicate", "shard", "world", "message"),
    [
        (1, 2, 4, "= 2, but 4 process(es) were launched"),
        (None, 3, 2, "--parallelism.dp_shard=3 does not divide the world size 2"),
        (-1, -1, 2, "cannot both be -1"),
        (0, None, 2, "--parallelism.dp_replicate=0"),
    ],
)
def test_errors_name_the_numbers(replicate, shard, world, message):
    with pytest.raises(ConfigError, match=None) as err:
        resolve_parallelism(ParallelismConfig(replicate, shard), world)
    assert message in str(err.value)
