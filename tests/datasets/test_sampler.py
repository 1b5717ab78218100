import json

import numpy as np
import pytest

from lerobot_pipe.datasets import GlobalBatchSampler, episode_frames


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


def test_episode_frames_drop_each_episodes_last_frames(caplog) -> None:
    starts, ends = np.array([0, 10, 13]), np.array([10, 13, 20])
    np.testing.assert_array_equal(
        episode_frames(starts, ends, drop_n_last_frames=3), [*range(0, 7), *range(13, 17)]
    )  # the 3-frame episode has none left: skipped, with a warning
    assert "1 of 3 episodes have no frame left" in caplog.text
    np.testing.assert_array_equal(
        episode_frames(starts, ends, 1, 1), [*range(1, 9), 11, *range(14, 19)]
    )
    with pytest.raises(ValueError, match="no frame is left to sample"):
        episode_frames(starts, ends, drop_n_last_frames=10)


def test_drawing_from_some_positions_keeps_the_order_rules() -> None:
    """A subset of positions: each once per epoch, the same global batch however it is split,
    sample-exact resume."""
    keep = np.array([1, 2, 3, 5, 8, 13, 21, 34, 35])
    one = GlobalBatchSampler(40, 4, 0, 1, seed=3, indices=keep)
    ranks = [GlobalBatchSampler(40, 2, r, 2, seed=3, indices=keep) for r in range(2)]
    stream = []
    for _ in range(9):
        expected = one.next_indices()
        np.testing.assert_array_equal(np.concatenate([s.next_indices() for s in ranks]), expected)
        stream.append(expected)
    stream = np.concatenate(stream)  # 36 draws: 4 epochs of 9
    for epoch in range(4):
        np.testing.assert_array_equal(np.sort(stream[epoch * 9 : (epoch + 1) * 9]), keep)
    assert one.epoch == 4 and one.epochs_consumed == 4.0
    resumed = GlobalBatchSampler(40, 4, 0, 1, seed=3, start_sample=16, indices=keep)
    np.testing.assert_array_equal(resumed.next_indices(), stream[16:20])
    with pytest.raises(ValueError, match=r"indices must lie in \[0, num_samples=40\)"):
        GlobalBatchSampler(40, 4, 0, 1, seed=3, indices=np.array([0, 40]))
