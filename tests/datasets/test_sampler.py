import json

import numpy as np
import pytest

from lerobot_pipe.datasets import GlobalBatchSampler


def _steps(sampler: GlobalBatchSampler, n: int) -> list[np.ndarray]:
    return [sampler.next_indices() for _ in range(n)]


@pytest.mark.parametrize("num_samples", [37, 40])
def test_same_global_batch_whatever_the_split(num_samples: int) -> None:
    one = GlobalBatchSampler(num_samples, batch_size=8, dp_rank=0, dp_world_size=1, seed=7)
    ranks = [GlobalBatchSampler(num_samples, 4, r, 2, seed=7) for r in range(2)]
    quads = [GlobalBatchSampler(num_samples, 2, r, 4, seed=7) for r in range(4)]
    for _ in range(50):  # ~10 epochs, batches straddling epoch boundaries when N=37
        expected = one.next_indices()
        np.testing.assert_array_equal(np.concatenate([s.next_indices() for s in ranks]), expected)
        np.testing.assert_array_equal(np.concatenate([s.next_indices() for s in quads]), expected)
    assert one.samples_consumed == ranks[1].samples_consumed == 400


def test_every_sample_once_per_epoch() -> None:
    n = 37
    sampler = GlobalBatchSampler(n, batch_size=5, dp_rank=0, dp_world_size=1, seed=0)
    stream = np.concatenate(_steps(sampler, 30))  # 150 positions: epochs 0..3 and a bit
    for epoch in range(4):
        chunk = stream[epoch * n : (epoch + 1) * n]
        np.testing.assert_array_equal(np.sort(chunk), np.arange(n))
        expected = np.random.default_rng([0, epoch]).permutation(n)
        np.testing.assert_array_equal(chunk, expected)
    assert not np.array_equal(stream[:n], stream[n : 2 * n])


def test_resume_is_sample_exact() -> None:
    full = GlobalBatchSampler(23, batch_size=3, dp_rank=1, dp_world_size=2, seed=5)
    before = _steps(full, 11)
    state = json.loads(json.dumps(full.state_dict()))
    assert state["samples_consumed"] == 66
    assert state["epoch"] == full.epoch == 66 // 23
    assert state["seed"] == 5
    after = _steps(full, 20)
    resumed = GlobalBatchSampler(23, 3, 1, 2, seed=5, start_sample=state["samples_consumed"])
    for a, b in zip(after, _steps(resumed, 20), strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(before) == 11


def test_seed_changes_order_and_batches_are_copies() -> None:
    a = GlobalBatchSampler(100, 10, 0, 1, seed=0).next_indices()
    b = GlobalBatchSampler(100, 10, 0, 1, seed=1).next_indices()
    assert not np.array_equal(a, b)
    sampler = GlobalBatchSampler(100, 10, 0, 1, seed=0)
    sampler.next_indices()[:] = -1  # must not corrupt the cached permutation
    sampler.samples_consumed = 0
    np.testing.assert_array_equal(sampler.next_indices(), a)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_samples": 0},
        {"batch_size": 0},
        {"dp_rank": 2},
        {"dp_rank": -1},
        {"start_sample": -1},
    ],
)
def test_invalid_arguments(kwargs: dict) -> None:
    args = {"num_samples": 10, "batch_size": 2, "dp_rank": 0, "dp_world_size": 2, "seed": 0}
    with pytest.raises(ValueError):
        GlobalBatchSampler(**(args | kwargs))
