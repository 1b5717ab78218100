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
  commit request itself, tags): at most ``max_retries``, ``backoff_s * 2**i`` s apart (at most
  60 s, or the server's ``Retry-After``), each logged with ``logging.warning``. A retried commit
  whose first answer was lost is not duplicated: ``create_commit`` finds the files already there.
  The final error says how many attempts were made over how long.
* Errors that say what to do (``PublishError``): 401 (``HF_TOKEN`` / ``hf auth login``), 403, 404,
  and no network (the cause, e.g. name resolution or connection refused, and the host).
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

import contextlib
import fnmatch
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from huggingface_hub import CommitInfo, CommitOperationAdd, HfApi, RepoFile, get_token
from huggingface_hub.errors import HfHubHTTPError

from lerobot_pipe import __version__
from lerobot_pipe import constants as C
from lerobot_pipe.fsutil import write_json_atomic
from lerobot_pipe.policies.locate import (
    checkpoint_step_dir,
    ema_policy_dir,
    holds_policy_files,
    pretrained_dir,
)
from lerobot_pipe.utils.repo_id import repo_id_problem

logger = logging.getLogger(__name__)

T = TypeVar("T")

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

_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{16,}")
_REPO_TYPES = ("model", "dataset", "space")
_MAX_BACKOFF_S = 60.0
_PATHS_INFO_BATCH = 200
# What huggingface_hub's http_backoff treats as transient (huggingface_hub/utils/_http.py); used
# for the requests it sends only once.
_TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_NETWORK_ERRORS = (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)


class PublishError(RuntimeError):
    """Publishing failed; the message says why and what to do. Never contains the token."""


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


# ---------------------------------------------------------------------------- local files
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


# ---------------------------------------------------------------------------- secrets
def _known_secrets(token: str | None) -> list[str]:
    found = [token, os.environ.get("HF_TOKEN"), os.environ.get("HUGGING_FACE_HUB_TOKEN")]
    with contextlib.suppress(Exception):
        found.append(get_token())
    return sorted({s for s in found if isinstance(s, str) and len(s) >= 4}, key=len, reverse=True)


def _redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return _HF_TOKEN_RE.sub("hf_***", text)


def redacted(exc: BaseException) -> str:
    """An exception's message with every known token replaced (for logs and other ranks)."""
    return _redact(str(exc), _known_secrets(None))


def _check_no_token_in_files(files: dict[str, Path | bytes], secrets: list[str]) -> None:
    for repo_path, source in files.items():
        if not repo_path.endswith(_TEXT_SUFFIXES):
            continue
        data = source if isinstance(source, bytes) else source.read_bytes()
        if any(secret.encode() in data for secret in secrets):
            raise PublishError(
                f"refusing to publish {repo_path}: it contains your Hugging Face token; "
                "remove it from the file (and rotate the token if it was shared)"
            )


# ---------------------------------------------------------------------------- errors / retries
@dataclass
class _Target:
    """The repo being published to, with what the retries and the error messages need."""

    api: HfApi
    repo_id: str
    repo_type: str
    revision: str
    secrets: list[str]
    max_retries: int
    backoff_s: float

    @property
    def repo(self) -> str:
        return f"{self.repo_type} repo {self.repo_id}"


def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _failed_request(exc: BaseException) -> Any:
    """The HTTP request that failed (an ``HfHubHTTPError``'s or a transport error's), or None."""
    with contextlib.suppress(RuntimeError):  # httpx2 raises when an error has no request
        if isinstance(exc, HfHubHTTPError):
            return exc.response.request
        return getattr(exc, "request", None)
    return None


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, HfHubHTTPError):
        return exc.response.status_code in _TRANSIENT_STATUSES
    return isinstance(exc, _NETWORK_ERRORS)


def _network_cause(exc: BaseException, request: Any) -> str:
    host = request.url.host if request is not None else "the Hub"
    for e in _exception_chain(exc):
        if isinstance(e, socket.gaierror):
            return f"name resolution failed for {host} ({e.strerror})"
        if isinstance(e, ConnectionRefusedError):
            return f"connection refused by {host}"
    if isinstance(exc, httpx2.TimeoutException):
        return f"no answer from {host} in time"
    return f"{type(exc).__name__}: {exc}"


def _describe(exc: BaseException, step: str, target: _Target) -> str:
    """What went wrong in ``step`` and what to do about it (not yet redacted)."""
    request = _failed_request(exc)
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code
        code = exc.response.headers.get("X-Error-Code")
        detail = str(exc.server_message or exc).strip().splitlines()[0]
        namespace = target.repo_id.split("/")[0]
        if status == 401:
            return (
                f"Hub authentication failed (401) while trying to {step} on {target.repo}: no "
                "token was sent or the Hub refused it; set HF_TOKEN to a token with write "
                "access, or run `hf auth login`"
            )
        if status == 403:
            return (
                f"no write access to {target.repo} (403) while trying to {step}: check that "
                f"your token (HF_TOKEN or `hf auth login`) has write permission on the "
                f"'{namespace}' namespace and that you belong to it if it is an organization "
                f"({detail})"
            )
        if status == 404 and code == "RevisionNotFound":
            type_flag = "" if target.repo_type == "model" else f" --repo-type {target.repo_type}"
            return (
                f"revision {target.revision!r} not found in {target.repo} (404) while trying to "
                f"{step}: create the branch first (`hf repos branch create {target.repo_id} "
                f"{target.revision}{type_flag}`) or publish to 'main'"
            )
        if status == 404 and code == "EntryNotFound":
            return f"file not found in {target.repo} (404) while trying to {step}: {detail}"
        if status == 404:
            return (
                f"{target.repo} not found (404) while trying to {step}: check the repo id "
                f"(namespace/name) and the repo type; a private repo also answers 404 to a token "
                "that cannot read it (HF_TOKEN or `hf auth login`)"
            )
        return f"the Hub answered HTTP {status} while trying to {step} on {target.repo}: {detail}"
    if isinstance(exc, _NETWORK_ERRORS):
        origin = f"{request.url.scheme}://{request.url.netloc.decode()}" if request else "the Hub"
        return (
            f"cannot reach {origin} while trying to {step} on {target.repo}: "
            f"{_network_cause(exc, request)}; check the network connection and the endpoint "
            "(HF_ENDPOINT)"
        )
    return f"failed to {step} on {target.repo}: {type(exc).__name__}: {exc}"


def _retry_delay(exc: BaseException, attempt: int, backoff_s: float) -> float:
    delay = backoff_s * 2 ** (attempt - 1)
    if isinstance(exc, HfHubHTTPError) and exc.response.status_code == 429:
        with contextlib.suppress(TypeError, ValueError):
            delay = max(delay, float(exc.response.headers.get("Retry-After")))
    return min(delay, _MAX_BACKOFF_S)


def _retrying(
    target: _Target,
    step: str,
    call: Callable[[], T],
    sent_once: Callable[[Any], bool] = lambda request: True,
) -> T:
    """Run ``call``, retrying its transient failures when ``sent_once(failed request)``.

    huggingface_hub 2.4 sends create_repo, repo_info, the commit request (``_send_commit`` without
    ``retry_on_error``) and the tag requests once, without its ``http_backoff``: those are the
    requests retried here, at most ``max_retries`` times.
    """
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except PublishError:
            raise
        except Exception as exc:
            request = _failed_request(exc)
            transient = _is_transient(exc)
            ours = transient and sent_once(request)
            if ours and attempt <= target.max_retries:
                delay = _retry_delay(exc, attempt, target.backoff_s)
                if isinstance(exc, HfHubHTTPError):
                    reason = f"HTTP {exc.response.status_code}"
                else:
                    reason = _network_cause(exc, request)
                logger.warning(
                    "Hub: %s on %s failed (%s); retry %d/%d in %.2fs",
                    step,
                    target.repo,
                    _redact(reason, target.secrets),
                    attempt,
                    target.max_retries,
                    delay,
                )
                time.sleep(delay)
                continue
            message = _describe(exc, step, target)
            if transient:
                tries = f"{attempt} attempt{'s' * (attempt > 1)}"
                if not ours:
                    tries = "huggingface_hub's own retries"
                elapsed = time.monotonic() - start
                message += f"; gave up after {tries} over {elapsed:.1f} s; try again later"
            leaked = any(s in str(e) for e in _exception_chain(exc) for s in target.secrets)
            raise PublishError(_redact(message, target.secrets)) from (None if leaked else exc)


# ---------------------------------------------------------------------------- publishing
def _same_files(target: _Target, sha_a: str, sha_b: str, paths: list[str]) -> bool:
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


def _tag(target: _Target, tag: str, commit_id: str, paths: list[str], move_tag: bool) -> None:
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
    validate_repo_id(repo_id)
    if repo_type not in _REPO_TYPES:
        raise PublishError(f"invalid repo_type {repo_type!r}: expected one of {_REPO_TYPES}")
    if tag is not None:
        _validate_tag(tag)
    if max_retries < 0 or backoff_s < 0:
        raise PublishError("max_retries and backoff_s must be >= 0")
    root = Path(folder)
    if not root.is_dir():
        raise PublishError(f"folder to publish does not exist: {root}")
    prefix = _normalize_path_in_repo(path_in_repo)
    branch = revision or "main"

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
    files = dict(sorted(files.items()))
    secrets = _known_secrets(token)
    _check_no_token_in_files(files, secrets)

    api = HfApi(
        endpoint=endpoint, token=token, library_name="lerobot_pipe", library_version=__version__
    )
    target = _Target(api, repo_id, repo_type, branch, secrets, max_retries, backoff_s)
    message = commit_message or f"Upload {len(files)} file(s) with lerobot_pipe"
    commit_path = f"/api/{repo_type}s/{repo_id}/commit/{branch}"

    def commit() -> CommitInfo:
        # New operations on every attempt: create_commit mutates the ones it is given.
        operations = [
            CommitOperationAdd(
                path_in_repo=path, path_or_fileobj=src if isinstance(src, bytes) else str(src)
            )
            for path, src in files.items()
        ]
        return api.create_commit(
            repo_id, operations, commit_message=message, repo_type=repo_type, revision=branch
        )

    def is_commit_request(request: Any) -> bool:
        return request is not None and request.url.path.endswith(commit_path)

    _retrying(
        target,
        "create the repo",
        lambda: api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True),
    )
    head = _retrying(
        target,
        f"read the head of {branch!r}",
        lambda: api.repo_info(repo_id, repo_type=repo_type, revision=branch).sha,
    )
    info = _retrying(target, "commit", commit, sent_once=is_commit_request)
    created = info.oid != head
    if tag is not None:
        # The files a tag vouches for: those under path_in_repo (not the root model card).
        tagged = [p for p in files if p.startswith(f"{prefix}/")] if prefix else list(files)
        _retrying(
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
