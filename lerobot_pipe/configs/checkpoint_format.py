"""``--checkpoint_format``: what a checkpoint holds of the model. Torch-free: the trackers and
the checkpoint layout read it without importing a policy."""

from __future__ import annotations

from enum import StrEnum


class CheckpointFormat(StrEnum):
    """What a checkpoint holds of the model (``--checkpoint_format``, LeRobot's docs). A str
    enum: train_config.json and training_step.json hold the same strings as before."""

    SAFETENSORS = "safetensors"  # one model.safetensors, gathered on the main rank
    DCP = "dcp"  # DCP shards only (pytorch_model_fsdp_0/), each rank writing its own
    SAFETENSORS_DCP = "safetensors_dcp"  # both

    @property
    def writes_safetensors(self) -> bool:
        return self in (CheckpointFormat.SAFETENSORS, CheckpointFormat.SAFETENSORS_DCP)

    @property
    def writes_dcp(self) -> bool:
        return self in (CheckpointFormat.DCP, CheckpointFormat.SAFETENSORS_DCP)
