"""Publishing to the Hugging Face Hub: folders, checkpoints and model cards."""

from lerobot_pipe.hub.model_card import make_model_card
from lerobot_pipe.hub.publish import (
    ALLOW_PATTERNS,
    PublishError,
    PublishReceipt,
    collect_publish_files,
    publish_checkpoint,
    publish_folder,
    publish_from_main_process,
    validate_repo_id,
)

__all__ = [
    "ALLOW_PATTERNS",
    "PublishError",
    "PublishReceipt",
    "collect_publish_files",
    "make_model_card",
    "publish_checkpoint",
    "publish_folder",
    "publish_from_main_process",
    "validate_repo_id",
]
