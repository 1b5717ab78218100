"""Which files of a local folder are published, and the check that none of them holds a token.

A file is published when its name matches one of the allow patterns (:data:`ALLOW_PATTERNS` by
default) and it is not denied: hidden files and folders, resumable training state, DCP shards and
the pipeline's receipts are never uploaded, whatever the patterns say.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from lerobot_pipe import constants as C
from lerobot_pipe.hub.errors import PublishError

ALLOW_PATTERNS = ["*.safetensors", "*.json", "*.yaml", "*.md"]
# Never uploaded, whatever ALLOW_PATTERNS says: resumable training state, DCP shards, receipts.
DENY_DIRS = frozenset({C.TRAINING_STATE_DIR, C.OPTIMIZER_DCP_DIR, C.MODEL_DCP_DIR})
DENY_NAMES = frozenset(
    {
        C.DCP_METADATA_FILE,
        C.OPTIMIZER_STATE,
        C.OPTIMIZER_PARAM_GROUPS,
        C.RNG_STATE,
        C.SCHEDULER_STATE,
        C.SCALER_STATE,
        C.TRAINING_STEP,
        C.PUBLISH_RECEIPT,
    }
)
DENY_SUFFIXES = (".distcp",)
# Text files scanned for a leaked token before upload.
_TEXT_SUFFIXES = (".json", ".yaml", ".yml", ".md", ".txt")


def _is_publishable(rel_parts: tuple[str, ...], allow_patterns: list[str]) -> bool:
    name = rel_parts[-1]
    if any(p.startswith(".") for p in rel_parts) or any(p in DENY_DIRS for p in rel_parts[:-1]):
        return False
    if name in DENY_NAMES or name.endswith(DENY_SUFFIXES):
        return False
    return any(fnmatch.fnmatch(name, pattern) for pattern in allow_patterns)


def collect_publish_files(
    folder: str | os.PathLike[str], allow_patterns: list[str] | None = None
) -> list[str]:
    """Relative POSIX paths of the files of ``folder`` that ``publish_folder`` would upload.

    A file is kept when its name matches one of ``allow_patterns`` (default ``ALLOW_PATTERNS``)
    and it is not denied: hidden files/folders, ``training_state/``, DCP shard folders,
    ``*.distcp``, ``.metadata``, optimizer/RNG/scheduler state files and pipeline receipts.
    """
    root = Path(folder)
    patterns = list(ALLOW_PATTERNS if allow_patterns is None else allow_patterns)
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in DENY_DIRS)
        for name in filenames:
            rel = (rel_dir / name).as_posix()
            if (
                _is_publishable(tuple(rel.split("/")), patterns)
                and (Path(dirpath) / name).is_file()
            ):
                out.append(rel)
    return sorted(out)


def check_no_token_in_files(files: dict[str, Path | bytes], secrets: list[str]) -> None:
    """PublishError when a text file among ``files`` (repo path -> local file or bytes) contains
    one of ``secrets``."""
    for repo_path, source in files.items():
        if not repo_path.endswith(_TEXT_SUFFIXES):
            continue
        data = source if isinstance(source, bytes) else source.read_bytes()
        if any(secret.encode() in data for secret in secrets):
            raise PublishError(
                f"refusing to publish {repo_path}: it contains your Hugging Face token; "
                "remove it from the file (and rotate the token if it was shared)"
            )
