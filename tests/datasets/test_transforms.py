"""Image transforms: LeRobot's configuration, torchvision's kernels, draws keyed per sample."""

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_pipe.datasets import transforms as T
from lerobot_pipe.datasets.synthetic import _rollout, render


def _frames(n: int = 8, seed: int = 1) -> np.ndarray:
    """Float32 (n, 3, 64, 64) frames in [0, 1]: half rendered scenes, half noise."""
    columns, goals = _rollout(1, n, 10, seed)
    scene = render("top", columns["observation.state"], np.repeat(goals, n, axis=0), 64)
    frames = scene.transpose(0, 3, 1, 2).astype(np.float32) / 255
    frames[: n // 2] = np.random.default_rng(seed).uniform(0, 1, frames[: n // 2].shape)
    return frames.astype(np.float32)


def _enabled(**kwargs) -> T.ImageTransforms:
    return T.ImageTransforms(T.ImageTransformsConfig(enable=True, **kwargs))


@pytest.mark.interop
def test_kernels_match_torchvision(upstream: Callable, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    frames = _frames()
    n = len(frames)
    params = {
        "brightness": rng.uniform(0.8, 1.2, n),
        "contrast": rng.uniform(0.8, 1.2, n),
        "saturation": rng.uniform(0.5, 1.5, n),
        "hue": rng.uniform(-0.05, 0.05, n),
        "sharpness": rng.uniform(0.5, 1.5, n),
        "angle": rng.uniform(-5, 5, n),
        "dx": np.round(rng.uniform(-3.2, 3.2, n)),
        "dy": np.round(rng.uniform(-3.2, 3.2, n)),
    }
    np.savez(tmp_path / "in.npz", frames=frames, **params)
    upstream(
        "upstream_transforms.py", tmp_path / "in.npz", tmp_path / "out.npz", tmp_path / "d.json"
    )
    reference = np.load(tmp_path / "out.npz")
    x = torch.from_numpy(frames)

    def factor(name: str) -> torch.Tensor:
        return torch.as_tensor(params[name], dtype=torch.float32).reshape(-1, 1, 1, 1)

    ours = {
        "brightness": T.adjust_brightness(x.clone(), factor("brightness")),
        "contrast": T.adjust_contrast(x, factor("contrast")),
        "saturation": T.adjust_saturation(x, factor("saturation")),
        "hue": T.adjust_hue(x, factor("hue")),
        "sharpness": T.adjust_sharpness(x, factor("sharpness")),
        "affine": T.affine(x, params["angle"], np.stack([params["dx"], params["dy"]], axis=1)),
    }
    for name, value in ours.items():
        np.testing.assert_allclose(value.numpy(), reference[name], rtol=0, atol=1e-5, err_msg=name)
    # The configuration's names and defaults are LeRobot's.
    lerobot_defaults = json.loads((tmp_path / "d.json").read_text())
    assert json.loads(json.dumps(dataclasses.asdict(T.ImageTransformsConfig()))) == lerobot_defaults


def test_disabled_by_default_and_identity() -> None:
    x = torch.from_numpy(_frames())
    transforms = T.ImageTransforms(T.ImageTransformsConfig())
    assert not transforms.enabled
    assert transforms(x, np.arange(len(x)), 0) is x


def test_draws_are_a_function_of_the_key_and_shared_by_a_window() -> None:
    transforms = _enabled()
    frames = torch.from_numpy(_frames())
    window = torch.stack([frames, frames], dim=1)  # (B, T=2, C, H, W), identical frames
    keys = T.sample_keys(7, np.arange(100, 108))
    a = transforms(window, keys, stream=0)
    b = transforms(window.clone(), keys, stream=0)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a[:, 0], a[:, 1], rtol=0, atol=0)  # one draw per sample
    assert not torch.equal(a, window)
    other_camera = transforms(window, keys, stream=1)
    other_seed = transforms(window, T.sample_keys(8, np.arange(100, 108)), stream=0)
    for other in (other_camera, other_seed):
        differs = [not torch.equal(other[i], a[i]) for i in range(len(a))]
        assert sum(differs) >= 6
    # A sample's draw does not depend on the batch it is in.
    torch.testing.assert_close(transforms(window[3:5], keys[3:5], stream=0), a[3:5])


def test_subsets_follow_weights_and_size() -> None:
    tfs = T.ImageTransformsConfig().tfs
    tfs["hue"]["weight"] = 0.0  # never drawn
    tfs["brightness"]["weight"] = 3.0
    transforms = _enabled(tfs=tfs, max_num_transforms=2)
    assert transforms.names == ["brightness", "contrast", "saturation", "sharpness", "affine"]
    u = T.uniforms(np.arange(20000, dtype=np.uint64), 0, len(transforms.names))
    rank = np.log(u) / transforms.weights
    picked = np.argsort(-rank, axis=1)[:, :2]
    counts = Counter(picked.ravel().tolist())
    share = np.array([counts[i] for i in range(5)]) / picked.size
    assert share[0] > 1.5 * share[1:].max()  # weight 3 vs 1 each
    assert np.all(picked[:, 0] != picked[:, 1])
    # Every transform applies on its own without error, window or not.
    frames = torch.from_numpy(_frames())
    for name in transforms.names:
        only = {k: {**v, "weight": float(k == name)} for k, v in tfs.items()}
        out = _enabled(tfs=only, max_num_transforms=1)(frames, np.arange(8), 0)
        assert out.shape == frames.shape and out.min() >= 0 and out.max() <= 1
        assert not torch.equal(out, frames), name


@pytest.mark.parametrize(
    ("tfs", "match"),
    [
        ({"noise": T.ImageTransformConfig(type="GaussianNoise")}, r"tfs\.noise\.type='Gaussian"),
        (
            {"b": T.ImageTransformConfig(type="ColorJitter", kwargs={"brightness": -1})},
            "non-negative",
        ),
        (
            {"a": T.ImageTransformConfig(type="RandomAffine", kwargs={"scale": [0.9, 1.1]})},
            r"\['scale'\] are not supported",
        ),
    ],
)
def test_unsupported_configurations_are_refused(tfs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _enabled(tfs=tfs)


def test_the_train_config_section_from_flags_works_the_same() -> None:
    """--dataset.image_transforms.* flags give the section the dataset applies."""
    from lerobot_pipe.configs.loading import parse_train_config

    cfg, _ = parse_train_config(
        ["--dataset.image_transforms.enable=true", "--dataset.image_transforms.random_order=true"]
    )
    frames = torch.from_numpy(_frames())
    keys = np.arange(len(frames))
    expected = _enabled(random_order=True)(frames, keys, 0)
    section = cfg.dataset.image_transforms
    torch.testing.assert_close(T.ImageTransforms(section)(frames, keys, 0), expected)
