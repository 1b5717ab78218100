"""A Hub dataset repository at one commit: the revision resolved to its sha once, at start, and
its ``meta/`` fetched at that commit, each request retried
(:func:`~lerobot_pipe.utils.hub_http.with_retries`) and failing with a
:class:`~lerobot_pipe.datasets.metadata.DatasetError` that says what to check."""

from __future__ import annotations

from pathlib import Path

from lerobot_pipe.constants import DATASET_INFO
from lerobot_pipe.datasets.metadata import DatasetError
from lerobot_pipe.utils.hub_http import redact, with_retries

META_PATTERNS = ["meta/**"]


def resolve_revision(
    repo_id: str,
    revision: str | None,
    *,
    repo_type: str = "dataset",
    endpoint: str | None = None,
    token: str | None = None,
) -> str:
    """The commit sha ``revision`` (a branch, tag, sha or None: the default branch) points at."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=token)
    try:
        info = with_retries(
            lambda: api.repo_info(repo_id, repo_type=repo_type, revision=revision),
            what=f"resolving revision {revision!r} of {repo_id}",
        )
    except Exception as exc:
        raise DatasetError(
            f"streaming dataset repo_id={repo_id!r} (revision={revision!r}): resolving the "
            f"revision failed: {type(exc).__name__}: {redact(str(exc)).rstrip('.')}. Check the "
            "repo_id, the revision, your network and HF_TOKEN."
        ) from exc
    if not info.sha:
        raise DatasetError(f"{repo_id}@{revision}: the Hub gave no commit sha for the revision")
    return info.sha


def fetch_metadata(
    repo_id: str,
    revision: str,
    folder: Path,
    *,
    repo_type: str = "dataset",
    endpoint: str | None = None,
    token: str | None = None,
) -> Path:
    """``meta/`` of the repo at commit ``revision`` into ``folder`` (which then holds
    ``meta/info.json``, ...); the folder."""
    from huggingface_hub import snapshot_download

    try:
        path = with_retries(
            lambda: snapshot_download(
                repo_id,
                repo_type=repo_type,
                revision=revision,
                local_dir=folder,
                allow_patterns=META_PATTERNS,
                endpoint=endpoint,
                token=token,
            ),
            what=f"fetching meta/ of {repo_id}",
        )
    except Exception as exc:
        raise DatasetError(
            f"streaming dataset {repo_id}@{revision[:12]}: fetching meta/ failed: "
            f"{type(exc).__name__}: {redact(str(exc)).rstrip('.')}. Check the repo_id, your "
            "network and HF_TOKEN."
        ) from exc
    path = Path(path)
    if not (path / DATASET_INFO).is_file():
        raise DatasetError(
            f"{repo_id}@{revision[:12]}: {DATASET_INFO} not found; the repository is not a "
            "LeRobot v3.0 dataset."
        )
    return path
