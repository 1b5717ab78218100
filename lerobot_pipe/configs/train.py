"""The training configuration: nested dataclasses whose dotted paths are LeRobot's CLI flags.

``--policy.dim_model=64`` sets ``TrainConfig.policy.dim_model``; ``--accelerator.fsdp.wrap_modules``
sets ``TrainConfig.accelerator.fsdp.wrap_modules``. The whole resolved config is written to every
checkpoint as ``train_config.json`` and is the single source of truth for what ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lerobot_pipe.policies.pretrained import PreTrainedConfig

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16")
CHECKPOINT_FORMATS = ("safetensors", "dcp", "safetensors_dcp")
SCHEDULER_TYPES = ("cosine_decay_with_warmup", "constant_with_warmup")
OPTIMIZER_TYPES = ("adamw", "adam", "sgd")
PEFT_METHODS = ("LORA",)


@dataclass
class DatasetConfig:
    repo_id: str | None = None
    root: str | None = None
    revision: str | None = None
    episodes: list[int] | None = None


@dataclass
class OptimizerConfig:
    """Unset ``lr`` / ``weight_decay`` take the policy's preset (LeRobot's use_policy_training_preset)."""

    type: str = "adamw"
    lr: float | None = None
    weight_decay: float | None = None
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    grad_clip_norm: float = 10.0


@dataclass
class SchedulerConfig:
    """No scheduler unless ``type`` is set. The scheduler steps once per loop step."""

    type: str | None = None
    num_warmup_steps: int = 0
    num_decay_steps: int | None = None
    decay_lr: float = 0.0


@dataclass
class ParallelismConfig:
    """Data-parallel degrees. ``dp_replicate`` replicas x ``dp_shard`` FSDP shards = world size.

    Unset on N processes means plain DDP (dp_replicate=N, dp_shard=1); ``-1`` takes every rank the
    other degree leaves. The values here are what the user asked for; the resolved degrees are
    recorded beside them (``TrainConfig.resolved``), so a resume on another world size re-resolves.
    """

    dp_replicate: int | None = None
    dp_shard: int | None = None


@dataclass
class MixedPrecisionPolicyConfig:
    """FSDP2 MixedPrecisionPolicy fields. Setting any replaces the policy derived from
    ``accelerator.mixed_precision``."""

    param_dtype: str | None = None
    reduce_dtype: str | None = None
    output_dtype: str | None = None
    cast_forward_inputs: bool | None = None

    def is_set(self) -> bool:
        return any(
            v is not None
            for v in (
                self.param_dtype,
                self.reduce_dtype,
                self.output_dtype,
                self.cast_forward_inputs,
            )
        )


@dataclass
class FSDPConfig:
    reshard_after_forward: bool = True
    wrap_modules: list[str] | None = None
    min_num_params: int | None = None
    cpu_offload: bool = False
    ignored_modules: str | None = None
    mixed_precision_policy: MixedPrecisionPolicyConfig = field(
        default_factory=MixedPrecisionPolicyConfig
    )


@dataclass
class DDPConfig:
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = True
    static_graph: bool = False


@dataclass
class GradientAccumulationConfig:
    steps: int = 1


@dataclass
class AcceleratorConfig:
    mixed_precision: str = "no"
    gradient_accumulation: GradientAccumulationConfig = field(
        default_factory=GradientAccumulationConfig
    )
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)


@dataclass
class PeftConfig:
    method_type: str | None = None
    r: int = 16
    lora_alpha: int | None = None
    lora_dropout: float = 0.0
    target_modules: list[str] | None = None
    full_training_modules: list[str] | None = None


@dataclass
class TrackioConfig:
    enable: bool = False
    project: str = "lerobot"
    run_name: str | None = None


@dataclass
class TrainConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    policy: PreTrainedConfig | None = None
    output_dir: str | None = None
    job_name: str | None = None
    resume: bool = False
    seed: int = 1000
    num_workers: int = 4
    batch_size: int = 8
    steps: int = 100_000
    log_freq: int = 200
    save_checkpoint: bool = True
    save_freq: int = 20_000
    checkpoint_format: str = "safetensors"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    accelerator: AcceleratorConfig = field(default_factory=AcceleratorConfig)
    peft: PeftConfig = field(default_factory=PeftConfig)
    trackio: TrackioConfig = field(default_factory=TrackioConfig)
    # Filled at startup, recorded in train_config.json, ignored when a config is loaded back.
    resolved: dict[str, Any] | None = None
