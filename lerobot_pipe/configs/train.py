"""The training configuration: nested dataclasses whose dotted paths are LeRobot's CLI flags.

``--policy.dim_model=64`` sets ``TrainConfig.policy.dim_model``; ``--accelerator.fsdp.wrap_modules``
sets ``TrainConfig.accelerator.fsdp.wrap_modules``. The config is written to every checkpoint as
``train_config.json`` and is the single source of truth for what the user asked for.

The fields are LeRobot 0.6.1's ``TrainPipelineConfig`` (same names, defaults and JSON), so
LeRobot's own decoder reads our train_config.json and we read theirs. Three top-level groups come
from LeRobot's current docs and no release yet: ``parallelism``, ``accelerator`` and
``checkpoint_format``. Fields marked ``OMIT_AT_DEFAULT`` are lerobot_pipe extensions that
LeRobot lacks; they are written only when set, so a run that uses none of them writes a file
LeRobot 0.6.1 decodes once the three documented groups are removed. Fields whose behaviour
lerobot_pipe does not build (simulation envs, reward models, W&B, HF Jobs, ...) are accepted and
kept at their defaults; a value that asks for the missing behaviour is refused before launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lerobot_pipe.configs.optim import OptimizerConfig, SchedulerConfig
from lerobot_pipe.policies.pretrained import PreTrainedConfig

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16")
CHECKPOINT_FORMATS = ("safetensors", "dcp", "safetensors_dcp")
PEFT_METHODS = ("LORA",)

# Metadata of extension fields: left out of train_config.json while they hold their default.
OMIT_AT_DEFAULT = {"omit_at_default": True}


def _default_image_transforms() -> dict[str, dict[str, Any]]:
    """LeRobot's ImageTransformsConfig.tfs defaults."""

    def jitter(name: str, low: float, high: float) -> dict[str, Any]:
        return {"weight": 1.0, "type": "ColorJitter", "kwargs": {name: [low, high]}}

    return {
        "brightness": jitter("brightness", 0.8, 1.2),
        "contrast": jitter("contrast", 0.8, 1.2),
        "saturation": jitter("saturation", 0.5, 1.5),
        "hue": jitter("hue", -0.05, 0.05),
        "sharpness": {
            "weight": 1.0,
            "type": "SharpnessJitter",
            "kwargs": {"sharpness": [0.5, 1.5]},
        },
        "affine": {
            "weight": 1.0,
            "type": "RandomAffine",
            "kwargs": {"degrees": [-5.0, 5.0], "translate": [0.05, 0.05]},
        },
    }


@dataclass
class ImageTransformsConfig:
    """Random camera-frame augmentations (LeRobot's names and defaults); off by default."""

    enable: bool = False
    max_num_transforms: int = 3
    random_order: bool = False
    tfs: dict[str, dict[str, Any]] = field(default_factory=_default_image_transforms)


@dataclass
class DatasetConfig:
    repo_id: str | None = None
    repo_type: str = "dataset"
    root: str | None = None
    episodes: list[int] | None = None
    image_transforms: ImageTransformsConfig = field(default_factory=ImageTransformsConfig)
    revision: str | None = None
    use_imagenet_stats: bool = True
    video_backend: str = "torchcodec"
    return_uint8: bool = False
    depth_output_unit: str = "mm"
    streaming: bool = False
    eval_split: float = 0.0


@dataclass
class ParallelismConfig:
    """Data-parallel degrees. ``dp_replicate`` replicas x ``dp_shard`` FSDP shards = world size.

    Unset on N processes means plain DDP (dp_replicate=N, dp_shard=1); ``-1`` takes every rank the
    other degree leaves. The values here are what the user asked for (nulls included); the degrees
    they resolve to on the launched world size are recorded in training_step.json, so a resume on
    another world size re-resolves.
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
    # lerobot_pipe's: trainable batch norms normalize by the statistics of the whole
    # data-parallel batch (lerobot_pipe/distributed/batch_norm.py).
    sync_batch_norm: bool = field(default=False, metadata=OMIT_AT_DEFAULT)


@dataclass
class PeftConfig:
    """LeRobot's PEFT fields (any ``--peft.*`` flag turns PEFT on); ``lora_dropout`` is ours."""

    target_modules: list[str] | str | None = None
    full_training_modules: list[str] | None = None
    method_type: str = "LORA"
    init_type: str | None = None
    r: int = 16
    lora_alpha: int | None = None
    lora_dropout: float = field(default=0.0, metadata=OMIT_AT_DEFAULT)


@dataclass
class EvalConfig:
    """Simulation-environment evaluation (LeRobot's; kept, not run here)."""

    n_episodes: int = 50
    batch_size: int = 0
    use_async_envs: bool = True
    recording: bool = False
    recording_repo_id: str | None = None
    recording_private: bool = False


@dataclass
class WandBConfig:
    """Weights & Biases logging (LeRobot's; only ``enable=false`` here: use ``--trackio.*``)."""

    enable: bool = False
    disable_artifact: bool = False
    project: str = "lerobot"
    entity: str | None = None
    notes: str | None = None
    run_id: str | None = None
    mode: str | None = None
    add_tags: bool = True


@dataclass
class JobConfig:
    """HF Jobs submission (LeRobot's; only local runs here)."""

    target: str | None = None
    image: str = "huggingface/lerobot-gpu:latest"
    timeout: str | None = "2d"
    detach: bool = False
    tags: list[str] = field(default_factory=list)


@dataclass
class TrackioConfig:
    enable: bool = False
    project: str = "lerobot"
    run_name: str | None = None


@dataclass
class TrainConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    env: dict[str, Any] | None = None
    policy: PreTrainedConfig | None = None
    reward_model: dict[str, Any] | None = None
    output_dir: str | None = None
    job_name: str | None = None
    resume: bool = False
    seed: int = 1000
    cudnn_deterministic: bool = False
    num_workers: int = 4
    batch_size: int = 8
    prefetch_factor: int = 4
    persistent_workers: bool = True
    dataloader_multiprocessing_context: str | None = "spawn"
    steps: int = 100_000
    env_eval_freq: int = 20_000
    log_freq: int = 200
    eval_steps: int = 0
    max_eval_samples: int = 0
    tolerance_s: float = 1e-4
    save_checkpoint: bool = True
    save_freq: int = 20_000
    use_policy_training_preset: bool = True
    optimizer: OptimizerConfig | None = None
    scheduler: SchedulerConfig | None = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    wandb: WandBConfig = field(default_factory=WandBConfig)
    peft: PeftConfig | None = None
    job: JobConfig = field(default_factory=JobConfig)
    save_checkpoint_to_hub: bool = False
    sample_weighting: dict[str, Any] | None = None
    rename_map: dict[str, str] = field(default_factory=dict)
    checkpoint_path: str | None = None
    # LeRobot's current docs (no release yet).
    checkpoint_format: str = "safetensors"
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    accelerator: AcceleratorConfig = field(default_factory=AcceleratorConfig)
    # lerobot_pipe's own.
    trackio: TrackioConfig = field(default_factory=TrackioConfig, metadata=OMIT_AT_DEFAULT)


# Top-level keys of train_config.json that LeRobot 0.6.1 does not know (its docs describe them).
DOCUMENTED_EXTENSION_KEYS = ("checkpoint_format", "parallelism", "accelerator")
