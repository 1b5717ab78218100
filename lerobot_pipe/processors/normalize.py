"""Normalization of policy inputs and targets, and unnormalization of predicted actions.

The steps are LeRobot's ``normalizer_processor`` and ``unnormalizer_processor``: the same
config (``eps``, ``features``, ``norm_map``), the same arithmetic and the same state file, which
holds the statistics of every dataset feature as flat float32 tensors ``"<feature>.<stat>"``
(``observation.state.mean``, ``index.q50``, ...), not only those of the features normalized.

Modes, per feature type (a type absent from ``norm_map`` is left unchanged):
MEAN_STD ``(x - mean) / (std + eps)``, inverse ``x * std + mean``; MIN_MAX
``2 (x - min) / (max - min) - 1``; QUANTILES / QUANTILE10 the same with q01/q99 or q10/q90
(a zero span counts as ``eps``); IDENTITY unchanged.

The statistics saved in a checkpoint are the ones a resumed run uses (never the dataset's again:
LeRobot bug #4022); they reload bit-exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lerobot_pipe.configs.types import ACTION, FEATURE_TYPES, NORMALIZATION_MODES
from lerobot_pipe.processors.pipeline import Batch, ProcessorError, ProcessorStep, register_step


class MissingStats(ProcessorError):
    """A feature the policy normalizes has no statistics for its mode (only those need them:
    a dataset may leave out features no policy input or output uses, as LeRobot allows)."""


_MODE_STATS = {
    "MEAN_STD": ("mean", "std"),
    "MIN_MAX": ("min", "max"),
    "QUANTILES": ("q01", "q99"),
    "QUANTILE10": ("q10", "q90"),
}


def _stat_to_tensor(value: Any, where: str) -> Tensor:
    if isinstance(value, Tensor):
        return value.detach().to("cpu", torch.float32).clone()
    try:
        array = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise ProcessorError(f"{where} is not numeric: {value!r}") from err
    return torch.from_numpy(array.copy())


class _NormalizationStep(ProcessorStep):
    """Per-feature affine maps built once from the statistics, cached per device and dtype."""

    inverse: bool

    def __init__(
        self,
        features: dict[str, dict],
        norm_map: dict[str, str],
        stats: dict[str, dict[str, Any]] | None = None,
        eps: float = 1e-8,
        normalize_observation_keys: list[str] | None = None,
        device: str | None = None,
    ) -> None:
        self.features = {
            k: {"type": ft["type"], "shape": list(ft["shape"])} for k, ft in features.items()
        }
        self.norm_map = dict(norm_map)
        self.eps = float(eps)
        self.normalize_observation_keys = (
            None if normalize_observation_keys is None else sorted(normalize_observation_keys)
        )
        self.device = device
        for feature_type, mode in self.norm_map.items():
            if feature_type not in FEATURE_TYPES or mode not in NORMALIZATION_MODES:
                raise ProcessorError(
                    f"{self.registry_name}: norm_map entry {feature_type!r}: {mode!r} is invalid; "
                    f"feature types are {FEATURE_TYPES}, modes {NORMALIZATION_MODES}"
                )
        # Statistics given explicitly (an override) win over a state file loaded afterwards.
        self._stats_given = bool(stats)
        self._set_stats(stats or {})

    def _set_stats(self, stats: dict[str, dict[str, Any]]) -> None:
        self.stats: dict[str, dict[str, Tensor]] = {
            key: {
                name: _stat_to_tensor(value, f"stats[{key!r}][{name!r}]")
                for name, value in feature_stats.items()
            }
            for key, feature_stats in stats.items()
        }
        # Built now when statistics are given (so missing ones fail at once), else on first use:
        # a pipeline read from disk gets its statistics from the state file after construction.
        self._cpu_affine = self._build_affine() if self.stats else None
        self._cache: dict[tuple[torch.device, torch.dtype], dict[str, tuple[Tensor, Tensor]]] = {}

    def _build_affine(self) -> dict[str, tuple[Tensor, Tensor]]:
        return {
            key: self._make_affine(key, ft)
            for key, ft in self.features.items()
            if self._applies_to(key, ft)
        }

    def _applies_to(self, key: str, ft: dict) -> bool:
        if self.norm_map.get(ft["type"], "IDENTITY") == "IDENTITY":
            return False
        if ft["type"] == "ACTION":
            return key == ACTION
        return self.normalize_observation_keys is None or key in self.normalize_observation_keys

    def _make_affine(self, key: str, ft: dict) -> tuple[Tensor, Tensor]:
        """(shift, scale) with ``normalized = (x - shift) / scale`` for the forward map."""
        mode = self.norm_map[ft["type"]]
        low_name, high_name = _MODE_STATS[mode]
        feature_stats = self.stats.get(key, {})
        missing = [n for n in (low_name, high_name) if n not in feature_stats]
        if missing:
            raise MissingStats(
                f"{mode} normalization of {key!r} needs stats [{low_name!r}, {high_name!r}]; "
                f"missing {missing} (have {sorted(feature_stats)})"
            )
        low, high = feature_stats[low_name], feature_stats[high_name]
        if ft["type"] == "VISUAL" and low.dim() == 1:  # (C,) camera stats broadcast over H, W
            low, high = low.reshape(-1, 1, 1), high.reshape(-1, 1, 1)
        for name, value in ((low_name, low), (high_name, high)):
            try:
                fits = torch.broadcast_shapes(value.shape, tuple(ft["shape"])) == tuple(ft["shape"])
            except RuntimeError:
                fits = False
            if not fits:
                raise ProcessorError(
                    f"stats[{key!r}][{name!r}] has shape {list(value.shape)}, which does not "
                    f"broadcast to the feature's shape {ft['shape']}"
                )
        if mode == "MEAN_STD":
            return low, high
        span = high - low
        return low, torch.where(span == 0, torch.full_like(span, self.eps), span)

    def _affine(self, like: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
        key = (like.device, like.dtype if like.is_floating_point() else torch.float32)
        if key not in self._cache:
            self._cache[key] = {
                k: (a.to(*key), b.to(*key)) for k, (a, b) in self._cpu_affine.items()
            }
        return self._cache[key]

    def __call__(self, batch: Batch) -> Batch:
        if self._cpu_affine is None:
            self._cpu_affine = self._build_affine()
        out = dict(batch)
        present = [k for k in self._cpu_affine if isinstance(out.get(k), Tensor)]
        if not present:
            return out
        affine = self._affine(out[present[0]])
        for key in present:
            mode = self.norm_map[self.features[key]["type"]]
            out[key] = self._transform(out[key], *affine[key], mode)
        return out

    def _transform(self, x: Tensor, low: Tensor, high: Tensor, mode: str) -> Tensor:
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "eps": self.eps,
            "features": self.features,
            "norm_map": self.norm_map,
        }
        if self.normalize_observation_keys is not None:
            config["normalize_observation_keys"] = self.normalize_observation_keys
        return config

    def state_dict(self) -> dict[str, Tensor]:
        return {
            f"{key}.{name}": value
            for key, feature_stats in self.stats.items()
            for name, value in feature_stats.items()
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if self._stats_given:
            return
        stats: dict[str, dict[str, Tensor]] = {}
        for flat_key, value in state.items():
            key, _, stat = flat_key.rpartition(".")
            stats.setdefault(key, {})[stat] = value
        self._set_stats(stats)


@register_step
class NormalizerProcessorStep(_NormalizationStep):
    """Normalizes ``observation.*`` inputs and the ``action`` target."""

    registry_name = "normalizer_processor"

    def _transform(self, x: Tensor, low: Tensor, high: Tensor, mode: str) -> Tensor:
        if mode == "MEAN_STD":
            return (x - low) / (high + self.eps)
        return 2 * (x - low) / high - 1


@register_step
class UnnormalizerProcessorStep(_NormalizationStep):
    """Maps the policy's normalized ``action`` outputs back to the dataset's units."""

    registry_name = "unnormalizer_processor"

    def _transform(self, x: Tensor, low: Tensor, high: Tensor, mode: str) -> Tensor:
        if mode == "MEAN_STD":
            return x * high + low
        return (x + 1) / 2 * high + low
