"""What the flow-matching VLAs' configs (SmolVLA, pi0, pi0.5) share: their chunking checks, the
checks of their features (cameras, a 1-D state and action under the padded widths), fields
accepted at one value only, and LeRobot's AdamW / cosine-decay presets from the
``optimizer_*`` / ``scheduler_*`` fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lerobot_pipe.configs.optim import AdamWConfig, CosineDecayWithWarmupSchedulerConfig
from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.policies.pretrained import ACTION, OBS_IMAGES_PREFIX, OBS_STATE


@dataclass
class FlowMatchingConfig(PreTrainedConfig):
    """An intermediate base (no fields of its own, no policy type)."""

    def refuse_unbuilt(self, only: dict[str, tuple[Any, str]]) -> None:
        """Each field of ``only`` (name -> (its one supported value, why)) at that value."""
        for name, (supported, why) in only.items():
            if getattr(self, name) != supported:
                raise ValueError(
                    f"policy.{name}={getattr(self, name)!r} is not supported: {why} "
                    f"(leave it at {supported!r})"
                )

    def check_chunking(self) -> None:
        for name in ("chunk_size", "n_action_steps", "max_state_dim", "max_action_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)}")
        if self.n_action_steps > self.chunk_size:
            raise ValueError(
                f"n_action_steps ({self.n_action_steps}) must be <= chunk_size "
                f"({self.chunk_size}): each chunk predicts chunk_size actions"
            )
        if self.n_obs_steps != 1:
            raise ValueError(
                f"{self.type} sees one observation step, got n_obs_steps={self.n_obs_steps}"
            )
        if self.empty_cameras < 0:
            raise ValueError(f"empty_cameras must be >= 0, got {self.empty_cameras}")

    def check_vla_features(self) -> None:
        """At least one RGB camera; a 1-D state and action within the padded widths."""
        if not self.image_features:
            raise ValueError(
                f"{self.type} needs at least one camera ({OBS_IMAGES_PREFIX}<name>) among its "
                f"input_features, got {sorted(self.input_features)}"
            )
        for key, ft in self.image_features.items():
            if len(ft["shape"]) != 3 or ft["shape"][0] != 3:
                raise ValueError(f"{self.type} takes RGB frames: {key!r} has shape {ft['shape']}")
        state = self.input_features.get(OBS_STATE)
        if state is None:
            raise ValueError(f"{self.type} needs {OBS_STATE!r} among its input_features")
        for key, ft, limit in (
            (OBS_STATE, state, "max_state_dim"),
            (ACTION, self.action_feature, "max_action_dim"),
        ):
            if len(ft["shape"]) != 1 or ft["shape"][0] > getattr(self, limit):
                raise ValueError(
                    f"{key!r} must be 1-D with at most {limit}={getattr(self, limit)} values, "
                    f"got shape {ft['shape']}"
                )

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(self.chunk_size))

    def get_optimizer_preset(self) -> AdamWConfig:
        return AdamWConfig(
            lr=self.optimizer_lr,
            betas=list(self.optimizer_betas),
            eps=self.optimizer_eps,
            weight_decay=self.optimizer_weight_decay,
            grad_clip_norm=self.optimizer_grad_clip_norm,
        )

    def get_scheduler_preset(self) -> CosineDecayWithWarmupSchedulerConfig:
        return CosineDecayWithWarmupSchedulerConfig(
            num_warmup_steps=self.scheduler_warmup_steps,
            num_decay_steps=self.scheduler_decay_steps,
            peak_lr=self.optimizer_lr,
            decay_lr=self.scheduler_decay_lr,
        )
