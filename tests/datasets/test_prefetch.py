from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_pipe.datasets import BatchPrefetcher, GlobalBatchSampler, LeRobotDataset


@pytest.mark.parametrize("num_workers", [0, 2])
def test_prefetcher_matches_direct_loading(synthetic_root: Path, num_workers: int) -> None:
    ds = LeRobotDataset(synthetic_root, delta_timestamps={"action": [0.0, 0.1, 0.2]})
    reference = GlobalBatchSampler(len(ds), 16, 1, 2, seed=4)
    sampler = GlobalBatchSampler(len(ds), 16, 1, 2, seed=4)
    with BatchPrefetcher(ds, sampler, num_workers) as prefetcher:
        for step in range(12):
            batch = prefetcher.next()
            expected = ds.get_batch(reference.next_indices())
            assert batch.keys() == expected.keys()
            for key in batch:
                torch.testing.assert_close(batch[key], expected[key])
            # The sampler counts batches handed out, not those prepared ahead.
            assert sampler.samples_consumed == (step + 1) * 32
    prefetcher.close()  # idempotent


def test_prefetch_errors_reach_the_caller(synthetic_root: Path) -> None:
    class Broken(LeRobotDataset):
        def get_batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
            raise OSError("disk gone")

    ds = Broken(synthetic_root)
    prefetcher = BatchPrefetcher(ds, GlobalBatchSampler(len(ds), 4, 0, 1, seed=0), 1)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="prefetch thread failed") as excinfo:
            prefetcher.next()
        assert isinstance(excinfo.value.__cause__, OSError)
    prefetcher.close()
    with pytest.raises(RuntimeError, match="after close"):
        prefetcher.next()
