"""The streaming order (no data read): whole episodes per rank, every sample of an epoch once,
sample-exact resume on the same world size, nothing repeated or skipped on another one."""

from __future__ import annotations

import numpy as np
import pytest

from lerobot_pipe.datasets.stream_sampler import CARRY_EPOCH, StreamSampler

LENGTHS = np.random.default_rng(0).integers(5, 30, 23)
ENDS = np.cumsum(LENGTHS)
BOUNDS = (ENDS - LENGTHS, ENDS)
N = int(ENDS[-1])


def _ranks(world, batch=4, saved=None, **kwargs):
    samplers = [
        StreamSampler(BOUNDS, batch, r, world, seed=3, shuffle_buffer=16, **kwargs)
        for r in range(world)
    ]
    if saved is not None:
        for s in samplers:
            s.rebase(saved)
    return samplers


def _steps(samplers, steps):
    return [[s.next_indices() for _ in range(steps)] for s in samplers]


def _episode(rows):
    return np.searchsorted(BOUNDS[0], rows, side="right") - 1


@pytest.mark.parametrize("world", [1, 2, 3])
def test_an_epoch_is_every_sample_once_and_ranks_share_no_episode(world):
    sampler = _ranks(world)[0]
    draws = [sampler.draws(r, 0, 3 * N) for r in range(world)]
    for epoch in range(2):
        rows = np.concatenate([rows[epochs == epoch] for rows, epochs in draws])
        assert sorted(rows.tolist()) == list(range(N))
        owners = [set(_episode(rows[epochs == epoch]).tolist()) for rows, epochs in draws]
        assert sum(len(o) for o in owners) == len(LENGTHS)  # each episode on one rank
    lengths = [int((epochs <= 1).sum()) for _, epochs in draws]
    assert max(lengths) - min(lengths) <= 2 * LENGTHS.max()  # the ranks do not drift apart


def test_the_order_is_shuffled_within_and_across_episodes():
    rows, epochs = _ranks(1)[0].draws(0, 0, 2 * N)
    first, second = rows[epochs == 0], rows[epochs == 1]
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, np.sort(first))
    assert np.abs(np.diff(first)).max() > LENGTHS.max()  # not one episode after another


def test_drawable_indices_only():
    keep = np.flatnonzero(np.arange(N) % 3 != 0)
    rows, epochs = StreamSampler(BOUNDS, 4, 0, 1, seed=1, indices=keep).draws(0, 0, len(keep))
    assert sorted(rows.tolist()) == keep.tolist() and (epochs == 0).all()


def test_resume_on_the_same_world_is_sample_exact():
    straight = _steps(_ranks(2), 30)
    first = _ranks(2)
    _steps(first, 12)
    resumed = _steps(_ranks(2, saved=first[0].state_dict()), 18)
    for rank in range(2):
        np.testing.assert_array_equal(
            np.concatenate(resumed[rank]), np.concatenate(straight[rank][12:])
        )


@pytest.mark.parametrize(("old", "new"), [(2, 3), (2, 1), (3, 2)])
def test_resume_on_another_world_repeats_and_skips_nothing(old, new):
    before = _ranks(old)
    steps_before = 9
    _steps(before, steps_before)
    after = _ranks(new, saved=before[0].state_dict())
    assert after[0].samples_consumed == before[0].samples_consumed
    done = [before[0].draws(r, 0, 4 * steps_before) for r in range(old)]
    # Enough steps after the resume to finish the carried epoch and the next one.
    later = [after[0].draws(r, 0, 3 * N // new) for r in range(new)]
    carried = np.concatenate([d[0][d[1] == CARRY_EPOCH] for d in later])
    assert len(carried) and not np.isin(carried, np.concatenate([d[0] for d in done])).any()
    begun = max(int(d[1][-1]) for d in done)
    # The epochs begun before the resume, finished by the carry: each sample once per epoch.
    seen = np.concatenate([d[0][d[1] <= begun] for d in done] + [carried])
    assert sorted(seen.tolist()) == sorted(np.tile(np.arange(N), begun + 1).tolist())
    fresh = np.concatenate([d[0][d[1] == after[0].base_epoch] for d in later])
    assert sorted(fresh.tolist()) == list(range(N))
    # A carried piece is part of one episode, on one new rank.
    owners = [set(_episode(d[0][d[1] == CARRY_EPOCH]).tolist()) for d in later]
    assert sum(len(o) for o in owners) == len(set().union(*owners))


def test_a_second_world_change_continues_from_the_carry():
    first = _ranks(2)
    _steps(first, 7)
    second = _ranks(3, saved=first[0].state_dict())
    _steps(second, 2)  # still inside the carry
    third = _ranks(1, saved=second[0].state_dict())
    a = [first[0].draws(r, 0, 28) for r in range(2)]
    b = [second[0].draws(r, 0, 8) for r in range(3)]
    c = third[0].draws(0, 0, 2 * N)
    rows = np.concatenate([x[0] for x in a] + [x[0] for x in b] + [c[0][c[1] == CARRY_EPOCH]])
    assert sorted(rows.tolist()) == list(range(N))  # epoch 0 exactly once over three worlds


def test_another_dataset_or_seed_is_refused():
    saved = _ranks(1)[0].state_dict()
    other = StreamSampler(BOUNDS, 4, 0, 1, seed=4)
    with pytest.raises(ValueError, match="seed"):
        other.rebase(saved)
