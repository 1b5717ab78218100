"""Every on-disk name of the checkpoint, policy and dataset layouts, in one place.

The checkpoint layout follows LeRobot's so users' tools and habits carry over::

    <output_dir>/run.lock                   held (flock) by the training run's main process
    <output_dir>/checkpoints/
        005000/
            pretrained_model/
                config.json                 policy config (type + fields)
                train_config.json           the full resolved TrainConfig
                model.safetensors           full fp32 weights (or adapter_model.safetensors for PEFT)
                pytorch_model_fsdp_0/       DCP shards of the model (checkpoint_format dcp)
                policy_preprocessor.json    + policy_preprocessor_step_<i>_<name>.safetensors
                policy_postprocessor.json   + policy_postprocessor_step_<i>_<name>.safetensors
            pretrained_model_ema/           with --ema.enable=true: the EMA policy, the same files
                                            (its weights are the fp32 shadow a resume continues)
            training_state/
                optimizer_param_groups.json
                optimizer_state.safetensors (non-sharded) or optimizer_0/ (DCP shards)
                rng_state.safetensors       every rank's RNG state
                scheduler_state.json        only when the run has a scheduler
                scaler_state.json           only for fp16
                ema_state.json              with --ema.enable=true: the EMA's update count
                training_step.json          written LAST: its presence marks a complete checkpoint
        last -> 005000                      relative symlink, moved only to complete checkpoints
"""

CHECKPOINTS_DIR = "checkpoints"
LAST_CHECKPOINT_LINK = "last"
PRETRAINED_MODEL_DIR = "pretrained_model"
# LeRobot main's (after 0.6.1) loadable EMA policy beside pretrained_model/.
PRETRAINED_MODEL_EMA_DIR = "pretrained_model_ema"
TRAINING_STATE_DIR = "training_state"

CONFIG_NAME = "config.json"
TRAIN_CONFIG_NAME = "train_config.json"
MODEL_SAFETENSORS = "model.safetensors"
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
ADAPTER_CONFIG_NAME = "adapter_config.json"
MODEL_DCP_DIR = "pytorch_model_fsdp_0"

POLICY_PREPROCESSOR_NAME = "policy_preprocessor"
POLICY_POSTPROCESSOR_NAME = "policy_postprocessor"

OPTIMIZER_PARAM_GROUPS = "optimizer_param_groups.json"
OPTIMIZER_STATE = "optimizer_state.safetensors"
OPTIMIZER_DCP_DIR = "optimizer_0"
RNG_STATE = "rng_state.safetensors"
SCHEDULER_STATE = "scheduler_state.json"
SCALER_STATE = "scaler_state.json"
EMA_STATE = "ema_state.json"
# --dataset.streaming=true: the stream's position, carry and the dataset's commit sha.
STREAM_STATE = "stream_state.json"
# LeRobot main's EMA state (diffusers' EMAModel.state_dict(), torch.save'd): read with
# torch.load(weights_only=True) when resuming one of its runs, never written.
LEROBOT_EMA_STATE = "ema_state.pt"
# The Hub repository of a published EMA policy: <repo_id> + this suffix.
EMA_REPO_SUFFIX = "-ema"
TRAINING_STEP = "training_step.json"
# DCP's own name of the global metadata file of a DCP folder (a pickle: read only from this run's
# own output).
DCP_METADATA_FILE = ".metadata"

# Locked by the main process of the trainer that owns an output folder, for its whole life; it
# records the holder (host, pid, start time, command). lerobot_pipe/training/run_lock.py.
RUN_LOCK = "run.lock"

# Prefix of the temporary folder a checkpoint is written into before its atomic rename.
TMP_CHECKPOINT_PREFIX = ".tmp-"
# A complete checkpoint that retention (--checkpoint_keep_last) is deleting is first renamed to
# this prefix + its name, so a kill mid-delete never leaves a damaged complete-looking folder.
DELETING_CHECKPOINT_PREFIX = ".tmp-delete-"
# <output_dir>/pins/<step folder>.<reason>: checkpoints retention must keep (the pipeline's best
# checkpoint, one being evaluated or published). lerobot_pipe/checkpoint/pins.py.
PINS_DIR = "pins"

# Dataset v3.0 layout.
DATASET_INFO = "meta/info.json"
DATASET_STATS = "meta/stats.json"
DATASET_TASKS = "meta/tasks.parquet"
DATASET_EPISODES_GLOB = "meta/episodes/*/*.parquet"
DATASET_EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATASET_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATASET_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
DATASET_CODEBASE_VERSION = "v3.0"
# The parameters lerobot_pipe's synthetic dataset was generated with (LeRobot ignores the file).
DATASET_SYNTHETIC_PARAMS = "meta/synthetic.json"

# Beside the checkpoints: the training curve (one JSON object per logged step) and the progress
# events the pipeline's train job follows (lerobot_pipe/training/progress.py).
METRICS_LOG = "metrics.jsonl"
PROGRESS_EVENTS = "progress.jsonl"
# W&B's run folders (wandb.init(dir=<output_dir>)): <output_dir>/wandb/, and its link to the
# newest run, holding run-<id>.wandb (where LeRobot and lerobot_pipe read the id on resume).
WANDB_DIR = "wandb"
WANDB_LATEST_RUN = "latest-run"

# Rollout results: lerobot-eval's <output_dir>/eval_info.json and videos/<group>_<task_id>/;
# lerobot-train's in-training rollouts write the same under <output_dir>/eval/<step>/.
EVAL_DIR = "eval"
EVAL_INFO = "eval_info.json"
EVAL_VIDEOS_DIR = "videos"

# Pipeline receipts.
PUBLISH_RECEIPT = "publish_receipt.json"

# The batch key of each sample's random key (int64): the run's seed and the sample's position in
# the sampler's stream. Policies draw per-sample training randomness from it
# (lerobot_pipe/utils/random.py), image augmentations use the same key.
SAMPLE_KEY = "sample_key"

# Environment variables.
ENV_ALLOW_ACCELERATE = "LEROBOT_ALLOW_ACCELERATE_ENV"
ENV_FAULT_POINT = "LEROBOT_PIPE_FAULT_POINT"
ENV_FAULT_DELAY = "LEROBOT_PIPE_FAULT_DELAY"
ENV_FAULT_WAIT = "LEROBOT_PIPE_FAULT_WAIT"
ENV_META_BUILD = "LEROBOT_PIPE_META_BUILD"  # "0": sharded runs build the policy eagerly
