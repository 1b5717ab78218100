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
lerobot_pipe does not build (reward models, HF Jobs, ...) are accepted and
kept at their defaults; a value that asks for the missing behaviour is refused before launch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from lerobot_pipe.configs import checks
from lerobot_pipe.configs.checkpoint_format import CheckpointFormat
from lerobot_pipe.configs.envs import EnvConfig
from lerobot_pipe.configs.optim import OptimizerConfig, SchedulerConfig
from lerobot_pipe.configs.parser import ConfigError
from lerobot_pipe.configs.policies import PreTrainedConfig

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16")
ACTIVATION_CHECKPOINTING_MODES = ("none", "full")
PEFT_METHODS = ("LORA",)

log = logging.getLogger(__name__)


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

    enable: bool = False  # augment the camera frames of the training batches
    max_num_transforms: int = 3  # at most this many of the transforms apply to one frame
    random_order: bool = False  # apply the chosen transforms in random order, not as listed
    # name -> {"weight", "type", "kwargs"}: the transforms to draw from (LeRobot's six by default)
    tfs: dict[str, dict[str, Any]] = field(default_factory=_default_image_transforms)


@dataclass
class DatasetConfig:
    """The LeRobot v3.0 dataset to train on: a local folder, a Hub repository, or both."""

    repo_id: str | None = None  # Hub dataset repo (namespace/name), downloaded when --root lacks it
    repo_type: str = "dataset"  # only "dataset" repositories are read
    root: str | None = None  # local dataset folder (meta/info.json, data/, videos/)
    episodes: list[int] | None = None  # train on these episode indices only (default: all)
    image_transforms: ImageTransformsConfig = field(default_factory=ImageTransformsConfig)
    revision: str | None = None  # Hub revision (branch, tag or commit) of --repo_id
    # replace the camera mean/std of the dataset's stats with ImageNet's (LeRobot's default)
    use_imagenet_stats: bool = True
    # video decoder: torchcodec or pyav (the other one is used when the first does not load)
    video_backend: str = "torchcodec"
    return_uint8: bool = False  # LeRobot's; not built here (frames are float32 in [0, 1])
    depth_output_unit: str = "mm"  # LeRobot's, for depth cameras; not read here
    # read --repo_id from the Hub as training consumes it (docs/streaming.md), no full download
    streaming: bool = False
    # --streaming: MiB of data and video files each rank keeps on disk (in --root or HF_HOME)
    streaming_cache_mb: float = field(default=2048.0, metadata=OMIT_AT_DEFAULT)
    # --streaming: samples each rank's stream is shuffled within (besides the episode order)
    streaming_shuffle_buffer: int = field(default=1000, metadata=OMIT_AT_DEFAULT)
    # share of each task's episodes held out (the last ones; training/heldout.py), in [0, 1)
    eval_split: float = 0.0

    def validate(self) -> None:
        if self.root is None and self.repo_id is None:
            raise ConfigError(
                "no dataset: pass --dataset.root=<folder> and/or --dataset.repo_id=<namespace/name>"
            )
        if self.streaming and self.repo_id is None:
            raise ConfigError(
                "--dataset.streaming=true reads a Hub dataset: pass --dataset.repo_id="
                "<namespace/name> (a local --dataset.root is read without streaming)"
            )
        if not self.streaming_cache_mb > 0:
            raise ConfigError(
                f"--dataset.streaming_cache_mb={self.streaming_cache_mb}: must be positive (MiB "
                "of files each rank keeps)"
            )
        checks.positive("dataset.streaming_shuffle_buffer", self.streaming_shuffle_buffer)
        if not 0.0 <= self.eval_split < 1.0:
            raise ConfigError(
                f"--dataset.eval_split={self.eval_split}: must be in [0, 1) (the share of each "
                "task's episodes held out; 0 holds none out)"
            )


@dataclass
class ParallelismConfig:
    """Data-parallel degrees. ``dp_replicate`` replicas x ``dp_shard`` FSDP shards = world size.

    Unset on N processes means plain DDP (dp_replicate=N, dp_shard=1); ``-1`` takes every rank the
    other degree leaves. The values here are what the user asked for (nulls included); the degrees
    they resolve to on the launched world size are recorded in training_step.json, so a resume on
    another world size re-resolves.
    """

    dp_replicate: int | None = None  # replicas (DDP, or HSDP's replicate axis); -1: what is left
    dp_shard: int | None = None  # FSDP2 shards per replica (> 1 shards the model); -1: what is left


@dataclass
class MixedPrecisionPolicyConfig:
    """FSDP2 MixedPrecisionPolicy fields. Setting any replaces the policy derived from
    ``accelerator.mixed_precision``."""

    param_dtype: str | None = None  # float32, bfloat16 or float16: parameters in forward/backward
    reduce_dtype: str | None = None  # dtype of the gradient reduce-scatter (default: param_dtype)
    output_dtype: str | None = None  # dtype the root module's outputs are cast to
    cast_forward_inputs: bool | None = None  # cast floating-point inputs to param_dtype

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
    """FSDP2 (``fully_shard``) options, used when ``--parallelism.dp_shard`` > 1."""

    reshard_after_forward: bool = True  # free gathered parameters after forward (less memory)
    # module class names that become FSDP2 units (default: the policy's _fsdp_wrap_modules)
    wrap_modules: list[str] | None = None
    # instead of wrap_modules: a module becomes a unit at this many parameters (bottom-up)
    min_num_params: int | None = None
    cpu_offload: bool = False  # keep parameters, gradients and optimizer state on the CPU
    ignored_modules: str | None = None  # regex of module names FSDP2 leaves unsharded
    mixed_precision_policy: MixedPrecisionPolicyConfig = field(
        default_factory=MixedPrecisionPolicyConfig
    )


@dataclass
class DDPConfig:
    """DistributedDataParallel options, used when the model is replicated, not sharded."""

    find_unused_parameters: bool = False  # for models whose forward skips some parameters
    gradient_as_bucket_view: bool = True  # gradients are views of DDP's buckets (less memory)
    static_graph: bool = False  # the same parameters are used on every step


@dataclass
class GradientAccumulationConfig:
    steps: int = 1  # loop steps (micro-batches) per optimizer update

    def validate(self) -> None:
        checks.positive("accelerator.gradient_accumulation.steps", self.steps)


@dataclass
class ActivationCheckpointingConfig:
    """LeRobot main's ``--accelerator.activation_checkpointing.*`` (main only refuses it):
    ``full`` recomputes each wrap unit's activations in the backward instead of keeping them
    (lerobot_pipe/distributed/activation_checkpointing.py)."""

    mode: str = "none"  # none, or full: recompute each wrap unit in the backward

    def validate(self) -> None:
        checks.choice(
            "accelerator.activation_checkpointing.mode", self.mode, ACTIVATION_CHECKPOINTING_MODES
        )


@dataclass
class AcceleratorConfig:
    """Precision, gradient accumulation and the DDP / FSDP2 options."""

    mixed_precision: str = "no"  # no, fp16 or bf16
    gradient_accumulation: GradientAccumulationConfig = field(
        default_factory=GradientAccumulationConfig
    )
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    # lerobot_pipe's: trainable batch norms normalize by the statistics of the whole
    # data-parallel batch (lerobot_pipe/distributed/batch_norm.py).
    sync_batch_norm: bool = field(default=False, metadata=OMIT_AT_DEFAULT)
    # LeRobot main's field, not 0.6.1's: left out of train_config.json at its default.
    activation_checkpointing: ActivationCheckpointingConfig = field(
        default_factory=ActivationCheckpointingConfig, metadata=OMIT_AT_DEFAULT
    )

    def validate(self) -> None:
        checks.choice("accelerator.mixed_precision", self.mixed_precision, MIXED_PRECISION_CHOICES)
        self.activation_checkpointing.validate()
        self.gradient_accumulation.validate()


@dataclass
class PeftConfig:
    """LeRobot's PEFT fields (any ``--peft.*`` flag turns PEFT on); ``lora_dropout`` is ours."""

    # module names that get LoRA adapters (default: the policy's _peft_target_modules)
    target_modules: list[str] | str | None = None
    full_training_modules: list[str] | None = None  # module names trained in full, not by LoRA
    method_type: str = "LORA"  # only LORA is built
    init_type: str | None = None  # LeRobot's adapter initialization name; not read here
    r: int = 16  # LoRA rank
    lora_alpha: int | None = None  # LoRA scaling numerator (default: r)
    lora_dropout: float = field(default=0.0, metadata=OMIT_AT_DEFAULT)  # dropout before LoRA

    def validate(self) -> None:
        checks.choice("peft.method_type", self.method_type, PEFT_METHODS)
        checks.positive("peft.r", self.r)
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"--peft.lora_dropout={self.lora_dropout}: must be in [0, 1)")


@dataclass
class EvalConfig:
    """Rollouts in ``--env`` every ``--env_eval_freq`` steps, on every rank
    (lerobot_pipe/evaluation/in_training.py)."""

    n_episodes: int = 50  # episodes per evaluation, split across the ranks
    # environments stepped together (a batch of episodes); 0: LeRobot's rule, 70 % of the CPU
    # cores (at least 1), at most n_episodes and 64
    batch_size: int = 0
    # sub-environments in their own processes (AsyncVectorEnv, forkserver) when batch_size > 1
    use_async_envs: bool = True
    recording: bool = False  # LeRobot's; not run here
    recording_repo_id: str | None = None  # LeRobot's; not run here
    recording_private: bool = False  # LeRobot's; not run here

    def validate(self) -> None:
        if self.n_episodes < 1:
            raise ConfigError(f"--eval.n_episodes={self.n_episodes}: at least 1")
        if self.batch_size < 0:
            raise ConfigError(f"--eval.batch_size={self.batch_size}: 0 (auto) or more")


@dataclass
class WandBConfig:
    """Weights & Biases logging, LeRobot's fields and meaning (``pip install 'lerobot_pipe[wandb]'``).

    The main process logs ``train/<metric>`` at every logged step and, unless
    ``disable_artifact``, each checkpoint's model files as a ``model`` artifact. The run folder is
    ``<output_dir>/wandb/``; a resumed run continues the W&B run it started (``run_id``, else the
    id in that folder)."""

    enable: bool = False  # log the training metrics (and checkpoints) to W&B
    disable_artifact: bool = False  # do not upload checkpoints as W&B artifacts
    project: str = "lerobot"  # W&B project
    entity: str | None = None  # W&B team or user (default: the key's default entity)
    notes: str | None = None  # a description of the run
    run_id: str | None = None  # continue this W&B run (default: the output folder's, on resume)
    # online, offline (written under <output_dir>/wandb, `wandb sync` later) or disabled;
    # unset: $WANDB_MODE, else online
    mode: str | None = None
    add_tags: bool = True  # tag the run with the policy type, seed and dataset


@dataclass
class JobConfig:
    """HF Jobs submission (LeRobot's; only local runs here)."""

    target: str | None = None  # must stay unset or "local": run under SLURM instead
    image: str = "huggingface/lerobot-gpu:latest"  # LeRobot's; not used here
    timeout: str | None = "2d"  # LeRobot's; not used here
    detach: bool = False  # LeRobot's; not used here
    tags: list[str] = field(default_factory=list)  # LeRobot's; not used here


@dataclass
class TrackioConfig:
    """Metrics to trackio (Hugging Face's offline-capable tracker), besides metrics.jsonl."""

    enable: bool = False  # log the training metrics to trackio (pip install trackio)
    project: str = "lerobot"  # trackio project
    run_name: str | None = None  # trackio run name (default: --job_name)


@dataclass
class EMAConfig:
    """An exponential moving average (EMA) of the policy's weights: LeRobot main's ``--ema.*``
    (after 0.6.1), diffusers' ``EMAModel`` rule, per optimizer update (not per micro-batch).
    The decay of update n is 0 while ``t = n - update_after_step - 1 <= 0`` (a copy), then
    ``1 - (1 + t / inv_gamma) ** -power`` clamped to ``[min_decay, max_decay]``, or the constant
    ``decay`` when set. lerobot_pipe/training/ema.py."""

    enable: bool = False  # keep the EMA shadow, checkpoint it, write pretrained_model_ema/
    decay: float | None = None  # a constant decay (openpi's pi0: 0.99); unset: the schedule
    update_after_step: int = 0  # optimizer updates during which the shadow copies the weights
    inv_gamma: float = 1.0  # the schedule's 1 / gamma
    power: float = 0.75  # the schedule's power
    min_decay: float = 0.0  # the schedule's lower bound
    max_decay: float = 0.9999  # the schedule's upper bound
    use_for_eval: bool = True  # evaluate the EMA weights (held-out loss: the live ones)

    def validate(self) -> None:
        """LeRobot main's checks (its EMAConfig.__post_init__), as one-line errors."""
        if not 0.0 <= self.min_decay <= self.max_decay <= 1.0:
            raise ConfigError(
                f"--ema.min_decay={self.min_decay} --ema.max_decay={self.max_decay}: need "
                "0 <= min_decay <= max_decay <= 1"
            )
        checks.positive("ema.inv_gamma", self.inv_gamma)
        checks.positive("ema.power", self.power)
        checks.non_negative("ema.update_after_step", self.update_after_step)
        if self.decay is None:
            return
        if not 0.0 <= self.decay <= 1.0:
            raise ConfigError(f"--ema.decay={self.decay}: must be in [0, 1]")
        defaults = EMAConfig()
        if (self.min_decay, self.max_decay) != (defaults.min_decay, defaults.max_decay):
            raise ConfigError(
                f"--ema.decay={self.decay} (a constant decay) and --ema.min_decay / "
                "--ema.max_decay (the schedule's bounds) exclude each other: set one or the other"
            )


@dataclass
class TrainConfig:
    """Train a LeRobot policy on one process or many (DDP, FSDP2, HSDP); every input is checked
    before a process group starts.

    Checkpoints go to ``<output_dir>/checkpoints/<step>/`` in LeRobot's layout; running the same
    command again with ``--resume=true`` continues from the newest complete one, on any number
    of processes."""

    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    # the simulated environment rolled out every --env_eval_freq steps (--env.type=pusht|aloha|
    # synthetic, then --env.<field>); unset: no rollouts
    env: EnvConfig | None = None
    # the policy to train: --policy.type for a new one, --policy.path to fine-tune
    policy: PreTrainedConfig | None = None
    reward_model: dict[str, Any] | None = None  # LeRobot's; not built here
    # run folder (default: outputs/train/<date>/<time>_<job_name or policy type>)
    output_dir: str | None = None
    job_name: str | None = None  # run name (plain, no '/')
    # continue from --config_path's checkpoint, else the newest complete one of --output_dir
    resume: bool = False
    seed: int = 1000  # model initialization and data order; each rank adds its rank after init
    cudnn_deterministic: bool = False  # deterministic cuDNN kernels (slower)
    num_workers: int = 4  # threads preparing batches ahead of the loop (0: inline)
    batch_size: int = 8  # samples per rank and loop step
    prefetch_factor: int = 4  # LeRobot's DataLoader option; not used here
    persistent_workers: bool = True  # LeRobot's DataLoader option; not used here
    dataloader_multiprocessing_context: str | None = "spawn"  # LeRobot's; not used here
    steps: int = 100_000  # loop steps (micro-batches per rank) to train for in all
    env_eval_freq: int = 20_000  # roll out --env every this many loop steps (0: never)
    log_freq: int = 200  # log the loss and throughput every this many loop steps
    eval_steps: int = 0  # the held-out loss every this many loop steps (0: never)
    max_eval_samples: int = 0  # cap on the held-out frames evaluated, split over tasks (0: all)
    tolerance_s: float = 1e-4  # how far a camera frame's timestamp may be from the one asked for
    save_checkpoint: bool = True  # write checkpoints
    save_freq: int = 20_000  # checkpoint every this many loop steps (0: the final step only)
    # train with the policy's optimizer and scheduler presets (LeRobot's rule)
    use_policy_training_preset: bool = True
    # the optimizer (default: the policy's preset)
    optimizer: OptimizerConfig | None = None
    # the learning-rate schedule (default: the policy's preset; none: a constant lr)
    scheduler: SchedulerConfig | None = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    wandb: WandBConfig = field(default_factory=WandBConfig)
    # LoRA fine-tuning of --policy.path (unset: train every weight)
    peft: PeftConfig | None = None
    job: JobConfig = field(default_factory=JobConfig)
    save_checkpoint_to_hub: bool = False  # LeRobot's; use the pipeline's publish stage instead
    sample_weighting: dict[str, Any] | None = None  # LeRobot's; not built here
    # dataset key -> the key the pretrained policy expects (with --policy.path)
    rename_map: dict[str, str] = field(default_factory=dict)
    checkpoint_path: str | None = None  # LeRobot's; set by LeRobot's own resume, not read here
    # safetensors (one file, gathered), dcp (shards) or safetensors_dcp (both); LeRobot's docs
    checkpoint_format: CheckpointFormat = CheckpointFormat.SAFETENSORS
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)  # LeRobot's docs
    accelerator: AcceleratorConfig = field(default_factory=AcceleratorConfig)  # LeRobot's docs
    trackio: TrackioConfig = field(default_factory=TrackioConfig, metadata=OMIT_AT_DEFAULT)
    # Write checkpoints in the background: the loop stalls only to copy the state to CPU memory.
    checkpoint_async: bool = field(default=False, metadata=OMIT_AT_DEFAULT)
    # Keep only the newest N complete checkpoints (and the one `last` points to); 0 keeps all.
    checkpoint_keep_last: int = field(default=0, metadata=OMIT_AT_DEFAULT)
    # End this launch after this loop step, with a checkpoint there (0: at --steps). The
    # learning-rate schedule and everything else still follow --steps, the run's total: a later
    # launch resumes from that checkpoint exactly. The pipeline's training segments use it; it is
    # not written into the checkpoint's train_config.json.
    stop_after_step: int = field(default=0, metadata=OMIT_AT_DEFAULT)
    # EMA of the weights (LeRobot main's --ema.*, after 0.6.1): written only when changed.
    ema: EMAConfig = field(default_factory=EMAConfig, metadata=OMIT_AT_DEFAULT)

    def validate(self) -> None:
        """Each section's own checks, then the rules between sections (this is the one place
        they live). Only the config is read: what needs the installed code, the Hub or the
        machine is checked by lerobot_pipe/training/config_checks.py."""
        if self.policy is None:
            raise ConfigError(
                "no policy: pass --policy.type=act (or --policy.path=<pretrained folder or repo id>)"
            )
        self.dataset.validate()
        checks.positive("steps", self.steps)
        checks.positive("batch_size", self.batch_size)
        checks.positive("log_freq", self.log_freq)
        checks.non_negative("save_freq", self.save_freq, "0 saves only the final step")
        checks.non_negative(
            "checkpoint_keep_last", self.checkpoint_keep_last, "0 keeps every checkpoint"
        )
        checks.non_negative("num_workers", self.num_workers)
        checks.non_negative("stop_after_step", self.stop_after_step, "0 stops at --steps")
        checks.non_negative("seed", self.seed)
        self.accelerator.validate()
        _refuse_unbuilt(self)
        _check_env_eval(self)
        _check_accumulation(self)
        _check_fine_tuning(self)
        self.ema.validate()
        _check_heldout(self)
        if self.job_name is not None and ("/" in self.job_name or self.job_name.startswith(".")):
            raise ConfigError(
                f"--job_name={self.job_name!r}: must be a plain name (no '/', not starting with '.')"
            )


def _check_accumulation(cfg: TrainConfig) -> None:
    ga = cfg.accelerator.gradient_accumulation.steps
    if cfg.save_freq % ga:
        raise ConfigError(
            f"--save_freq={cfg.save_freq} must be a multiple of "
            f"--accelerator.gradient_accumulation.steps={ga} so checkpoints fall on optimizer updates"
        )
    if cfg.steps % ga:
        raise ConfigError(
            f"--steps={cfg.steps} must be a multiple of --accelerator.gradient_accumulation.steps={ga} "
            "(--steps counts micro-batches; the last one must end an optimizer update)"
        )


def _check_fine_tuning(cfg: TrainConfig) -> None:
    """--peft.* and --rename_map adapt a pretrained policy: they need --policy.path."""
    if cfg.peft is not None:
        cfg.peft.validate()
        if not cfg.policy.pretrained_path:
            raise ConfigError(
                "--peft.* fine-tunes a pretrained policy: pass --policy.path=<base policy>"
            )
        if cfg.policy.use_peft and not cfg.resume:
            raise ConfigError(
                f"--policy.path={cfg.policy.pretrained_path} holds LoRA adapters already: continue "
                "that run with --resume=true, or drop --peft.* to fine-tune the merged policy"
            )
    if cfg.rename_map and not cfg.policy.pretrained_path:
        raise ConfigError(
            "--rename_map renames a dataset's keys onto those a pretrained policy expects: it "
            "needs --policy.path (a fresh policy takes its feature names from the dataset)"
        )


def _check_heldout(cfg: TrainConfig) -> None:
    """LeRobot 0.6.1's checks of the held-out loss's flags (its TrainPipelineConfig
    ``__post_init__``), plus negative values refused as typos."""
    checks.non_negative("eval_steps", cfg.eval_steps, "0 never evaluates")
    checks.non_negative(
        "max_eval_samples", cfg.max_eval_samples, "0 evaluates every held-out frame"
    )
    if cfg.eval_steps > 0 and cfg.dataset.eval_split == 0.0:
        raise ConfigError(
            f"--eval_steps={cfg.eval_steps} evaluates on held-out episodes: it needs "
            "--dataset.eval_split > 0 (e.g. 0.1 holds out the last tenth of each task's episodes)"
        )


def _check_env_eval(cfg: TrainConfig) -> None:
    """``--env_eval_freq`` with ``--env.*`` (evaluation/in_training.py). A batch larger than the
    episodes is cut to them (LeRobot 0.6.1's EvalConfig rule); an environment that would never be
    rolled out is refused as a mistake."""
    checks.non_negative("env_eval_freq", cfg.env_eval_freq, "0 never evaluates")
    if cfg.env is None:
        return
    if cfg.env_eval_freq == 0:
        raise ConfigError(
            f"--env.type={cfg.env.type} is rolled out every --env_eval_freq steps, and "
            "--env_eval_freq=0 never does: pass --env_eval_freq=N, or leave --env.* out"
        )
    cfg.eval.validate()
    if cfg.env_eval_freq > cfg.steps:
        log.warning(
            "--env_eval_freq=%d is more than --steps=%d: --env.type=%s is never rolled out",
            cfg.env_eval_freq,
            cfg.steps,
            cfg.env.type,
        )


def _refuse_unbuilt(cfg: TrainConfig) -> None:
    """LeRobot fields whose behaviour lerobot_pipe does not build: their defaults are accepted
    (and kept in train_config.json); a value asking for the missing behaviour is refused."""
    unbuilt = [
        (
            "eval.recording",
            cfg.env is not None and cfg.eval.recording,
            "recording the rollouts as a dataset is not built",
        ),
        ("reward_model", cfg.reward_model is not None, "reward-model training is not built"),
        ("sample_weighting", cfg.sample_weighting is not None, "sample weighting is not built"),
        (
            "job.target",
            cfg.job.target not in (None, "local"),
            "HF Jobs submission is not built; "
            "run the pipeline under SLURM (workflow/profiles/slurm) instead",
        ),
        (
            "dataset.repo_type",
            cfg.dataset.repo_type != "dataset",
            "only dataset repositories (repo_type=dataset) are read",
        ),
        (
            "save_checkpoint_to_hub",
            cfg.save_checkpoint_to_hub,
            "push checkpoints with the "
            "pipeline's publish stage (publish.steps: all) or lerobot-convert-dcp --push_to_hub",
        ),
    ]
    for flag, asked, why in unbuilt:
        if asked:
            raise ConfigError(f"--{flag}: {why}")


# Top-level keys of train_config.json that LeRobot 0.6.1 does not know (its docs describe them).
DOCUMENTED_EXTENSION_KEYS = ("checkpoint_format", "parallelism", "accelerator")
