"""Normalizer / unnormalizer processors: values, inverse, LeRobot file format, exact reload."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from lerobot_pipe.constants import POLICY_POSTPROCESSOR_NAME, POLICY_PREPROCESSOR_NAME
from lerobot_pipe.policies import ACTConfig
from lerobot_pipe.processors import (
    NormalizerProcessor,
    UnnormalizerProcessor,
    load_processors,
    make_pre_post_processors,
    save_processors,
)

FEATURES = {
    "observation.state": {"type": "STATE", "shape": [3]},
    "observation.environment_state": {"type": "ENV", "shape": [4]},
    "action": {"type": "ACTION", "shape": [2]},
}
NORM_MAP = {"STATE": "MEAN_STD", "ENV": "MIN_MAX", "ACTION": "MEAN_STD"}


def make_stats(seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    stats = {}
    for key, ft in FEATURES.items():
        dim = ft["shape"][0]
        low = rng.normal(size=dim)
        stats[key] = {
            "mean": rng.normal(size=dim),
            "std": rng.uniform(0.1, 3.0, size=dim),
            "min": low,
            "max": low + rng.uniform(0.5, 4.0, size=dim),
            "count": np.array([1000]),
        }
    stats["timestamp"] = {"mean": np.array([1.0]), "std": np.array([0.5])}
    return stats


def make_batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "observation.state": torch.randn(5, 3, generator=gen),
        "observation.environment_state": torch.randn(5, 4, generator=gen),
        "action": torch.randn(5, 10, 2, generator=gen),
        "action_is_pad": torch.zeros(5, 10, dtype=torch.bool),
        "index": torch.arange(5),
    }


def test_normalized_values() -> None:
    stats = make_stats()
    pre = NormalizerProcessor(FEATURES, NORM_MAP, stats)
    batch = make_batch()
    out = pre(batch)
    assert out is not batch
    assert out["action_is_pad"] is batch["action_is_pad"] and out["index"] is batch["index"]
    s = {
        k: {n: torch.as_tensor(v, dtype=torch.float32) for n, v in d.items()}
        for k, d in stats.items()
    }
    state = s["observation.state"]
    torch.testing.assert_close(
        out["observation.state"],
        (batch["observation.state"] - state["mean"]) / (state["std"] + 1e-8),
    )
    env = s["observation.environment_state"]
    torch.testing.assert_close(
        out["observation.environment_state"],
        2 * (batch["observation.environment_state"] - env["min"]) / (env["max"] - env["min"]) - 1,
    )
    act = s["action"]
    torch.testing.assert_close(out["action"], (batch["action"] - act["mean"]) / (act["std"] + 1e-8))
    # MIN_MAX maps [min, max] onto [-1, 1].
    ends = pre({"observation.environment_state": torch.stack([env["min"], env["max"]])})
    torch.testing.assert_close(
        ends["observation.environment_state"], torch.tensor([[-1.0] * 4, [1.0] * 4])
    )


def test_identity_and_unmapped_types_pass_through() -> None:
    pre = NormalizerProcessor(FEATURES, {"STATE": "IDENTITY"}, {})
    batch = make_batch()
    out = pre(batch)
    for key in FEATURES:
        assert out[key] is batch[key]


def test_zero_span_min_max_is_finite() -> None:
    features = {"observation.state": {"type": "STATE", "shape": [2]}}
    stats = {"observation.state": {"min": np.zeros(2), "max": np.array([0.0, 1.0])}}
    pre = NormalizerProcessor(features, {"STATE": "MIN_MAX"}, stats)
    out = pre({"observation.state": torch.zeros(1, 2)})["observation.state"]
    assert torch.isfinite(out).all()


def test_normalize_then_unnormalize_is_identity() -> None:
    stats = make_stats()
    for mode in ("MEAN_STD", "MIN_MAX"):
        norm_map = {"ACTION": mode}
        pre = NormalizerProcessor(FEATURES, norm_map, stats)
        post = UnnormalizerProcessor({"action": FEATURES["action"]}, norm_map, stats)
        action = make_batch()["action"]
        normalized = pre({"action": action})["action"]
        assert not torch.allclose(normalized, action)
        torch.testing.assert_close(
            post({"action": normalized})["action"], action, atol=1e-6, rtol=0
        )


def test_missing_or_misshaped_stats() -> None:
    stats = make_stats()
    del stats["observation.state"]["std"]
    with pytest.raises(ValueError, match=r"'observation.state'.*missing \['std'\]"):
        NormalizerProcessor(FEATURES, NORM_MAP, stats)
    stats = make_stats()
    stats["action"]["mean"] = np.zeros(5)
    with pytest.raises(ValueError, match=r"stats\['action'\]\['mean'\] has shape \[5\]"):
        NormalizerProcessor(FEATURES, NORM_MAP, stats)
    with pytest.raises(ValueError, match="QUANTILES"):
        NormalizerProcessor(FEATURES, {"STATE": "QUANTILES"}, make_stats())


def test_make_pre_post_processors() -> None:
    cfg = ACTConfig.tiny(
        input_features={k: v for k, v in FEATURES.items() if k != "action"},
        output_features={"action": FEATURES["action"]},
    )
    pre, post = make_pre_post_processors(cfg, make_stats())
    assert set(pre.features) == set(FEATURES)
    assert set(post.features) == {"action"}
    assert pre.norm_map == cfg.normalization_mapping
    assert pre.to("cpu") is pre


def test_save_load_is_bit_exact_and_follows_lerobot_format(tmp_path: Path) -> None:
    pre = NormalizerProcessor(FEATURES, NORM_MAP, make_stats())
    post = UnnormalizerProcessor({"action": FEATURES["action"]}, NORM_MAP, make_stats())
    save_processors(tmp_path, pre, post)

    pre_json = json.loads((tmp_path / f"{POLICY_PREPROCESSOR_NAME}.json").read_text())
    assert pre_json["name"] == POLICY_PREPROCESSOR_NAME
    (step,) = pre_json["steps"]
    assert step["registry_name"] == "normalizer_processor"
    assert step["state_file"] == "policy_preprocessor_step_0_normalizer_processor.safetensors"
    assert step["config"] == {"eps": 1e-8, "features": FEATURES, "norm_map": NORM_MAP}
    flat = load_file(tmp_path / step["state_file"])
    assert "observation.state.mean" in flat and "action.std" in flat
    assert not any(k.startswith("timestamp") for k in flat)
    post_json = json.loads((tmp_path / f"{POLICY_POSTPROCESSOR_NAME}.json").read_text())
    assert post_json["steps"][0]["registry_name"] == "unnormalizer_processor"
    assert (
        post_json["steps"][0]["state_file"]
        == "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    )

    pre2, post2 = load_processors(tmp_path)
    assert isinstance(pre2, NormalizerProcessor) and isinstance(post2, UnnormalizerProcessor)
    for original, loaded in ((pre, pre2), (post, post2)):
        a, b = original.state_dict(), loaded.state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
        assert (original.features, original.norm_map, original.eps) == (
            loaded.features,
            loaded.norm_map,
            loaded.eps,
        )
    batch = make_batch()
    for key, value in pre(batch).items():
        assert torch.equal(value, pre2(batch)[key])
    assert torch.equal(post(batch)["action"], post2(batch)["action"])


def test_resume_keeps_saved_stats(tmp_path: Path) -> None:
    """A resumed run uses the checkpoint's stats, not a changed dataset's (LeRobot #4022)."""
    pre = NormalizerProcessor(FEATURES, NORM_MAP, make_stats(seed=0))
    post = UnnormalizerProcessor({"action": FEATURES["action"]}, NORM_MAP, make_stats(seed=0))
    save_processors(tmp_path, pre, post)
    loaded, _ = load_processors(tmp_path)
    other = NormalizerProcessor(FEATURES, NORM_MAP, make_stats(seed=1))
    batch = make_batch()
    assert torch.equal(loaded(batch)["action"], pre(batch)["action"])
    assert not torch.equal(loaded(batch)["action"], other(batch)["action"])


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"{POLICY_PREPROCESSOR_NAME}.json"):
        load_processors(tmp_path)
    pre = NormalizerProcessor(FEATURES, NORM_MAP, make_stats())
    post = UnnormalizerProcessor({"action": FEATURES["action"]}, NORM_MAP, make_stats())
    save_processors(tmp_path, pre, post)
    state_file = tmp_path / "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    state_file.unlink()
    with pytest.raises(FileNotFoundError, match=state_file.name):
        load_processors(tmp_path)


def test_loads_lerobot_pipeline_with_extra_steps(tmp_path: Path) -> None:
    pre = NormalizerProcessor(FEATURES, NORM_MAP, make_stats())
    post = UnnormalizerProcessor({"action": FEATURES["action"]}, NORM_MAP, make_stats())
    save_processors(tmp_path, pre, post)
    state_file = "policy_preprocessor_step_3_normalizer_processor.safetensors"
    save_file(pre.state_dict(), tmp_path / state_file)
    pipeline = {
        "name": POLICY_PREPROCESSOR_NAME,
        "steps": [
            {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}},
            {"registry_name": "device_processor", "config": {"device": "cuda"}},
            {
                "registry_name": "normalizer_processor",
                "config": pre.get_config(),
                "state_file": state_file,
            },
        ],
    }
    path = tmp_path / f"{POLICY_PREPROCESSOR_NAME}.json"
    path.write_text(json.dumps(pipeline))
    loaded, _ = load_processors(tmp_path)
    batch = make_batch()
    assert torch.equal(loaded(batch)["observation.state"], pre(batch)["observation.state"])
    pipeline["steps"][0]["config"]["rename_map"] = {"a": "b"}
    path.write_text(json.dumps(pipeline))
    with pytest.raises(ValueError, match="renaming observations is not supported"):
        load_processors(tmp_path)
    pipeline["steps"][0] = {"registry_name": "tokenizer_processor", "config": {}}
    path.write_text(json.dumps(pipeline))
    with pytest.raises(ValueError, match="unsupported processor step 'tokenizer_processor'"):
        load_processors(tmp_path)
