"""Publishing to the Hugging Face Hub: folders and checkpoints (:mod:`.publish`), which files go
(:mod:`.upload_files`), the errors a user can act on (:mod:`.errors`) and model cards
(:mod:`.model_card`).

The names below load :mod:`.publish` (huggingface_hub) on first use, so that importing the
package costs nothing until one of them is used."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ALLOW_PATTERNS": "upload_files",
    "PublishError": "errors",
    "PublishReceipt": "publish",
    "collect_publish_files": "upload_files",
    "publish_checkpoint": "publish",
    "publish_folder": "publish",
    "validate_repo_id": "publish",
    "make_model_card": "model_card",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
