"""Normalization of policy inputs and targets, and unnormalization of predicted actions.

Saved as LeRobot's processor pipelines: ``policy_preprocessor.json`` with a
``normalizer_processor`` step and ``policy_postprocessor.json`` with an
``unnormalizer_processor`` step, each step's statistics in a safetensors state file with
flat keys ``"<feature>.<stat>"`` (e.g. ``observation.state.mean``), stored as float32.

The statistics saved in a checkpoint are the ones a resumed run must use (never the
dataset's again: LeRobot bug #4022); ``load_processors`` restores them bit-exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from lerobot_pipe.constants import POLICY_POSTPROCESSOR_NAME, POLICY_PREPROCESSOR_NAME
from lerobot_pipe.policies.pretrained import FEATURE_TYPES, NORMALIZATION_MODES, PreTrainedConfig

# Steps of LeRobot-written pipelines that change nothing here: batching and device
# placement are the trainer's job. A rename step is accepted only with an empty rename map.
_NO_OP_STEPS = ("to_batch_processor", "device_processor")
_RENAME_STEP = "rename_observations_processor"

_P = TypeVar("_P", bound="_StatsProcessor")

_REQUIRED_STATS = {"MEAN_STD": ("mean", "std"), "MIN_MAX": ("min", "max")}


def _stat_to_tensor(value: Any, where: str) -> Tensor:
    if isinstance(value, Tensor):
        return value.detach().to("cpu", torch.float32).clone()
    try:
        array = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where} is not numeric: {value!r}") from err
    return torch.from_numpy(array.copy())


class _StatsProcessor:
    """Per-feature affine maps ``(x - shift) / scale`` built once from dataset statistics."""

    registry_name: ClassVar[str]

    def __init__(
        self,
        features: dict[str, dict],
        norm_map: dict[str, str],
        stats: dict[str, dict[str, Any]],
        eps: float = 1e-8,
    ) -> None:
        self.features = {
            k: {"type": ft["type"], "shape": list(ft["shape"])} for k, ft in features.items()
        }
        self.norm_map = dict(norm_map)
        self.eps = float(eps)
        for feature_type, mode in self.norm_map.items():
            if feature_type not in FEATURE_TYPES or mode not in NORMALIZATION_MODES:
                raise ValueError(
                    f"norm_map entry {feature_type!r}: {mode!r} is invalid; feature types are "
                    f"{FEATURE_TYPES}, modes {NORMALIZATION_MODES}"
                )
        # Float32 CPU copies of the statistics of our features: what gets saved.
        self.stats: dict[str, dict[str, Tensor]] = {}
        # feature -> (shift, scale) on the processor's device.
        self._affine: dict[str, tuple[Tensor, Tensor]] = {}
        for key, ft in self.features.items():
            if key in stats:
                self.stats[key] = {
                    name: _stat_to_tensor(value, f"stats[{key!r}][{name!r}]")
                    for name, value in stats[key].items()
                }
            mode = self.norm_map.get(ft["type"], "IDENTITY")
            if mode != "IDENTITY":
                self._affine[key] = self._make_affine(key, ft["shape"], mode)

    def _make_affine(self, key: str, shape: list[int], mode: str) -> tuple[Tensor, Tensor]:
        feature_stats = self.stats.get(key, {})
        missing = [name for name in _REQUIRED_STATS[mode] if name not in feature_stats]
        if missing:
            raise ValueError(
                f"{mode} normalization of {key!r} needs stats {list(_REQUIRED_STATS[mode])}; "
                f"missing {missing} (have {sorted(feature_stats)})"
            )
        for name in _REQUIRED_STATS[mode]:
            stat_shape = tuple(feature_stats[name].shape)
            try:
                fits = torch.broadcast_shapes(stat_shape, tuple(shape)) == tuple(shape)
            except RuntimeError:
                fits = False
            if not fits:
                raise ValueError(
                    f"stats[{key!r}][{name!r}] has shape {list(stat_shape)}, which does not "
                    f"broadcast to the feature's shape {shape}"
                )
        if mode == "MEAN_STD":
            return feature_stats["mean"], feature_stats["std"] + self.eps
        low, high = feature_stats["min"], feature_stats["max"]
        span = high - low
        span = torch.where(span == 0, torch.full_like(span, self.eps), span)
        # 2 * (x - low) / span - 1 == (x - (low + span / 2)) / (span / 2)
        return low + span / 2, span / 2

    def to(self, device: str | torch.device) -> Self:
        """Move the precomputed tensors to ``device`` (the saved statistics stay on CPU)."""
        self._affine = {
            key: (shift.to(device), scale.to(device))
            for key, (shift, scale) in self._affine.items()
        }
        return self

    def _apply(self, x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
        raise NotImplementedError

    def __call__(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """A new dict with our features transformed; other keys are passed through untouched."""
        out = dict(batch)
        for key, (shift, scale) in self._affine.items():
            if key in out:
                out[key] = self._apply(out[key], shift, scale)
        return out

    def get_config(self) -> dict[str, Any]:
        return {"eps": self.eps, "features": self.features, "norm_map": self.norm_map}

    def state_dict(self) -> dict[str, Tensor]:
        """Flat ``"<feature>.<stat>"`` statistics (float32, CPU)."""
        return {
            f"{key}.{name}": value
            for key, feature_stats in self.stats.items()
            for name, value in feature_stats.items()
        }


class NormalizerProcessor(_StatsProcessor):
    """Normalizes ``observation.*`` inputs and the ``action`` target.

    MEAN_STD: ``(x - mean) / (std + eps)``; MIN_MAX: ``2 * (x - min) / (max - min) - 1``
    (a zero span counts as ``eps``); IDENTITY, or a feature type absent from ``norm_map``:
    unchanged.
    """

    registry_name = "normalizer_processor"

    def _apply(self, x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
        return (x - shift) / scale


class UnnormalizerProcessor(_StatsProcessor):
    """The exact inverse of NormalizerProcessor, for the policy's ``action`` outputs."""

    registry_name = "unnormalizer_processor"

    def _apply(self, x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
        return x * scale + shift


def make_pre_post_processors(
    policy_cfg: PreTrainedConfig, dataset_stats: dict
) -> tuple[NormalizerProcessor, UnnormalizerProcessor]:
    """The preprocessor (inputs and action target) and postprocessor (actions) of a policy,
    from a dataset's ``meta/stats.json`` content."""
    pre = NormalizerProcessor(
        {**policy_cfg.input_features, **policy_cfg.output_features},
        policy_cfg.normalization_mapping,
        dataset_stats,
    )
    post = UnnormalizerProcessor(
        policy_cfg.output_features, policy_cfg.normalization_mapping, dataset_stats
    )
    return pre, post


def _save_pipeline(directory: Path, name: str, step: _StatsProcessor) -> None:
    state_file = f"{name}_step_0_{step.registry_name}.safetensors"
    save_file(step.state_dict(), str(directory / state_file))
    pipeline = {
        "name": name,
        "steps": [
            {
                "registry_name": step.registry_name,
                "config": step.get_config(),
                "state_file": state_file,
            }
        ],
    }
    (directory / f"{name}.json").write_text(json.dumps(pipeline, indent=4) + "\n")


def save_processors(
    directory: str | Path, pre: NormalizerProcessor, post: UnnormalizerProcessor
) -> None:
    """Write policy_preprocessor.json, policy_postprocessor.json and their state files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _save_pipeline(directory, POLICY_PREPROCESSOR_NAME, pre)
    _save_pipeline(directory, POLICY_POSTPROCESSOR_NAME, post)


def _load_pipeline(directory: Path, name: str, cls: type[_P]) -> _P:
    path = directory / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"processor file {path} not found")
    pipeline = json.loads(path.read_text())
    ours = []
    for step in pipeline.get("steps", []):
        registry_name = step.get("registry_name")
        if registry_name == cls.registry_name:
            ours.append(step)
        elif registry_name == _RENAME_STEP and step.get("config", {}).get("rename_map"):
            raise ValueError(f"{path}: renaming observations is not supported ({step['config']})")
        elif registry_name not in (*_NO_OP_STEPS, _RENAME_STEP):
            raise ValueError(f"{path}: unsupported processor step {registry_name!r}")
    if len(ours) != 1:
        raise ValueError(
            f"{path} must hold exactly one {cls.registry_name!r} step, found {len(ours)}"
        )
    step = ours[0]
    config = step.get("config", {})
    unknown = sorted(set(config) - {"eps", "features", "norm_map"})
    missing = sorted({"features", "norm_map"} - set(config))
    if unknown or missing:
        raise ValueError(
            f"{path}: the {cls.registry_name!r} config has unknown keys {unknown} "
            f"and lacks keys {missing}"
        )
    stats: dict[str, dict[str, Tensor]] = {}
    if "state_file" in step:
        state_path = directory / step["state_file"]
        if not state_path.is_file():
            raise FileNotFoundError(
                f"processor state file {state_path} (named in {path}) not found"
            )
        for flat_key, value in load_file(str(state_path)).items():
            key, _, stat = flat_key.rpartition(".")
            stats.setdefault(key, {})[stat] = value
    return cls(config["features"], config["norm_map"], stats, eps=config.get("eps", 1e-8))


def load_processors(directory: str | Path) -> tuple[NormalizerProcessor, UnnormalizerProcessor]:
    """Read the processors save_processors wrote (or LeRobot's, for these steps)."""
    directory = Path(directory)
    return (
        _load_pipeline(directory, POLICY_PREPROCESSOR_NAME, NormalizerProcessor),
        _load_pipeline(directory, POLICY_POSTPROCESSOR_NAME, UnnormalizerProcessor),
    )
