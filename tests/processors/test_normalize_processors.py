"""LeRobot's processor pipelines: normalizer values and inverse, the other steps, the on-disk
format (step order, registry names, state files), overrides, exact reload."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from lerobot_pipe.constants import POLICY_POSTPROCESSOR_NAME, POLICY_PREPROCESSOR_NAME
from lerobot_pipe.policies import ACTConfig
from lerobot_pipe.policies.factory import make_pre_post_processors
from lerobot_pipe.processors import (
    NormalizerProcessorStep,
    PolicyProcessorPipeline,
    ProcessorError,
    UnnormalizerProcessorStep,
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
    pre = NormalizerProcessorStep(FEATURES, NORM_MAP, stats)
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
    pre = NormalizerProcessorStep(FEATURES, {"STATE": "IDENTITY"}, {})
    batch = make_batch()
    out = pre(batch)
    for key in FEATURES:
        assert out[key] is batch[key]


def test_zero_span_min_max_is_finite() -> None:
    features = {"observation.state": {"type": "STATE", "shape": [2]}}
    stats = {"observation.state": {"min": np.zeros(2), "max": np.array([0.0, 1.0])}}
    pre = NormalizerProcessorStep(features, {"STATE": "MIN_MAX"}, stats)
    out = pre({"observation.state": torch.zeros(1, 2)})["observation.state"]
    assert torch.isfinite(out).all()


def test_normalize_then_unnormalize_is_identity() -> None:
    stats = make_stats()
    for mode in ("MEAN_STD", "MIN_MAX"):
        norm_map = {"ACTION": mode}
        pre = NormalizerProcessorStep(FEATURES, norm_map, stats)
        post = UnnormalizerProcessorStep({"action": FEATURES["action"]}, norm_map, stats)
        action = make_batch()["action"]
        normalized = pre({"action": action})["action"]
        assert not torch.allclose(normalized, action)
        torch.testing.assert_close(
            post({"action": normalized})["action"], action, atol=1e-6, rtol=0
        )
    # LeRobot's arithmetic: MEAN_STD's inverse is x * std + mean (no eps).
    post = UnnormalizerProcessorStep({"action": FEATURES["action"]}, {"ACTION": "MEAN_STD"}, stats)
    s = torch.as_tensor(stats["action"]["std"], dtype=torch.float32)
    m = torch.as_tensor(stats["action"]["mean"], dtype=torch.float32)
    assert torch.equal(post({"action": torch.ones(2)})["action"], torch.ones(2) * s + m)


def test_missing_or_misshaped_stats() -> None:
    stats = make_stats()
    del stats["observation.state"]["std"]
    with pytest.raises(ValueError, match=r"'observation.state'.*missing \['std'\]"):
        NormalizerProcessorStep(FEATURES, NORM_MAP, stats)
    stats = make_stats()
    stats["action"]["mean"] = np.zeros(5)
    with pytest.raises(ValueError, match=r"stats\['action'\]\['mean'\] has shape \[5\]"):
        NormalizerProcessorStep(FEATURES, NORM_MAP, stats)
    with pytest.raises(ValueError, match="QUANTILES normalization .* needs stats"):
        NormalizerProcessorStep(FEATURES, {"STATE": "QUANTILES"}, make_stats())
    with pytest.raises(ValueError, match="'SOFTMAX' is invalid"):
        NormalizerProcessorStep(FEATURES, {"STATE": "SOFTMAX"}, make_stats())


def test_quantile_modes_map_the_quantiles_onto_minus_one_one() -> None:
    features = {"observation.state": {"type": "STATE", "shape": [2]}}
    stats = {
        "observation.state": {
            "q01": np.array([0.0, 1.0]),
            "q99": np.array([2.0, 5.0]),
            "q10": np.array([0.5, 2.0]),
            "q90": np.array([1.5, 4.0]),
        }
    }
    for mode, (low, high) in {"QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}.items():
        pre = NormalizerProcessorStep(features, {"STATE": mode}, stats)
        ends = torch.tensor(
            np.stack([stats["observation.state"][low], stats["observation.state"][high]]),
            dtype=torch.float32,
        )
        torch.testing.assert_close(
            pre({"observation.state": ends})["observation.state"],
            torch.tensor([[-1.0, -1.0], [1.0, 1.0]]),
        )


ACT_CFG = ACTConfig.tiny(
    input_features={k: v for k, v in FEATURES.items() if k != "action"},
    output_features={"action": FEATURES["action"]},
    normalization_mapping=NORM_MAP,
)


def test_make_pre_post_processors_builds_lerobots_default_pipelines() -> None:
    pre, post = make_pre_post_processors(ACT_CFG, dataset_stats=make_stats())
    assert [s.registry_name for s in pre.steps] == [
        "rename_observations_processor",
        "to_batch_processor",
        "device_processor",
        "normalizer_processor",
    ]
    assert [s.registry_name for s in post.steps] == ["unnormalizer_processor", "device_processor"]
    normalizer = pre.step("normalizer_processor")
    assert set(normalizer.features) == set(FEATURES)
    assert normalizer.norm_map == NORM_MAP
    assert set(post.step("unnormalizer_processor").features) == {"action"}
    # Statistics of every dataset feature are kept, as LeRobot stores them.
    assert "timestamp.mean" in normalizer.state_dict()


def test_call_conventions_observation_in_batch_out_action_tensor_in_out() -> None:
    pre, post = make_pre_post_processors(ACT_CFG, dataset_stats=make_stats())
    observation = {
        "observation.state": torch.randn(3),
        "observation.environment_state": torch.randn(4),
        "task": "reach",
    }
    batch = pre(observation)
    assert batch["observation.state"].shape == (1, 3) and batch["task"] == ["reach"]
    action = post(torch.zeros(1, 2))
    assert isinstance(action, torch.Tensor) and action.shape == (1, 2)
    mean = torch.as_tensor(make_stats()["action"]["mean"], dtype=torch.float32)
    torch.testing.assert_close(action[0], mean)


def _save(tmp_path: Path, seed: int = 0) -> tuple[PolicyProcessorPipeline, PolicyProcessorPipeline]:
    pre, post = make_pre_post_processors(ACT_CFG, dataset_stats=make_stats(seed))
    pre.save_pretrained(tmp_path)
    post.save_pretrained(tmp_path)
    return pre, post


def _load(tmp_path: Path, **kwargs):
    return make_pre_post_processors(ACT_CFG, pretrained_path=tmp_path, **kwargs)


def test_save_load_is_bit_exact_and_follows_lerobot_format(tmp_path: Path) -> None:
    pre, post = _save(tmp_path)

    pre_json = json.loads((tmp_path / f"{POLICY_PREPROCESSOR_NAME}.json").read_text())
    assert pre_json["name"] == POLICY_PREPROCESSOR_NAME
    steps = pre_json["steps"]
    assert [s["registry_name"] for s in steps] == [
        "rename_observations_processor",
        "to_batch_processor",
        "device_processor",
        "normalizer_processor",
    ]
    assert steps[0]["config"] == {"rename_map": {}}
    assert steps[2]["config"] == {"device": "cpu", "float_dtype": None}
    step = steps[3]
    assert step["state_file"] == "policy_preprocessor_step_3_normalizer_processor.safetensors"
    assert step["config"] == {"eps": 1e-8, "features": FEATURES, "norm_map": NORM_MAP}
    assert all("state_file" not in s for s in steps[:3])
    flat = load_file(tmp_path / step["state_file"])
    assert "observation.state.mean" in flat and "action.std" in flat and "timestamp.mean" in flat
    assert all(v.dtype == torch.float32 for v in flat.values())
    post_json = json.loads((tmp_path / f"{POLICY_POSTPROCESSOR_NAME}.json").read_text())
    assert [s["registry_name"] for s in post_json["steps"]] == [
        "unnormalizer_processor",
        "device_processor",
    ]
    assert (
        post_json["steps"][0]["state_file"]
        == "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    )

    pre2, post2 = _load(tmp_path)
    for original, loaded in ((pre, pre2), (post, post2)):
        a = original.steps[0 if original is post else 3]
        b = loaded.steps[0 if original is post else 3]
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype for k in sa)
        assert (a.features, a.norm_map, a.eps) == (b.features, b.norm_map, b.eps)
    batch = make_batch()
    for key, value in pre(batch).items():
        assert torch.equal(value, pre2(batch)[key])
    assert torch.equal(post(batch["action"]), post2(batch["action"]))


def test_resume_keeps_saved_stats(tmp_path: Path) -> None:
    """A resumed run uses the checkpoint's stats, not a changed dataset's (LeRobot #4022)."""
    pre, _ = _save(tmp_path, seed=0)
    loaded, _ = _load(tmp_path)
    other, _ = make_pre_post_processors(ACT_CFG, dataset_stats=make_stats(seed=1))
    batch = make_batch()
    assert torch.equal(loaded(batch)["action"], pre(batch)["action"])
    assert not torch.equal(loaded(batch)["action"], other(batch)["action"])


def test_overrides_are_lerobots(tmp_path: Path) -> None:
    """lerobot-eval / record / train pass overrides keyed by step name; stats given as an
    override win over the state file (fine-tuning on a new dataset)."""
    _save(tmp_path, seed=0)
    pre, post = _load(
        tmp_path,
        preprocessor_overrides={
            "device_processor": {"device": "cpu"},
            "rename_observations_processor": {
                "rename_map": {"observation.images.top": "observation.images.front"}
            },
            "normalizer_processor": {"stats": make_stats(seed=1)},
        },
    )
    fresh, _ = make_pre_post_processors(ACT_CFG, dataset_stats=make_stats(seed=1))
    batch = make_batch()
    assert torch.equal(pre(batch)["action"], fresh(batch)["action"])
    renamed = pre({"observation.images.top": torch.zeros(3, 4, 4), **make_batch()})
    assert "observation.images.front" in renamed and "observation.images.top" not in renamed
    with pytest.raises(ProcessorError, match="match no step"):
        _load(tmp_path, preprocessor_overrides={"tokenizer_processor": {}})


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"{POLICY_PREPROCESSOR_NAME}.json"):
        _load(tmp_path)
    _save(tmp_path)
    state_file = tmp_path / "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    state_file.unlink()
    with pytest.raises(FileNotFoundError, match=state_file.name):
        _load(tmp_path)


def test_loads_lerobot_pipelines_and_refuses_unknown_steps(tmp_path: Path) -> None:
    pre, _ = _save(tmp_path)
    path = tmp_path / f"{POLICY_PREPROCESSOR_NAME}.json"
    pipeline = json.loads(path.read_text())
    pipeline["steps"][2]["config"] = {"device": "cpu", "float_dtype": "float64"}
    path.write_text(json.dumps(pipeline))
    loaded, _ = _load(tmp_path)
    assert loaded(make_batch())["observation.state"].dtype == torch.float64
    # lerobot_pipe's earlier one-step pipeline still loads.
    only = {"name": POLICY_PREPROCESSOR_NAME, "steps": [pipeline["steps"][3]]}
    path.write_text(json.dumps(only))
    loaded, _ = _load(tmp_path)
    batch = make_batch()
    assert torch.equal(loaded(batch)["observation.state"], pre(batch)["observation.state"])
    pipeline["steps"][0] = {"registry_name": "action_tokenizer_processor", "config": {}}
    path.write_text(json.dumps(pipeline))
    with pytest.raises(ProcessorError, match="step 'action_tokenizer_processor' is not supported"):
        _load(tmp_path)
