"""Publish trained policies (and dataset folders) to the Hugging Face Hub.

``publish_folder`` creates the repo (``exist_ok``) and commits the allow-listed files of a folder
(``ALLOW_PATTERNS``; never DCP shards, ``training_state/`` or optimizer state) in ONE
``HfApi.create_commit``, optionally with a model card as the root ``README.md``, then optionally
tags that commit. ``publish_checkpoint`` does this for a checkpoint's ``pretrained_model/``.

What huggingface_hub (2.x) does, and this module relies on:

* Idempotence: ``create_commit`` asks the Hub for the oid of every file it is given (preupload)
  and leaves out the unchanged ones; when none is left it sends no commit and returns the head.
  Remote files that no longer exist locally are left in place.
* Retries of the preupload and of LFS transfers (``http_backoff``: HTTP 408/429/5xx, timeouts and
  network errors, 5 retries 1-8 s apart).

What it adds:

* Bounded retries of the requests huggingface_hub sends only once (create repo, head lookup, the
  commit request itself, tags), through :func:`lerobot_pipe.utils.hub_http.with_retries`
  (``max_retries``, ``backoff_s``). A retried commit whose first answer was lost is not
  duplicated: ``create_commit`` finds the files already there.
* Errors that say what to do (``PublishError``, :mod:`.errors`): 401 (``HF_TOKEN`` /
  ``hf auth login``), 403, 404, and no network (the cause, e.g. name resolution or connection
  refused, and the host).
* Tags: an existing tag on the published commit is fine; an existing tag on another commit is fine
  too when that commit holds the same published files (re-publishing an old checkpoint); otherwise
  ``PublishError`` unless ``move_tag=True``, which moves the tag to the new commit.
* Token: ``token`` argument, else huggingface_hub's usual sources (``HF_TOKEN``, stored login).
  It is never written to files, logs, receipts or model cards, and is redacted from error
  messages. Text files that contain it are refused.

The endpoint is per call (``endpoint=``), default huggingface_hub's (``HF_ENDPOINT``). Local files
are only read.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import CommitInfo, CommitOperationAdd, HfApi, RepoFile
from huggingface_hub.errors import HfHubHTTPError

from lerobot_pipe import __version__
from lerobot_pipe import constants as C
from lerobot_pipe.fsutil import write_json_atomic
from lerobot_pipe.hub.errors import PublishError, Target, retrying
from lerobot_pipe.hub.upload_files import (
    ALLOW_PATTERNS,
    check_no_token_in_files,
    collect_publish_files,
)
from lerobot_pipe.utils.hub_http import known_secrets
from lerobot_pipe.utils.locate import (
    checkpoint_step_dir,
    ema_policy_dir,
    holds_policy_files,
    pretrained_dir,
)
from lerobot_pipe.utils.repo_id import repo_id_problem

logger = logging.getLogger(__name__)

_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_REPO_TYPES = ("model", "dataset", "space")
_PATHS_INFO_BATCH = 200


@dataclass
class PublishReceipt:
    repo_id: str
    repo_type: str
    revision: str
    commit_id: str
    commit_url: str | None
    created_commit: bool
    files: list[str]
    path_in_repo: str
    tag: str | None
    # The EMA policy's receipt (pretrained_model_ema/, pushed to <repo_id>-ema), when published.
    ema: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        if record["ema"] is None:
            del record["ema"]
        return record

    def write(self, path: Path) -> None:
        """Write the receipt as JSON, atomically (the pipeline's publish rule keeps it)."""
        write_json_atomic(path, self.to_json())


# ---------------------------------------------------------------------------- validation
def validate_repo_id(repo_id: str) -> str:
    """``repo_id`` unchanged when it is ``namespace/name`` with the Hub's allowed characters
    (:func:`~lerobot_pipe.utils.repo_id.repo_id_problem`), else PublishError saying why."""
    problem = repo_id_problem(repo_id)
    if problem:
        raise PublishError(problem)
    return repo_id


def _normalize_path_in_repo(path_in_repo: str) -> str:
    path = (path_in_repo or "").strip()
    if "\\" in path or path.startswith("/"):
        raise PublishError(f"invalid path_in_repo {path_in_repo!r}: use a relative POSIX path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise PublishError(f"invalid path_in_repo {path_in_repo!r}: '..' is not allowed")
    return "/".join(parts)


def _validate_tag(tag: str) -> str:
    if not _TAG_RE.match(tag) or ".." in tag:
        raise PublishError(f"invalid tag {tag!r}: use letters, digits, '-', '_' and '.'")
    return tag


# ---------------------------------------------------------------------------- publishing
def _same_files(target: Target, sha_a: str, sha_b: str, paths: list[str]) -> bool:
    """Whether commits ``sha_a`` and ``sha_b`` hold the same blobs at ``paths``."""

    def blobs(sha: str) -> set[tuple[str, str]]:
        return {
            (entry.path, entry.blob_id)
            for i in range(0, len(paths), _PATHS_INFO_BATCH)
            for entry in target.api.get_paths_info(
                target.repo_id,
                paths[i : i + _PATHS_INFO_BATCH],
                revision=sha,
                repo_type=target.repo_type,
            )
            if isinstance(entry, RepoFile)
        }

    return blobs(sha_a) == blobs(sha_b)


def _tag(target: Target, tag: str, commit_id: str, paths: list[str], move_tag: bool) -> None:
    api, repo_id, repo_type = target.api, target.repo_id, target.repo_type
    try:
        api.create_tag(repo_id, tag=tag, revision=commit_id, repo_type=repo_type)
        return
    except HfHubHTTPError as err:
        if err.response.status_code != 409:
            raise
    refs = api.list_repo_refs(repo_id, repo_type=repo_type)
    tagged = next((r.target_commit for r in refs.tags if r.name == tag), None)
    if tagged is None:
        raise PublishError(f"cannot create tag {tag!r} in {target.repo}: a branch has that name")
    if tagged == commit_id or _same_files(target, tagged, commit_id, paths):
        return
    if not move_tag:
        raise PublishError(
            f"tag {tag!r} already exists in {target.repo} on commit {tagged[:12]}, whose files "
            f"differ from the ones just published (commit {commit_id[:12]}); pass "
            "move_tag=True to move the tag, or use another tag"
        )
    logger.warning(
        "Hub: moving tag %s of %s from %s to %s", tag, target.repo, tagged[:12], commit_id[:12]
    )
    api.delete_tag(repo_id, tag=tag, repo_type=repo_type)
    api.create_tag(repo_id, tag=tag, revision=commit_id, repo_type=repo_type)


def _check_options(
    repo_id: str, repo_type: str, tag: str | None, max_retries: int, backoff_s: float
) -> None:
    validate_repo_id(repo_id)
    if repo_type not in _REPO_TYPES:
        raise PublishError(f"invalid repo_type {repo_type!r}: expected one of {_REPO_TYPES}")
    if tag is not None:
        _validate_tag(tag)
    if max_retries < 0 or backoff_s < 0:
        raise PublishError("max_retries and backoff_s must be >= 0")


def _files_to_publish(
    root: Path, prefix: str, model_card: str | None, allow_patterns: list[str] | None
) -> dict[str, Path | bytes]:
    """Repo path -> local file (or the model card's bytes), sorted by repo path."""
    if not root.is_dir():
        raise PublishError(f"folder to publish does not exist: {root}")
    files: dict[str, Path | bytes] = {
        f"{prefix}/{rel}" if prefix else rel: root / rel
        for rel in collect_publish_files(root, allow_patterns)
    }
    if model_card is not None:
        files["README.md"] = model_card.encode("utf-8")
    if not files:
        raise PublishError(
            f"nothing to publish in {root}: no file matches {allow_patterns or ALLOW_PATTERNS} "
            "(DCP shards, training_state/ and optimizer state are never uploaded)"
        )
    return dict(sorted(files.items()))


def _commit(target: Target, files: dict[str, Path | bytes], message: str) -> CommitInfo:
    """One commit of ``files``, retried when its request failed (not the preupload or the LFS
    transfers before it, which huggingface_hub retries itself)."""
    commit_path = f"/api/{target.repo_type}s/{target.repo_id}/commit/{target.revision}"

    def commit() -> CommitInfo:
        # New operations on every attempt: create_commit mutates the ones it is given.
        operations = [
            CommitOperationAdd(
                path_in_repo=path, path_or_fileobj=src if isinstance(src, bytes) else str(src)
            )
            for path, src in files.items()
        ]
        return target.api.create_commit(
            target.repo_id,
            operations,
            commit_message=message,
            repo_type=target.repo_type,
            revision=target.revision,
        )

    def is_commit_request(request: Any) -> bool:
        return request is not None and request.url.path.endswith(commit_path)

    return retrying(target, "commit", commit, sent_once=is_commit_request)


def publish_folder(
    folder: str | os.PathLike[str],
    repo_id: str,
    *,
    repo_type: str = "model",
    private: bool | None = None,
    path_in_repo: str = "",
    revision: str | None = None,
    commit_message: str | None = None,
    tag: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    model_card: str | None = None,
    max_retries: int = 5,
    backoff_s: float = 1.0,
    move_tag: bool = False,
    allow_patterns: list[str] | None = None,
) -> PublishReceipt:
    """Upload the allow-listed files of ``folder`` to ``repo_id`` (under ``path_in_repo``).

    ``model_card`` (text) becomes the repo's root ``README.md`` in the same commit. ``tag`` tags
    the resulting commit (see the module docstring for an existing tag; ``move_tag``).
    ``allow_patterns`` replaces ``ALLOW_PATTERNS`` (e.g. ``["*.json", "*.parquet", "*.mp4"]`` for
    a dataset folder); the deny list still applies. ``max_retries`` and ``backoff_s`` bound the
    retries of the requests huggingface_hub does not retry itself. Returns a receipt; raises
    ``PublishError``.
    """
    _check_options(repo_id, repo_type, tag, max_retries, backoff_s)
    prefix = _normalize_path_in_repo(path_in_repo)
    branch = revision or "main"
    files = _files_to_publish(Path(folder), prefix, model_card, allow_patterns)
    secrets = known_secrets(token)
    check_no_token_in_files(files, secrets)

    api = HfApi(
        endpoint=endpoint, token=token, library_name="lerobot_pipe", library_version=__version__
    )
    target = Target(api, repo_id, repo_type, branch, secrets, max_retries, backoff_s)
    retrying(
        target,
        "create the repo",
        lambda: api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True),
    )
    head = retrying(
        target,
        f"read the head of {branch!r}",
        lambda: api.repo_info(repo_id, repo_type=repo_type, revision=branch).sha,
    )
    message = commit_message or f"Upload {len(files)} file(s) with lerobot_pipe"
    info = _commit(target, files, message)
    created = info.oid != head
    if tag is not None:
        # The files a tag vouches for: those under path_in_repo (not the root model card).
        tagged = [p for p in files if p.startswith(f"{prefix}/")] if prefix else list(files)
        retrying(
            target,
            f"tag {tag}",
            lambda: _tag(target, tag, info.oid, tagged or list(files), move_tag),
        )
    logger.info(
        "Hub: published %d file(s) to %s at %s (%s)",
        len(files),
        target.repo,
        info.oid[:12],
        "new commit" if created else "unchanged",
    )
    return PublishReceipt(
        repo_id=repo_id,
        repo_type=repo_type,
        revision=branch,
        commit_id=info.oid,
        commit_url=info.commit_url,
        created_commit=created,
        files=list(files),
        path_in_repo=prefix,
        tag=tag,
    )


# ---------------------------------------------------------------------------- checkpoints
def _step_folder_name(pretrained: Path, step: int) -> str:
    folder = checkpoint_step_dir(pretrained) or pretrained
    name = folder.name
    if name.isdigit():
        if int(name) != step:
            raise PublishError(f"checkpoint folder {folder} is step {int(name)}, not step {step}")
        return name
    return f"{step:06d}"


def _rebuild_problem(pretrained: Path) -> str | None:
    """What the policy's config says others would miss to rebuild it (its ``publish_problem``);
    None for a config this version cannot read (published as it is)."""
    from lerobot_pipe.configs.policies import PreTrainedConfig
    from lerobot_pipe.policies.factory import discover_policies

    discover_policies()
    try:
        config = PreTrainedConfig.from_pretrained(pretrained)
    except ValueError:
        return None
    return config.publish_problem()


def publish_checkpoint(
    step_dir: str | os.PathLike[str],
    repo_id: str,
    *,
    intermediate: bool,
    step: int,
    commit_message: str | None = None,
    tag: str | None = None,
    model_card: str | None = None,
    **options: Any,
) -> PublishReceipt:
    """Publish a checkpoint's ``pretrained_model/``, and its EMA policy ``pretrained_model_ema/``
    (``--ema.enable=true``) when there is one beside it, the same way to ``<repo_id>-ema``
    (the receipt's ``ema``).

    ``step_dir`` is ``<output_dir>/checkpoints/<step>`` (or ``last``), its ``pretrained_model/``,
    or any folder holding the model files directly (``config.json``, weights).
    The final model goes to the repo root (tagged only if ``tag`` is given) with a model card
    built from its train_config.json unless ``model_card`` is given; an intermediate one to
    ``checkpoints/<step folder name>/``, tagged ``step-<step folder name>`` (e.g. ``step-005000``)
    unless ``tag`` says otherwise. Refuses checkpoints whose weights are only DCP shards.
    ``options`` go to :func:`publish_folder` (``repo_type``, ``private``, ``revision``, ``token``,
    ``endpoint``, ``max_retries``, ``backoff_s``, ``move_tag``).
    """
    if step < 0:
        raise PublishError(f"invalid step {step}")
    step_path = Path(step_dir).resolve()
    if not step_path.is_dir():
        raise PublishError(f"checkpoint folder does not exist: {step_dir}")
    pretrained = pretrained_dir(step_path)
    ema = ema_policy_dir(pretrained)
    if ema is not None:
        validate_repo_id(ema_repo_id(repo_id))
    kwargs = {"intermediate": intermediate, "step": step, "commit_message": commit_message}
    receipt = _publish_pretrained(
        pretrained, repo_id, tag=tag, model_card=model_card, **kwargs, **options
    )
    if ema is not None:
        ema_receipt = _publish_pretrained(ema, ema_repo_id(repo_id), tag=tag, **kwargs, **options)
        receipt.ema = ema_receipt.to_json()
    return receipt


def ema_repo_id(repo_id: str) -> str:
    """Where the EMA policy of ``repo_id``'s run is published (LeRobot has no rule: ours)."""
    return f"{repo_id}{C.EMA_REPO_SUFFIX}"


def _publish_pretrained(
    pretrained: Path,
    repo_id: str,
    *,
    intermediate: bool,
    step: int,
    commit_message: str | None,
    tag: str | None,
    model_card: str | None = None,
    **options: Any,
) -> PublishReceipt:
    """:func:`publish_checkpoint` of one pretrained-model folder."""
    if not holds_policy_files(pretrained):
        raise PublishError(
            f"{pretrained} is not a checkpoint: no {C.PRETRAINED_MODEL_DIR}/ folder and no "
            f"{C.CONFIG_NAME} or model weights in it"
        )
    has_weights = any(
        (pretrained / n).is_file() for n in (C.MODEL_SAFETENSORS, C.ADAPTER_SAFETENSORS)
    )
    if not has_weights:
        checkpoint_dir = checkpoint_step_dir(pretrained) or pretrained
        if (pretrained / C.MODEL_DCP_DIR).is_dir() or any(pretrained.rglob("*.distcp")):
            raise PublishError(
                f"{pretrained} holds only DCP shards ({C.MODEL_DCP_DIR}/), no "
                f"{C.MODEL_SAFETENSORS} or {C.ADAPTER_SAFETENSORS}; convert first: "
                f"lerobot-convert-dcp --checkpoint_dir={checkpoint_dir}"
            )
        raise PublishError(
            f"{pretrained} has no {C.MODEL_SAFETENSORS} or {C.ADAPTER_SAFETENSORS}: nothing to publish"
        )
    if not (pretrained / C.CONFIG_NAME).is_file():
        logger.warning(
            "Hub: %s has no %s; the published policy cannot be loaded", pretrained, C.CONFIG_NAME
        )
    else:
        problem = _rebuild_problem(pretrained)
        if problem:
            raise PublishError(f"{pretrained}: not published: {problem}")
    name = _step_folder_name(pretrained, step)
    if model_card is None and not intermediate and (pretrained / C.TRAIN_CONFIG_NAME).is_file():
        from lerobot_pipe.hub.model_card import model_card_for_checkpoint

        model_card = model_card_for_checkpoint(pretrained, repo_id)
    if intermediate:
        path_in_repo = f"{C.CHECKPOINTS_DIR}/{name}"
        tag = tag if tag is not None else f"step-{name}"
        message = commit_message or f"Upload checkpoint at step {step}"
    else:
        path_in_repo = ""
        message = commit_message or f"Upload final model (step {step})"
    return publish_folder(
        pretrained,
        repo_id,
        path_in_repo=path_in_repo,
        commit_message=message,
        tag=tag,
        model_card=model_card,
        **options,
    )
