"""Publish trained policies (and dataset folders) to the Hugging Face Hub.

``publish_folder`` creates the repo (``exist_ok``) and commits the allow-listed files of a folder
(``ALLOW_PATTERNS``; never DCP shards, ``training_state/`` or optimizer state) in ONE commit,
optionally with a model card as the root ``README.md``, then optionally tags that commit.

* Idempotent: before committing, every local file is compared with the remote tree at the current
  head (git blob sha1 for regular files, sha256 for LFS files, via ``get_paths_info``); when all
  match no commit is made and the receipt reports ``created_commit=False`` with the head commit.
  Only changed files are sent. Remote files that no longer exist locally are left in place.
* Retries: each remote step (create repo; diff + commit; tag) is retried on transient failures
  (HTTP 408/429/5xx, connection errors, timeouts) with exponential backoff
  (``backoff_s * 2**attempt``, at most 60 s, or the server's ``Retry-After``), logging each retry
  with ``logging.warning``. Permanent failures (401/403/404/400/...) raise ``PublishError`` at once
  with what to do. A retried commit re-diffs first, so a commit whose answer was lost is not
  duplicated.
* Tags: an existing tag on the published commit is fine; an existing tag on another commit is fine
  too when that commit holds identical published files (re-publishing an old checkpoint); otherwise
  ``PublishError`` unless ``move_tag=True``, which moves the tag to the new commit.
* Token: ``token`` argument, else huggingface_hub's usual sources (``HF_TOKEN``, stored login).
  It is never written to files, logs, receipts or model cards, and is redacted from error
  messages. Text files that contain it are refused.
* The endpoint is per call (``endpoint=``), default huggingface_hub's (``HF_ENDPOINT``).
* Local files are only read.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import logging
import os
import pickle
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from lerobot_pipe import __version__
from lerobot_pipe import constants as C

logger = logging.getLogger(__name__)

T = TypeVar("T")

ALLOW_PATTERNS = ["*.safetensors", "*.json", "*.yaml", "*.md"]
# Never uploaded, whatever ALLOW_PATTERNS says: resumable training state, DCP shards, receipts.
DENY_DIRS = frozenset({C.TRAINING_STATE_DIR, C.OPTIMIZER_DCP_DIR, C.MODEL_DCP_DIR})
DENY_NAMES = frozenset(
    {
        ".metadata",
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

_REPO_PART_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{16,}")
_REPO_TYPES = ("model", "dataset", "space")
_MAX_BACKOFF_S = 60.0
_PATHS_INFO_BATCH = 200


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the receipt as JSON (atomically) and return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
        return path


# ---------------------------------------------------------------------------- validation
def validate_repo_id(repo_id: str) -> str:
    """Check that ``repo_id`` is ``namespace/name`` with the Hub's allowed characters.

    Rejects traversal (``..``), absolute paths, backslashes, empty parts, ``--``, and names that
    start or end with ``-``/``.``. Returns ``repo_id`` unchanged.
    """
    if not isinstance(repo_id, str) or not repo_id:
        raise PublishError(f"invalid repo_id {repo_id!r}: expected 'namespace/name'")
    why = None
    if "\\" in repo_id:
        why = "backslashes are not allowed"
    elif repo_id.startswith("/"):
        why = "absolute paths are not allowed"
    elif ".." in repo_id:
        why = "'..' is not allowed"
    elif "--" in repo_id:
        why = "'--' is not allowed"
    elif repo_id.count("/") != 1:
        why = "expected exactly one '/' between namespace and name"
    else:
        namespace, name = repo_id.split("/")
        if not namespace or not name:
            why = "namespace and name must not be empty"
        elif not (_REPO_PART_RE.match(namespace) and _REPO_PART_RE.match(name)):
            why = (
                "use letters, digits, '-', '_' and '.' only (at most 96 per part), "
                "not starting or ending with '-' or '.'"
            )
    if why:
        raise PublishError(f"invalid repo_id {repo_id!r}: {why}; expected 'namespace/name'")
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
@dataclass
class _LocalFile:
    repo_path: str
    path: Path | None = None
    data: bytes | None = None
    _sha256: str | None = None
    _sha1: str | None = None

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else self.path.stat().st_size  # type: ignore[union-attr]

    def _chunks(self) -> Iterator[bytes]:
        if self.data is not None:
            yield self.data
            return
        with open(self.path, "rb") as fh:  # type: ignore[arg-type]
            while chunk := fh.read(1 << 20):
                yield chunk

    def sha256(self) -> str:
        if self._sha256 is None:
            h = hashlib.sha256()
            for chunk in self._chunks():
                h.update(chunk)
            self._sha256 = h.hexdigest()
        return self._sha256

    def git_sha1(self) -> str:
        if self._sha1 is None:
            h = hashlib.sha1(b"blob %d\0" % self.size)
            for chunk in self._chunks():
                h.update(chunk)
            self._sha1 = h.hexdigest()
        return self._sha1

    def operation(self) -> Any:
        from huggingface_hub import CommitOperationAdd

        source = self.data if self.data is not None else str(self.path)
        return CommitOperationAdd(path_in_repo=self.repo_path, path_or_fileobj=source)


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
        from huggingface_hub import get_token

        found.append(get_token())
    return sorted({s for s in found if isinstance(s, str) and len(s) >= 4}, key=len, reverse=True)


def _redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return _HF_TOKEN_RE.sub("hf_***", text)


def _check_no_token_in_files(files: list[_LocalFile], secrets: list[str]) -> None:
    for f in files:
        if not f.repo_path.endswith(_TEXT_SUFFIXES):
            continue
        data = f.data if f.data is not None else f.path.read_bytes()  # type: ignore[union-attr]
        if any(secret.encode() in data for secret in secrets):
            raise PublishError(
                f"refusing to publish {f.repo_path}: it contains your Hugging Face token; "
                "remove it from the file (and rotate the token if it was shared)"
            )


# ---------------------------------------------------------------------------- errors / retries
def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _transient_exception_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, names in (
        ("httpx2", ("TransportError",)),
        ("httpx", ("TransportError",)),
        ("requests", ("ConnectionError", "Timeout")),
    ):
        with contextlib.suppress(Exception):
            mod = __import__(module)
            types.extend(getattr(mod, n) for n in names if hasattr(mod, n))
    return tuple(types)


def _response_of(exc: BaseException) -> Any:
    for e in _exception_chain(exc):
        response = getattr(e, "response", None)
        if isinstance(getattr(response, "status_code", None), int):
            return response
    return None


def _server_detail(exc: BaseException) -> str:
    for e in _exception_chain(exc):
        message = getattr(e, "server_message", None)
        if message:
            return str(message).strip().splitlines()[0]
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _retry_after(response: Any) -> float | None:
    with contextlib.suppress(Exception):
        return float(response.headers.get("Retry-After"))
    return None


class _Ctx:
    """What the retry loop needs to word its errors."""

    def __init__(self, repo_id: str, repo_type: str, revision: str, secrets: list[str]):
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.revision = revision
        self.secrets = secrets

    @property
    def repo(self) -> str:
        return f"{self.repo_type} repo {self.repo_id}"


def _permanent_message(
    step: str, status: int | None, response: Any, exc: BaseException, ctx: _Ctx
) -> str:
    detail = _server_detail(exc)
    code = response.headers.get("X-Error-Code") if response is not None else None
    if status == 401:
        return (
            f"Hub authentication failed (401) while trying to {step} on {ctx.repo}: "
            "check your token: `hf auth login` or HF_TOKEN (or pass token=...)"
        )
    if status == 403:
        return (
            f"no write access to {ctx.repo} (403) while trying to {step}: use a token with "
            f"write permission on the '{ctx.repo_id.split('/')[0]}' namespace ({detail})"
        )
    if status == 404:
        if code == "RevisionNotFound":
            return (
                f"revision {ctx.revision!r} not found in {ctx.repo} (404) while trying to {step}: "
                "create the branch first or publish to 'main'"
            )
        if code == "EntryNotFound":
            return f"file not found in {ctx.repo} (404) while trying to {step}: {detail}"
        return (
            f"{ctx.repo} not found (404) while trying to {step}: check repo_id, repo_type and "
            "that your token can access it"
        )
    if status is not None:
        return f"the Hub rejected the request to {step} on {ctx.repo} (HTTP {status}): {detail}"
    return f"failed to {step} on {ctx.repo}: {type(exc).__name__}: {detail}"


def _with_retries(
    step: str, fn: Callable[[], T], ctx: _Ctx, max_retries: int, backoff_s: float
) -> T:
    transient_types = _transient_exception_types()
    attempt = 0
    while True:
        try:
            return fn()
        except PublishError:
            raise
        except Exception as exc:
            response = _response_of(exc)
            status = response.status_code if response is not None else None
            if status is not None:
                transient = status in (408, 429) or status >= 500
            else:
                transient = any(isinstance(e, transient_types) for e in _exception_chain(exc))
            leaked = any(s in str(e) for e in _exception_chain(exc) for s in ctx.secrets)
            if not transient:
                message = _redact(_permanent_message(step, status, response, exc, ctx), ctx.secrets)
                if leaked:
                    raise PublishError(message) from None
                raise PublishError(message) from exc
            reason = _redact(f"HTTP {status}" if status else _server_detail(exc), ctx.secrets)
            if attempt >= max_retries:
                message = f"failed to {step} on {ctx.repo} after {attempt + 1} attempts: {reason}"
                if leaked:
                    raise PublishError(message) from None
                raise PublishError(message) from exc
            delay = min(backoff_s * (2**attempt), _MAX_BACKOFF_S)
            after = _retry_after(response) if status == 429 else None
            if after is not None:
                delay = min(max(delay, after), _MAX_BACKOFF_S)
            attempt += 1
            logger.warning(
                "Hub: %s on %s failed (%s); retry %d/%d in %.2fs",
                step,
                ctx.repo,
                reason,
                attempt,
                max_retries,
                delay,
            )
            time.sleep(delay)


# ---------------------------------------------------------------------------- publishing
def _commit_url(endpoint: str, repo_type: str, repo_id: str, sha: str) -> str:
    prefix = "" if repo_type == "model" else f"{repo_type}s/"
    return f"{endpoint.rstrip('/')}/{prefix}{repo_id}/commit/{sha}"


def _remote_entries(
    api: Any, repo_id: str, repo_type: str, sha: str, paths: list[str]
) -> dict[str, Any]:
    from huggingface_hub.hf_api import RepoFile

    out: dict[str, Any] = {}
    for i in range(0, len(paths), _PATHS_INFO_BATCH):
        batch = paths[i : i + _PATHS_INFO_BATCH]
        for entry in api.get_paths_info(repo_id, batch, revision=sha, repo_type=repo_type):
            if isinstance(entry, RepoFile):
                out[entry.path] = entry
    return out


def _unchanged(local: _LocalFile, remote: Any) -> bool:
    if remote is None or remote.size != local.size:
        return False
    if remote.lfs is not None:
        return remote.lfs.sha256 == local.sha256()
    return remote.blob_id == local.git_sha1()


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
    a dataset folder); the deny list still applies. Returns a receipt; raises ``PublishError``.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

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

    files = [
        _LocalFile(repo_path=f"{prefix}/{rel}" if prefix else rel, path=root / rel)
        for rel in collect_publish_files(root, allow_patterns)
    ]
    if model_card is not None:
        files = [f for f in files if f.repo_path != "README.md"]
        files.append(_LocalFile(repo_path="README.md", data=model_card.encode("utf-8")))
    if not files:
        raise PublishError(
            f"nothing to publish in {root}: no file matches {allow_patterns or ALLOW_PATTERNS} "
            "(DCP shards, training_state/ and optimizer state are never uploaded)"
        )
    files.sort(key=lambda f: f.repo_path)
    secrets = _known_secrets(token)
    _check_no_token_in_files(files, secrets)

    api = HfApi(
        endpoint=endpoint, token=token, library_name="lerobot_pipe", library_version=__version__
    )
    ctx = _Ctx(repo_id, repo_type, branch, secrets)
    message = commit_message or f"Upload {len(files)} file(s) with lerobot_pipe"

    def create() -> None:
        api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)

    def commit() -> tuple[str, str | None, bool]:
        head = api.repo_info(repo_id, repo_type=repo_type, revision=branch).sha
        remote = _remote_entries(api, repo_id, repo_type, head, [f.repo_path for f in files])
        changed = [f for f in files if not _unchanged(f, remote.get(f.repo_path))]
        if not changed:
            logger.info("Hub: %s is up to date at %s; no new commit", ctx.repo, head[:12])
            return head, _commit_url(api.endpoint, repo_type, repo_id, head), False
        info = api.create_commit(
            repo_id,
            [f.operation() for f in changed],
            commit_message=message,
            repo_type=repo_type,
            revision=branch,
        )
        return info.oid, info.commit_url, info.oid != head

    # The files a tag vouches for: those under path_in_repo (not the root model card).
    tagged = [f for f in files if f.repo_path.startswith(f"{prefix}/")] if prefix else files
    tagged = tagged or files

    def files_match_at(sha: str) -> bool:
        remote = _remote_entries(api, repo_id, repo_type, sha, [f.repo_path for f in tagged])
        return all(_unchanged(f, remote.get(f.repo_path)) for f in tagged)

    def make_tag(commit_id: str) -> None:
        assert tag is not None
        try:
            api.create_tag(repo_id, tag=tag, revision=commit_id, repo_type=repo_type)
            return
        except HfHubHTTPError as err:
            if err.response is None or err.response.status_code != 409:
                raise
        refs = api.list_repo_refs(repo_id, repo_type=repo_type)
        target = next((r.target_commit for r in refs.tags if r.name == tag), None)
        if target is None:
            raise PublishError(f"cannot create tag {tag!r} in {ctx.repo}: a branch has that name")
        if target == commit_id or files_match_at(target):
            return
        if not move_tag:
            raise PublishError(
                f"tag {tag!r} already exists in {ctx.repo} on commit {target[:12]}, whose files "
                f"differ from the ones just published (commit {commit_id[:12]}); pass "
                "move_tag=True to move the tag, or use another tag"
            )
        logger.warning(
            "Hub: moving tag %s of %s from %s to %s", tag, ctx.repo, target[:12], commit_id[:12]
        )
        api.delete_tag(repo_id, tag=tag, repo_type=repo_type)
        api.create_tag(repo_id, tag=tag, revision=commit_id, repo_type=repo_type)

    _with_retries("create the repo", create, ctx, max_retries, backoff_s)
    commit_id, commit_url, created = _with_retries("commit", commit, ctx, max_retries, backoff_s)
    if tag is not None:
        _with_retries(f"tag {tag}", lambda: make_tag(commit_id), ctx, max_retries, backoff_s)
    receipt = PublishReceipt(
        repo_id=repo_id,
        repo_type=repo_type,
        revision=branch,
        commit_id=commit_id,
        commit_url=commit_url,
        created_commit=created,
        files=[f.repo_path for f in files],
        path_in_repo=prefix,
        tag=tag,
    )
    logger.info(
        "Hub: published %d file(s) to %s at %s (%s)",
        len(files),
        ctx.repo,
        commit_id[:12],
        "new commit" if created else "unchanged",
    )
    return receipt


# ---------------------------------------------------------------------------- checkpoints
def _pretrained_dir(step_dir: Path) -> Path:
    if step_dir.name == C.PRETRAINED_MODEL_DIR:
        return step_dir
    candidate = step_dir / C.PRETRAINED_MODEL_DIR
    if candidate.is_dir():
        return candidate
    # A bare pretrained-model folder (e.g. a conversion's output) holds the model files directly.
    markers = (C.CONFIG_NAME, C.MODEL_SAFETENSORS, C.ADAPTER_SAFETENSORS, C.MODEL_DCP_DIR)
    if any((step_dir / m).exists() for m in markers):
        return step_dir
    raise PublishError(
        f"{step_dir} is not a checkpoint: no {C.PRETRAINED_MODEL_DIR}/ folder and no "
        f"{C.CONFIG_NAME} or model weights in it"
    )


def _step_folder_name(step_dir: Path, step: int) -> str:
    name = step_dir.name
    if name == C.PRETRAINED_MODEL_DIR:
        name = step_dir.parent.name
    if name.isdigit():
        if int(name) != step:
            raise PublishError(f"checkpoint folder {step_dir} is step {int(name)}, not step {step}")
        return name
    return f"{step:06d}"


def publish_checkpoint(
    step_dir: str | os.PathLike[str],
    repo_id: str,
    *,
    intermediate: bool,
    step: int,
    repo_type: str = "model",
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    tag: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    model_card: str | None = None,
    max_retries: int = 5,
    backoff_s: float = 1.0,
    move_tag: bool = False,
) -> PublishReceipt:
    """Publish a checkpoint's ``pretrained_model/``.

    ``step_dir`` is ``<output_dir>/checkpoints/<step>`` (or ``last``), its ``pretrained_model/``,
    or any folder holding the model files directly (``config.json``, weights).
    The final model goes to the repo root (tagged only if ``tag`` is given); an intermediate one to
    ``checkpoints/<step folder name>/``, tagged ``step-<step folder name>`` (e.g. ``step-005000``)
    unless ``tag`` says otherwise. Refuses checkpoints whose weights are only DCP shards.
    """
    if step < 0:
        raise PublishError(f"invalid step {step}")
    step_path = Path(step_dir).resolve()
    if not step_path.is_dir():
        raise PublishError(f"checkpoint folder does not exist: {step_dir}")
    pretrained = _pretrained_dir(step_path)
    has_weights = any(
        (pretrained / n).is_file() for n in (C.MODEL_SAFETENSORS, C.ADAPTER_SAFETENSORS)
    )
    if not has_weights:
        checkpoint_dir = pretrained.parent
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
    name = _step_folder_name(step_path, step)
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
        repo_type=repo_type,
        private=private,
        path_in_repo=path_in_repo,
        revision=revision,
        commit_message=message,
        tag=tag,
        token=token,
        endpoint=endpoint,
        model_card=model_card,
        max_retries=max_retries,
        backoff_s=backoff_s,
        move_tag=move_tag,
    )


# ---------------------------------------------------------------------------- collectives
def publish_from_main_process(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn`` on rank 0 only and give every rank the same outcome.

    Without an initialized ``torch.distributed`` process group this is ``fn(*args, **kwargs)``.
    Otherwise rank 0 runs ``fn``; its result (which must be picklable) or its error message is
    broadcast with ``broadcast_object_list``; every rank returns the result, or raises: rank 0
    re-raises the original exception, the other ranks a ``PublishError`` with the same message.
    Every rank must call this (it is a collective).
    """
    dist = None
    with contextlib.suppress(ImportError):
        import torch.distributed as dist
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return fn(*args, **kwargs)
    payload: list[Any] = [None]
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            result = fn(*args, **kwargs)
            pickle.dumps(result)  # fail here, not inside the collective, if it cannot be sent
            payload = [("ok", result)]
        except BaseException as exc:  # broadcast even on KeyboardInterrupt so no rank hangs
            error = exc
            message = _redact(str(exc), _known_secrets(None))
            payload = [("error", (type(exc).__name__, message))]
    dist.broadcast_object_list(payload, src=0)
    kind, value = payload[0]
    if kind == "ok":
        return value
    if error is not None:
        raise error
    type_name, message = value
    if type_name == PublishError.__name__:
        raise PublishError(message)
    raise PublishError(f"publishing failed on rank 0: {type_name}: {message}")
