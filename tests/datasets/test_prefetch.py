from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_pipe.configs.train import ImageTransformsConfig
from lerobot_pipe.constants import SAMPLE_KEY
from lerobot_pipe.datasets import BatchPrefetcher, GlobalBatchSampler, LeRobotDataset
from lerobot_pipe.datasets.transforms import sample_keys


def assert_same(got, expected) -> None:
    """Equal tensors, or equal lists (the ``task`` strings)."""
    if isinstance(expected, list):
        assert got == expected
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_prefetcher_matches_direct_loading(synthetic_root: Path, num_workers: int) -> None:
    ds = LeRobotDataset(synthetic_root, delta_timestamps={"action": [0.0, 0.1, 0.2]})
    reference = GlobalBatchSampler(len(ds), 16, 1, 2, seed=4)
    sampler = GlobalBatchSampler(len(ds), 16, 1, 2, seed=4)
    with BatchPrefetcher(ds, sampler, num_workers) as prefetcher:
        for step in range(12):
            batch = prefetcher.next()
            keys = sample_keys(4, reference.next_positions()).view(np.int64)
            expected = ds.get_batch(reference.next_indices())
            assert batch.keys() == expected.keys() | {SAMPLE_KEY}
            for key in expected:
                assert_same(batch[key], expected[key])
            np.testing.assert_array_equal(batch[SAMPLE_KEY].numpy(), keys)
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


def _camera_dataset(root: Path) -> LeRobotDataset:
    return LeRobotDataset(
        root,
        delta_timestamps={"observation.images.top": [-0.1, 0.0], "action": [0.0, 0.1]},
        image_transforms=ImageTransformsConfig(enable=True),
    )


def _run(ds: LeRobotDataset, sampler: GlobalBatchSampler, workers: int, steps: int) -> list:
    with BatchPrefetcher(ds, sampler, workers, device="cpu") as prefetcher:
        return [prefetcher.next() for _ in range(steps)]


def test_camera_batches_resume_exactly_with_augmentation(camera_root: Path) -> None:
    ds = _camera_dataset(camera_root)
    full = _run(ds, GlobalBatchSampler(len(ds), 6, 0, 1, seed=3), 2, 8)
    # Resume at step 5 from the sampler's state alone, with another worker count and a fresh
    # dataset (no decoder state carried over): the same frames and the same augmentations.
    sampler = GlobalBatchSampler(len(ds), 6, 0, 1, seed=3)
    first = _run(ds, sampler, 1, 5)
    state = sampler.state_dict()
    assert state["samples_consumed"] == 30
    resumed = _run(
        _camera_dataset(camera_root),
        GlobalBatchSampler(len(ds), 6, 0, 1, seed=3, start_sample=state["samples_consumed"]),
        0,
        3,
    )
    for expected, got in zip(full, first + resumed, strict=True):
        assert expected.keys() == got.keys()
        for key in expected:
            assert_same(got[key], expected[key])
    top = full[0]["observation.images.top"]
    assert top.dtype == torch.float32 and top.shape == (6, 2, 3, 64, 64)
    plain = LeRobotDataset(camera_root, delta_timestamps={"observation.images.top": [-0.1, 0.0]})
    indices = GlobalBatchSampler(len(ds), 6, 0, 1, seed=3).next_indices()
    assert not torch.equal(top, plain.get_batch(indices)["observation.images.top"])  # augmented


def test_camera_batches_split_across_ranks_as_one(camera_root: Path) -> None:
    """Two ranks decode only their half of each global batch; together they see what one
    process with the same global batch sees, augmentations included."""
    ds = _camera_dataset(camera_root)
    one = _run(ds, GlobalBatchSampler(len(ds), 8, 0, 1, seed=1), 2, 3)
    halves = [_run(ds, GlobalBatchSampler(len(ds), 4, r, 2, seed=1), 1, 3) for r in range(2)]
    for step, expected in enumerate(one):
        for key in expected:
            parts = [halves[0][step][key], halves[1][step][key]]
            joined = parts[0] + parts[1] if key == "task" else torch.cat(parts)
            assert_same(joined, expected[key])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_arrive_as_float_on_the_device(camera_root: Path) -> None:
    ds = _camera_dataset(camera_root)
    on_cpu = _run(ds, GlobalBatchSampler(len(ds), 6, 0, 1, seed=3), 1, 2)
    with BatchPrefetcher(ds, GlobalBatchSampler(len(ds), 6, 0, 1, seed=3), 2, device="cuda") as p:
        for expected in on_cpu:
            batch = p.next()
            for key, value in expected.items():
                assert batch[key].device.type == "cuda"
                torch.testing.assert_close(batch[key].cpu(), value, rtol=0, atol=1e-6)


CAMERA_SOURCES = ["torchcodec", "pyav", "image"]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("source", CAMERA_SOURCES)
def test_cameras_reach_the_policy_as_contiguous_nchw(
    camera_root: Path, image_root: Path, source: str, num_workers: int
) -> None:
    """The camera frames the policy's backbone convolves are contiguous NCHW on every backend:
    torchcodec's frames are a channels-last view of what it decodes, and on a CPU the
    convolutions run 12-18 % slower on them (issue 19, bench/bench_memory_format.py)."""
    from lerobot_pipe.policies.act import ACT_TINY_PRESET, ACTConfig
    from lerobot_pipe.policies.factory import make_policy, make_pre_post_processors

    cfg = ACTConfig(**{**ACT_TINY_PRESET, "pretrained_backbone_weights": None})
    fps = 10
    deltas = {"action": [i / fps for i in cfg.action_delta_indices]}
    if source == "image":
        ds = LeRobotDataset(image_root, delta_timestamps=deltas)
    else:
        ds = LeRobotDataset(camera_root, delta_timestamps=deltas, video_backend=source)
        assert ds.video_backend == source
    assert ds.fps == fps and len(ds.camera_keys) == 2
    # A window of frames too (Diffusion's observation steps), from a second dataset.
    windows = LeRobotDataset(
        image_root if source == "image" else camera_root,
        delta_timestamps={key: [-0.1, 0.0] for key in ds.camera_keys},
        video_backend=None if source == "image" else source,
    )
    assert windows.get_batch([0, 5, 7], raw_cameras=True)[ds.camera_keys[0]].is_contiguous()
    torch.manual_seed(0)
    policy = make_policy(cfg, ds.features)
    pre, _ = make_pre_post_processors(cfg, dataset_stats=ds.stats)
    seen: list[torch.Tensor] = []
    policy.model.backbone.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    sampler = GlobalBatchSampler(len(ds), 4, 0, 1, seed=2)
    with BatchPrefetcher(ds, sampler, num_workers) as prefetcher:
        for _ in range(2):
            batch = prefetcher.next()
            for key in ds.camera_keys:
                assert batch[key].shape == (4, 3, 64, 64) and batch[key].is_contiguous(), key
            policy(pre(batch))
    assert len(seen) == 2 and all(x.shape == (8, 3, 64, 64) and x.is_contiguous() for x in seen)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("source", CAMERA_SOURCES)
def test_cuda_camera_batches_are_contiguous_nchw(
    camera_root: Path, image_root: Path, source: str
) -> None:
    """On a GPU the frames travel as pinned uint8 and are finished there, in the same layout."""
    if source == "image":
        ds = LeRobotDataset(image_root)
    else:
        ds = LeRobotDataset(camera_root, video_backend=source)
    with BatchPrefetcher(ds, GlobalBatchSampler(len(ds), 4, 0, 1, seed=2), 1, device="cuda") as p:
        batch = p.next()
    for key in ds.camera_keys:
        assert batch[key].device.type == "cuda" and batch[key].is_contiguous(), key
