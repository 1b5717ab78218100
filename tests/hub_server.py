"""A small Hugging Face Hub-compatible HTTP server for tests (standard library only).

It answers the HTTP calls that the unmodified ``huggingface_hub`` client (2.x) makes, so tests can
drive ``HfApi`` / ``snapshot_download`` / ``hf_hub_download`` against ``http://127.0.0.1:<port>``:

* ``POST /api/repos/create`` (409 with ``"url"`` when the repo exists), ``DELETE /api/repos/delete``
* ``GET /api/{models,datasets,spaces}/NS/NAME[/revision/REV]`` (repo / revision info)
* ``POST .../preupload/REV``: ``"regular"`` for files up to ``lfs_threshold`` bytes, ``"lfs"`` above,
  with the existing file's ``oid`` (git blob sha1, or sha256 for LFS) so unchanged files are skipped
* ``POST .../commit/REV`` (NDJSON: header / file / lfsFile / deletedFile / deletedFolder); a commit
  that changes nothing creates no commit and answers the current head
* ``POST /[datasets/]NS/NAME.git/info/lfs/objects/batch`` + signed ``PUT`` upload URLs (+ verify,
  optional multi-part when ``lfs_multipart_chunk_size`` is set)
* ``GET .../tree/REV[/PATH]?recursive=&expand=`` (paginated with a ``Link`` header),
  ``POST .../paths-info/REV``, ``GET .../commits/REV``, ``GET .../refs``
* ``HEAD``/``GET /[datasets/]NS/NAME/resolve/REV/PATH`` with ``X-Repo-Commit``, ``ETag``,
  ``Content-Length``, ``Range``
* ``POST .../tag/REV``, ``DELETE .../tag/TAG``, ``POST``/``DELETE .../branch/BRANCH``
* ``POST /api/validate-yaml``, ``GET /api/whoami-v2``

Errors carry ``X-Error-Code`` (``RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound``) and a
JSON ``{"error": ...}`` body, as the Hub does.

Auth: ``tokens`` may write, ``read_tokens`` may only read (writes answer 403). A request bearing an
unknown bearer token answers 401 ("Invalid credentials in Authorization header"); a write without
any token answers 401. Public repos are readable anonymously; private ones need a valid token.

Storage: file bytes live in a content-addressed store (``<root>/blobs/<sha256>``); every repo is a
JSON document (``<root>/repos/<type>/<ns>/<name>.json``) holding its commits as plain snapshots
(commit sha -> {path: {sha256, sha1, size, lfs}}), branches and tags. A server started on an
existing ``root`` reloads its repos.

Test helpers: ``inject_fault`` (the next N requests matching a path regex answer an error status, or
drop the connection, optionally after carrying the request out), ``requests`` (log of
method/path/status/headers), and direct inspection (``commit_count``, ``list_files``,
``read_file``, ``tags``...) or seeding (``commit_files``) of repos without HTTP.

Run tests with the client on plain LFS: ``HF_HUB_DISABLE_XET=1`` (or patch
``huggingface_hub.constants.HF_HUB_DISABLE_XET = True``; ``tests/conftest_hub.py`` does this).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

DEFAULT_WRITE_TOKEN = "hf_lerobotPipeTestWriteToken0123456789"
DEFAULT_READ_TOKEN = "hf_lerobotPipeTestReadToken01234567890"
DEFAULT_USER = "test-user"
DEFAULT_LFS_THRESHOLD = 64 * 1024

_TYPE_BY_PLURAL = {"models": "model", "datasets": "dataset", "spaces": "space"}
_URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_GITATTRIBUTES = (
    b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
    b"*.pt filter=lfs diff=lfs merge=lfs -text\n"
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"
    b"*.mp4 filter=lfs diff=lfs merge=lfs -text\n"
)


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class HubError(Exception):
    """An HTTP error answer: status, message (JSON ``error``) and optional ``X-Error-Code``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class LoggedRequest:
    """One request the server answered. ``headers``: the request headers, names Title-Cased;
    ``sent``: the bytes of the response body written to the socket (0 for HEAD, a dropped
    connection; half the body for a truncated one)."""

    method: str
    path: str
    query: str
    status: int
    headers: dict[str, str]
    time: float
    sent: int = 0


@dataclass
class _Fault:
    pattern: re.Pattern[str]
    method: str | None
    remaining: int
    status: int
    headers: dict[str, str]
    body: Any
    after: bool
    truncate: bool = False


@dataclass
class _Repo:
    repo_type: str
    repo_id: str
    private: bool
    created_at: str
    commits: dict[str, dict[str, Any]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "repo_type": self.repo_type,
            "repo_id": self.repo_id,
            "private": self.private,
            "created_at": self.created_at,
            "commits": self.commits,
            "branches": self.branches,
            "tags": self.tags,
        }


class HubServer:
    """A Hub-compatible server on 127.0.0.1, run in a background thread.

    Args:
        root: folder for the blob store and repos (a temporary folder, removed on ``stop``, if None).
        tokens: write tokens (an iterable, or a mapping token -> user name).
        read_tokens: read-only tokens (same forms); writes with them answer 403.
        lfs_threshold: files strictly larger than this many bytes are asked for as "lfs".
        lfs_multipart_chunk_size: if set, LFS files larger than it are uploaded in parts.
        tree_page_size: entries per page of the tree listing (50 when ``expand=true``, as on the Hub).
        initial_gitattributes: create repos with a ``.gitattributes`` commit, like the Hub.
    """

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        tokens: Iterable[str] | Mapping[str, str] | None = None,
        read_tokens: Iterable[str] | Mapping[str, str] | None = None,
        lfs_threshold: int = DEFAULT_LFS_THRESHOLD,
        lfs_multipart_chunk_size: int | None = None,
        tree_page_size: int = 1000,
        initial_gitattributes: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self._owns_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="hub-server-") if root is None else root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "blobs").mkdir(exist_ok=True)
        (self.root / "tmp").mkdir(exist_ok=True)
        self.write_tokens = _token_map(tokens if tokens is not None else [DEFAULT_WRITE_TOKEN])
        self.read_tokens = _token_map(
            read_tokens if read_tokens is not None else [DEFAULT_READ_TOKEN]
        )
        self.lfs_threshold = lfs_threshold
        self.lfs_multipart_chunk_size = lfs_multipart_chunk_size
        self.tree_page_size = tree_page_size
        self.initial_gitattributes = initial_gitattributes
        self._host = host
        self._port = port
        self._secret = secrets.token_bytes(16)
        self._lock = threading.RLock()
        self._repos: dict[tuple[str, str], _Repo] = {}
        self._faults: list[_Fault] = []
        self._log: list[LoggedRequest] = []
        self._counter = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._load()

    # ------------------------------------------------------------------ lifecycle
    @property
    def token(self) -> str:
        """The first write token (what tests pass as ``token=``)."""
        return next(iter(self.write_tokens))

    @property
    def read_token(self) -> str:
        return next(iter(self.read_tokens))

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("HubServer is not started")
        return f"http://{self._host}:{self._httpd.server_address[1]}"

    @property
    def cache_dir(self) -> Path:
        """A huggingface_hub cache folder private to this server (pass as ``cache_dir=``)."""
        path = self.root / "hf-cache"
        path.mkdir(exist_ok=True)
        return path

    def env(self) -> dict[str, str]:
        """Environment variables that point a *subprocess* at this server (import-time settings)."""
        return {
            "HF_ENDPOINT": self.url,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_CACHE": str(self.cache_dir),
            "HF_TOKEN": self.token,
        }

    def start(self) -> HubServer:
        if self._httpd is not None:
            return self
        handler = type("HubRequestHandler", (_Handler,), {"hub": self})
        httpd = ThreadingHTTPServer((self._host, self._port), handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ test helpers
    def add_token(self, token: str, *, user: str = DEFAULT_USER, write: bool = True) -> None:
        with self._lock:
            (self.write_tokens if write else self.read_tokens)[token] = user

    def inject_fault(
        self,
        pattern: str,
        times: int = 1,
        *,
        status: int = 500,
        method: str | None = None,
        headers: Mapping[str, str] | None = None,
        body: Any = None,
        after: bool = False,
        truncate: bool = False,
    ) -> None:
        """Make the next ``times`` requests whose path matches ``pattern`` (``re.search`` on the URL
        path, before percent-decoding) answer ``status`` with a JSON error body (or ``body``).
        ``status=0`` closes the connection without answering (a connection error for the client).
        ``after=True`` carries the request out first (an answer lost on its way back).
        ``truncate=True`` carries the request out and sends its headers (the full Content-Length)
        and the first half of its body, then closes the connection (a drop mid-file).
        """
        with self._lock:
            self._faults.append(
                _Fault(
                    pattern=re.compile(pattern),
                    method=method.upper() if method else None,
                    remaining=times,
                    status=status,
                    headers=dict(headers or {}),
                    body=body,
                    after=after,
                    truncate=truncate,
                )
            )

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def pending_faults(self) -> int:
        with self._lock:
            return sum(f.remaining for f in self._faults)

    @property
    def requests(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._log)

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()

    def find_requests(self, pattern: str, method: str | None = None) -> list[LoggedRequest]:
        rx = re.compile(pattern)
        return [
            r
            for r in self.requests
            if rx.search(r.path) and (method is None or r.method == method.upper())
        ]

    def create_repo(
        self,
        repo_id: str,
        repo_type: str = "model",
        *,
        private: bool = False,
        exist_ok: bool = True,
    ) -> None:
        """Create a repo directly (no HTTP)."""
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                if exist_ok:
                    return
                raise ValueError(f"{repo_type} repo {repo_id} exists")
            self._new_repo(repo_type, repo_id, private)

    def repo_exists(self, repo_id: str, repo_type: str = "model") -> bool:
        with self._lock:
            return (repo_type, repo_id) in self._repos

    def commit_files(
        self,
        repo_id: str,
        files: Mapping[str, bytes | str | Path],
        *,
        repo_type: str = "model",
        revision: str = "main",
        message: str = "Seed files",
        delete: Iterable[str] = (),
    ) -> str:
        """Commit files directly (no HTTP), creating the repo if needed. ``str`` values are text
        content, ``Path`` values are read from disk. Returns the head commit afterwards."""
        with self._lock:
            if (repo_type, repo_id) not in self._repos:
                self._new_repo(repo_type, repo_id, private=False)
            repo = self._repos[(repo_type, repo_id)]
            head = repo.branches.get(revision)
            if head is None:
                raise ValueError(f"no branch {revision!r} in {repo_id}")
            snapshot = dict(repo.commits[head]["files"])
            for path in delete:
                snapshot.pop(path, None)
            for path, value in files.items():
                _check_repo_path(path)
                if isinstance(value, Path):
                    data = value.read_bytes()
                elif isinstance(value, str):
                    data = value.encode()
                else:
                    data = bytes(value)
                snapshot[path] = self._store_entry(data, lfs=len(data) > self.lfs_threshold)
            return self._commit(repo, revision, snapshot, message, "")

    def head(self, repo_id: str, repo_type: str = "model", revision: str = "main") -> str:
        with self._lock:
            return self._resolve(self._repo_or_raise(repo_type, repo_id), revision)

    def commits(
        self, repo_id: str, repo_type: str = "model", revision: str = "main"
    ) -> list[dict[str, Any]]:
        """The history reachable from ``revision``, newest first (copies of the commit records)."""
        with self._lock:
            repo = self._repo_or_raise(repo_type, repo_id)
            return [json.loads(json.dumps(c)) for c in self._history(repo, revision)]

    def commit_count(self, repo_id: str, repo_type: str = "model", revision: str = "main") -> int:
        """Number of commits reachable from ``revision`` (the initial commit included)."""
        with self._lock:
            return len(self._history(self._repo_or_raise(repo_type, repo_id), revision))

    def list_files(
        self, repo_id: str, repo_type: str = "model", revision: str = "main"
    ) -> list[str]:
        with self._lock:
            return sorted(self._snapshot(repo_type, repo_id, revision))

    def file_info(
        self, repo_id: str, path: str, repo_type: str = "model", revision: str = "main"
    ) -> dict[str, Any]:
        """``{"sha256", "sha1", "size", "lfs"}`` of a file (KeyError if absent)."""
        with self._lock:
            return dict(self._snapshot(repo_type, repo_id, revision)[path])

    def read_file(
        self, repo_id: str, path: str, repo_type: str = "model", revision: str = "main"
    ) -> bytes:
        return self._blob_path(
            self.file_info(repo_id, path, repo_type, revision)["sha256"]
        ).read_bytes()

    def tags(self, repo_id: str, repo_type: str = "model") -> dict[str, str]:
        with self._lock:
            return dict(self._repo_or_raise(repo_type, repo_id).tags)

    def branches(self, repo_id: str, repo_type: str = "model") -> dict[str, str]:
        with self._lock:
            return dict(self._repo_or_raise(repo_type, repo_id).branches)

    # ------------------------------------------------------------------ storage
    def _repo_file(self, repo: _Repo) -> Path:
        return self.root / "repos" / repo.repo_type / f"{repo.repo_id}.json"

    def _save(self, repo: _Repo) -> None:
        path = self._repo_file(repo)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{threading.get_ident()}")
        tmp.write_text(json.dumps(repo.to_json()))
        tmp.replace(path)

    def _load(self) -> None:
        repos_dir = self.root / "repos"
        if not repos_dir.is_dir():
            return
        for path in repos_dir.glob("*/*/*.json"):
            data = json.loads(path.read_text())
            repo = _Repo(**data)
            self._repos[(repo.repo_type, repo.repo_id)] = repo

    def _blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256[:2] / sha256

    def _store_blob(self, data: bytes) -> str:
        sha256 = hashlib.sha256(data).hexdigest()
        path = self._blob_path(sha256)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.root / "tmp" / f"{sha256}.{secrets.token_hex(4)}"
            tmp.write_bytes(data)
            tmp.replace(path)
        return sha256

    def _store_entry(self, data: bytes, *, lfs: bool) -> dict[str, Any]:
        return {
            "sha256": self._store_blob(data),
            "sha1": git_blob_sha1(data),
            "size": len(data),
            "lfs": bool(lfs),
        }

    def _new_repo(self, repo_type: str, repo_id: str, private: bool) -> _Repo:
        repo = _Repo(repo_type=repo_type, repo_id=repo_id, private=private, created_at=_now_iso())
        self._repos[(repo_type, repo_id)] = repo
        files: dict[str, Any] = {}
        if self.initial_gitattributes:
            files[".gitattributes"] = self._store_entry(_GITATTRIBUTES, lfs=False)
        self._commit(repo, "main", files, "initial commit", "", parent=None)
        return repo

    def _commit(
        self,
        repo: _Repo,
        branch: str,
        files: dict[str, Any],
        title: str,
        message: str,
        *,
        parent: str | None | bool = True,
    ) -> str:
        """Record a snapshot on ``branch``; a snapshot equal to the parent's is no new commit."""
        parent_sha = repo.branches.get(branch) if parent is True else parent
        if parent_sha is not None and repo.commits[parent_sha]["files"] == files:
            return parent_sha
        self._counter += 1
        seed = json.dumps([parent_sha, files, title, message, self._counter, time.time_ns()])
        sha = hashlib.sha1(seed.encode()).hexdigest()
        repo.commits[sha] = {
            "id": sha,
            "parents": [parent_sha] if parent_sha else [],
            "title": title,
            "message": message,
            "date": _now_iso(),
            "files": files,
        }
        repo.branches[branch] = sha
        self._save(repo)
        return sha

    def _history(self, repo: _Repo, revision: str) -> list[dict[str, Any]]:
        sha: str | None = self._resolve(repo, revision)
        out = []
        while sha:
            commit = repo.commits[sha]
            out.append(commit)
            sha = commit["parents"][0] if commit["parents"] else None
        return out

    def _snapshot(self, repo_type: str, repo_id: str, revision: str) -> dict[str, Any]:
        repo = self._repo_or_raise(repo_type, repo_id)
        return repo.commits[self._resolve(repo, revision)]["files"]

    def _repo_or_raise(self, repo_type: str, repo_id: str) -> _Repo:
        repo = self._repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, "Repository not found", code="RepoNotFound")
        return repo

    def _resolve(self, repo: _Repo, revision: str) -> str:
        rev = revision
        for prefix in ("refs/heads/", "refs/tags/"):
            if rev.startswith(prefix):
                rev = rev[len(prefix) :]
        if rev in repo.branches:
            return repo.branches[rev]
        if rev in repo.tags:
            return repo.tags[rev]
        if rev in repo.commits:
            return rev
        if re.fullmatch(r"[0-9a-f]{7,40}", rev):
            matches = [sha for sha in repo.commits if sha.startswith(rev)]
            if len(matches) == 1:
                return matches[0]
        raise HubError(404, f"Invalid rev id: {revision}", code="RevisionNotFound")

    # ------------------------------------------------------------------ auth
    def _auth(self, headers: Mapping[str, str]) -> tuple[str | None, str | None]:
        """(user, role) of the request; role None when anonymous. Raises 401 on a bad token."""
        value = headers.get("Authorization")
        if not value:
            return None, None
        scheme, _, token = value.partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer":
            with self._lock:
                if token in self.write_tokens:
                    return self.write_tokens[token], "write"
                if token in self.read_tokens:
                    return self.read_tokens[token], "read"
        raise HubError(401, _INVALID_CREDENTIALS, headers={"X-Error-Message": _INVALID_CREDENTIALS})

    @staticmethod
    def _require_write(role: str | None, what: str) -> None:
        if role is None:
            raise HubError(401, "Invalid username or password.")
        if role != "write":
            msg = f"You don't have the rights to write to {what}"
            raise HubError(403, msg, headers={"X-Error-Message": msg})

    def _readable_repo(self, repo_type: str, repo_id: str, role: str | None) -> _Repo:
        repo = self._repo_or_raise(repo_type, repo_id)
        if repo.private and role is None:
            raise HubError(404, "Repository not found", code="RepoNotFound")
        return repo

    # ------------------------------------------------------------------ faults / log
    def _take_fault(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if (
                    fault.remaining > 0
                    and (fault.method in (None, method))
                    and fault.pattern.search(path)
                ):
                    fault.remaining -= 1
                    return fault
            return None

    def _record(
        self, method: str, path: str, query: str, status: int, headers: dict[str, str], sent: int
    ) -> None:
        with self._lock:
            self._log.append(LoggedRequest(method, path, query, status, headers, time.time(), sent))

    def _sign(self, *parts: object) -> str:
        msg = ":".join(str(p) for p in parts).encode()
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest()

    def _signed_url(self, kind: str, oid: str, size: int, *extra: object) -> str:
        tail = "/".join(str(e) for e in extra)
        path = f"/_lfs/{kind}/{oid}" + (f"/{tail}" if tail else "")
        query = urlencode({"size": size, "sig": self._sign(kind, oid, size, *extra)})
        return f"{self.url}{path}?{query}"

    # ------------------------------------------------------------------ dispatch
    def handle(
        self,
        method: str,
        raw_path: str,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        body: bytes,
    ) -> tuple[int, dict[str, str], bytes | None, Any]:
        """Route a request. Returns (status, headers, raw body or None, JSON body)."""
        raw = [s for s in raw_path.split("/") if s != ""]
        seg = [unquote(s) for s in raw]
        if seg[:2] == ["_lfs", "upload"] and method == "PUT":
            return self._lfs_put(seg, query, body, part=None)
        if seg[:2] == ["_lfs", "part"] and method == "PUT":
            return self._lfs_put(seg, query, body, part=int(seg[3]))
        if seg[:2] == ["_lfs", "complete"] and method == "POST":
            return self._lfs_complete(seg, query, body)
        user, role = self._auth(headers)
        if seg[:2] == ["_lfs", "verify"] and method == "POST":
            return self._lfs_verify(body)
        if seg and seg[0] == "api":
            return self._api(method, seg[1:], query, body, user, role)
        # /[datasets/|spaces/]NS/NAME(.git/info/lfs/objects/batch | /resolve/REV/PATH)
        repo_type = "model"
        if seg and seg[0] in ("datasets", "spaces"):
            repo_type = _TYPE_BY_PLURAL[seg[0]]
            seg = seg[1:]
        if (
            len(seg) >= 6
            and seg[1].endswith(".git")
            and seg[2:] == ["info", "lfs", "objects", "batch"]
        ):
            return self._lfs_batch(repo_type, f"{seg[0]}/{seg[1][:-4]}", body, role)
        if len(seg) >= 5 and seg[2] == "resolve" and method in ("GET", "HEAD"):
            repo_id = f"{seg[0]}/{seg[1]}"
            return self._resolve_file(repo_type, repo_id, seg[3], "/".join(seg[4:]), headers, role)
        raise HubError(404, f"Not found: {raw_path}")

    def _api(
        self,
        method: str,
        seg: list[str],
        query: dict[str, list[str]],
        body: bytes,
        user: str | None,
        role: str | None,
    ) -> tuple[int, dict[str, str], bytes | None, Any]:
        if seg == ["repos", "create"] and method == "POST":
            return self._create_repo(_json(body), user, role)
        if seg == ["repos", "delete"] and method == "DELETE":
            return self._delete_repo(_json(body), user, role)
        if seg == ["validate-yaml"] and method == "POST":
            return _validate_yaml(_json(body))
        if seg == ["whoami-v2"] and method == "GET":
            if role is None:
                raise HubError(401, "Invalid username or password.")
            access = {"role": role, "displayName": "test"}
            return 200, {}, None, {"type": "user", "name": user, "auth": {"accessToken": access}}
        if len(seg) < 3 or seg[0] not in _TYPE_BY_PLURAL:
            raise HubError(404, f"Not found: /api/{'/'.join(seg)}")
        repo_type = _TYPE_BY_PLURAL[seg[0]]
        repo_id = f"{seg[1]}/{seg[2]}"
        rest = seg[3:]
        action = rest[0] if rest else None
        with self._lock:
            if action is None and method == "GET":
                return self._repo_info(repo_type, repo_id, "main", query, role)
            if action == "revision" and len(rest) >= 2 and method == "GET":
                return self._repo_info(repo_type, repo_id, "/".join(rest[1:]), query, role)
            if action == "tree" and len(rest) >= 2 and method == "GET":
                return self._tree(repo_type, repo_id, rest[1], "/".join(rest[2:]), query, role)
            if action == "paths-info" and len(rest) == 2 and method == "POST":
                return self._paths_info(repo_type, repo_id, rest[1], body, role)
            if action == "preupload" and len(rest) == 2 and method == "POST":
                return self._preupload(repo_type, repo_id, rest[1], query, body, role)
            if action == "commit" and len(rest) == 2 and method == "POST":
                return self._commit_api(repo_type, repo_id, rest[1], query, body, role)
            if action == "commits" and len(rest) == 2 and method == "GET":
                return self._commits_api(repo_type, repo_id, rest[1], role)
            if action == "refs" and method == "GET":
                return self._refs(repo_type, repo_id, role)
            if action == "tag" and len(rest) == 2 and method in ("POST", "DELETE"):
                return self._tag(method, repo_type, repo_id, rest[1], body, role)
            if action == "branch" and len(rest) == 2 and method in ("POST", "DELETE"):
                return self._branch(method, repo_type, repo_id, rest[1], body, role)
        raise HubError(404, f"Not found: /api/{'/'.join(seg)}")

    # ------------------------------------------------------------------ repos
    def _repo_url(self, repo_type: str, repo_id: str) -> str:
        return f"{self.url}/{_URL_PREFIX[repo_type]}{repo_id}"

    def _create_repo(self, payload: dict, user: str | None, role: str | None):
        self._require_write(role, "this namespace")
        name = payload.get("name")
        namespace = payload.get("organization") or user or DEFAULT_USER
        repo_type = payload.get("type") or "model"
        if repo_type not in _URL_PREFIX:
            raise HubError(400, f"Invalid repo type {repo_type!r}")
        if not isinstance(name, str) or not _NAME_RE.match(name) or not _NAME_RE.match(namespace):
            raise HubError(400, f"Invalid repo name {namespace}/{name}")
        if ".." in name or ".." in namespace:
            raise HubError(400, f"Invalid repo name {namespace}/{name}")
        private = bool(payload.get("private")) or payload.get("visibility") == "private"
        repo_id = f"{namespace}/{name}"
        url = self._repo_url(repo_type, repo_id)
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                msg = f"You already created this {repo_type} repo"
                return 409, {}, None, {"error": msg, "url": url}
            self._new_repo(repo_type, repo_id, private)
        return 200, {}, None, {"url": url, "name": repo_id, "id": repo_id}

    def _delete_repo(self, payload: dict, user: str | None, role: str | None):
        self._require_write(role, "this namespace")
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload.get('organization') or user or DEFAULT_USER}/{payload.get('name')}"
        with self._lock:
            repo = self._repo_or_raise(repo_type, repo_id)
            del self._repos[(repo_type, repo_id)]
            self._repo_file(repo).unlink(missing_ok=True)
        return 200, {}, None, {}

    def _repo_info(self, repo_type: str, repo_id: str, revision: str, query, role):
        repo = self._readable_repo(repo_type, repo_id, role)
        sha = self._resolve(repo, revision)
        commit = repo.commits[sha]
        blobs = _truthy(query.get("blobs"))
        siblings = []
        for path, entry in sorted(commit["files"].items()):
            sib: dict[str, Any] = {"rfilename": path}
            if blobs:
                sib["size"] = entry["size"]
                sib["blobId"] = _tree_oid(entry)
                if entry["lfs"]:
                    sib["lfs"] = {
                        "size": entry["size"],
                        "sha256": entry["sha256"],
                        "pointerSize": len(_lfs_pointer(entry["sha256"], entry["size"])),
                    }
            siblings.append(sib)
        info = {
            "_id": hashlib.md5(f"{repo_type}/{repo_id}".encode()).hexdigest()[:24],
            "id": repo_id,
            "author": repo_id.split("/")[0],
            "sha": sha,
            "lastModified": commit["date"],
            "createdAt": repo.created_at,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
        }
        if repo_type == "model":
            info["modelId"] = repo_id
        return 200, {}, None, info

    # ------------------------------------------------------------------ tree
    def _entries(self, commit: dict, base: str, recursive: bool) -> list[dict[str, Any]]:
        files = commit["files"]
        prefix = f"{base}/" if base else ""
        if base and base not in files and not any(p.startswith(prefix) for p in files):
            raise HubError(404, f"{base} does not exist", code="EntryNotFound")
        if base in files:  # a file path: list that file alone
            return [self._file_entry(base, files[base])]
        dirs: dict[str, list[str]] = {}
        out_files = []
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            rel = path[len(prefix) :]
            parts = rel.split("/")
            for i in range(1, len(parts)):
                if not recursive and i > 1:
                    break
                dirs.setdefault(prefix + "/".join(parts[:i]), []).append(path)
            if recursive or len(parts) == 1:
                out_files.append(self._file_entry(path, files[path]))
        out_dirs = [
            {"type": "directory", "oid": _dir_oid(d, files), "size": 0, "path": d}
            for d in sorted(dirs)
        ]
        return out_dirs + out_files

    @staticmethod
    def _file_entry(path: str, entry: dict[str, Any]) -> dict[str, Any]:
        item: dict[str, Any] = {
            "type": "file",
            "oid": _tree_oid(entry),
            "size": entry["size"],
            "path": path,
        }
        if entry["lfs"]:
            item["lfs"] = {
                "oid": entry["sha256"],
                "size": entry["size"],
                "pointerSize": len(_lfs_pointer(entry["sha256"], entry["size"])),
            }
        return item

    def _with_last_commit(self, repo: _Repo, sha: str, items: list[dict]) -> list[dict]:
        history = self._history(repo, sha)
        for item in items:
            path = item["path"]
            last = history[-1]
            for older, newer in zip(history[1:], history, strict=False):
                if _subtree(newer["files"], path) != _subtree(older["files"], path):
                    last = newer
                    break
            item["lastCommit"] = {"id": last["id"], "title": last["title"], "date": last["date"]}
        return items

    def _tree(self, repo_type, repo_id, revision, path, query, role):
        repo = self._readable_repo(repo_type, repo_id, role)
        sha = self._resolve(repo, revision)
        recursive = _truthy(query.get("recursive"))
        expand = _truthy(query.get("expand"))
        items = self._entries(repo.commits[sha], path.strip("/"), recursive)
        page_size = min(self.tree_page_size, 50) if expand else self.tree_page_size
        cursor = int((query.get("cursor") or ["0"])[0])
        page = items[cursor : cursor + page_size]
        if expand:
            page = self._with_last_commit(repo, sha, page)
        headers = {}
        if cursor + page_size < len(items):
            next_query = {k: v[0] for k, v in query.items()}
            next_query["cursor"] = str(cursor + page_size)
            quoted_path = "/" + quote(path, safe="") if path else ""
            next_url = (
                f"{self.url}/api/{repo_type}s/{repo_id}/tree/{quote(revision, safe='')}{quoted_path}"
                f"?{urlencode(next_query)}"
            )
            headers["Link"] = f'<{next_url}>; rel="next"'
        return 200, headers, None, page

    def _paths_info(self, repo_type, repo_id, revision, body, role):
        repo = self._readable_repo(repo_type, repo_id, role)
        sha = self._resolve(repo, revision)
        try:
            payload = json.loads(body) if body.strip().startswith(b"{") else None
        except ValueError:
            payload = None
        if payload is None:
            form = parse_qs(body.decode(), keep_blank_values=True)
            paths = form.get("paths", [])
            expand = _truthy(form.get("expand"))
        else:
            paths = payload.get("paths", [])
            paths = [paths] if isinstance(paths, str) else paths
            expand = bool(payload.get("expand"))
        files = repo.commits[sha]["files"]
        out = []
        for raw_path in paths:
            path = raw_path.strip("/")
            if path in files:
                out.append(self._file_entry(path, files[path]))
            elif path and any(p.startswith(path + "/") for p in files):
                out.append(
                    {"type": "directory", "oid": _dir_oid(path, files), "size": 0, "path": path}
                )
        if expand:
            out = self._with_last_commit(repo, sha, out)
        return 200, {}, None, out

    # ------------------------------------------------------------------ upload
    def _writable_branch(self, repo_type, repo_id, revision, role) -> tuple[_Repo, str]:
        repo = self._readable_repo(repo_type, repo_id, role)
        self._require_write(role, f"{repo_type}s/{repo_id}")
        branch = revision[len("refs/heads/") :] if revision.startswith("refs/heads/") else revision
        if branch not in repo.branches:
            raise HubError(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        return repo, branch

    def _preupload(self, repo_type, repo_id, revision, query, body, role):
        repo, branch = self._writable_branch(repo_type, repo_id, revision, role)
        if _truthy(query.get("create_pr")):
            raise HubError(400, "Pull requests are not supported by the test server")
        payload = _json(body)
        head = repo.branches[branch]
        files = repo.commits[head]["files"]
        out = []
        for item in payload.get("files", []):
            path, size = item["path"], int(item["size"])
            mode = "lfs" if size > self.lfs_threshold else "regular"
            result: dict[str, Any] = {"path": path, "uploadMode": mode, "shouldIgnore": False}
            existing = files.get(path)
            if existing is not None:
                result["oid"] = existing["sha256"] if mode == "lfs" else existing["sha1"]
            out.append(result)
        return 200, {}, None, {"files": out, "commitOid": head}

    def _lfs_batch(self, repo_type, repo_id, body, role):
        with self._lock:
            self._readable_repo(repo_type, repo_id, role)
            self._require_write(role, f"{repo_type}s/{repo_id}")
        payload = _json(body)
        if payload.get("operation") != "upload":
            raise HubError(400, "Only the LFS 'upload' operation is supported")
        objects = []
        chunk = self.lfs_multipart_chunk_size
        for obj in payload.get("objects", []):
            oid, size = obj.get("oid"), obj.get("size")
            if not isinstance(oid, str) or not _SHA256_RE.match(oid) or not isinstance(size, int):
                raise HubError(422, f"Invalid LFS object {obj!r}")
            path = self._blob_path(oid)
            if path.exists() and path.stat().st_size == size:
                objects.append({"oid": oid, "size": size})
                continue
            verify = {"href": f"{self.url}/_lfs/verify"}
            if chunk and size > chunk:
                n_parts = -(-size // chunk)
                header: dict[str, str] = {"chunk_size": str(chunk)}
                for part in range(1, n_parts + 1):
                    header[str(part)] = self._signed_url("part", oid, size, part)
                upload = {"href": self._signed_url("complete", oid, size), "header": header}
            else:
                upload = {"href": self._signed_url("upload", oid, size)}
            objects.append(
                {
                    "oid": oid,
                    "size": size,
                    "authenticated": True,
                    "actions": {"upload": upload, "verify": verify},
                }
            )
        headers = {"Content-Type": "application/vnd.git-lfs+json"}
        return 200, headers, None, {"transfer": "basic", "objects": objects}

    def _check_sig(self, kind: str, oid: str, query, *extra: object) -> int:
        size = int((query.get("size") or ["-1"])[0])
        sig = (query.get("sig") or [""])[0]
        if not hmac.compare_digest(sig, self._sign(kind, oid, size, *extra)):
            raise HubError(403, "Invalid or expired upload signature")
        return size

    def _lfs_put(self, seg, query, body, *, part: int | None):
        oid = seg[2]
        if part is None:
            size = self._check_sig("upload", oid, query)
            if len(body) != size or hashlib.sha256(body).hexdigest() != oid:
                raise HubError(400, "Uploaded content does not match its oid/size")
            self._store_blob(body)
            return 200, {"ETag": f'"{oid}"'}, b"", None
        self._check_sig("part", oid, query, part)
        parts_dir = self.root / "tmp" / f"parts-{oid}"
        parts_dir.mkdir(parents=True, exist_ok=True)
        (parts_dir / str(part)).write_bytes(body)
        return 200, {"ETag": f'"{hashlib.md5(body).hexdigest()}"'}, b"", None

    def _lfs_complete(self, seg, query, body):
        oid = seg[2]
        size = self._check_sig("complete", oid, query)
        payload = _json(body)
        parts_dir = self.root / "tmp" / f"parts-{oid}"
        data = b""
        for part in sorted(payload.get("parts", []), key=lambda p: p["partNumber"]):
            chunk = (parts_dir / str(part["partNumber"])).read_bytes()
            if part["etag"].strip('"') != hashlib.md5(chunk).hexdigest():
                raise HubError(400, f"ETag mismatch for part {part['partNumber']}")
            data += chunk
        if len(data) != size or hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, "Assembled content does not match its oid/size")
        self._store_blob(data)
        shutil.rmtree(parts_dir, ignore_errors=True)
        return 200, {}, None, {}

    def _lfs_verify(self, body):
        payload = _json(body)
        oid, size = payload.get("oid", ""), payload.get("size")
        path = self._blob_path(oid) if _SHA256_RE.match(str(oid)) else None
        if path is None or not path.exists() or path.stat().st_size != size:
            raise HubError(404, f"LFS object {oid} not found")
        return 200, {}, None, {}

    def _commit_api(self, repo_type, repo_id, revision, query, body, role):
        repo, branch = self._writable_branch(repo_type, repo_id, revision, role)
        if _truthy(query.get("create_pr")):
            raise HubError(400, "Pull requests are not supported by the test server")
        try:
            items = [json.loads(line) for line in body.splitlines() if line.strip()]
        except ValueError as err:
            raise HubError(400, f"Malformed NDJSON commit payload: {err}") from None
        if not items or items[0].get("key") != "header":
            raise HubError(400, "The first line of a commit payload must be its header")
        header = items[0]["value"]
        head = repo.branches[branch]
        parent = header.get("parentCommit")
        if parent and not head.startswith(parent):
            raise HubError(412, f"A commit has happened since {parent}: the head is {head}")
        files = dict(repo.commits[head]["files"])
        for item in items[1:]:
            key, value = item.get("key"), item.get("value") or {}
            path = value.get("path", "")
            if key in ("file", "lfsFile"):
                _check_repo_path(path)
            if key == "file":
                content = value.get("content", "")
                if value.get("encoding", "base64") == "base64":
                    data = base64.b64decode(content)
                else:
                    data = content.encode()
                files[path] = self._store_entry(data, lfs=False)
            elif key == "lfsFile":
                oid = value.get("oid", "")
                blob = self._blob_path(oid) if _SHA256_RE.match(oid) else None
                if blob is None or not blob.exists():
                    raise HubError(422, f"LFS object {oid} for {path} was not uploaded")
                size = blob.stat().st_size
                if value.get("size") is not None and int(value["size"]) != size:
                    raise HubError(422, f"LFS object {oid} has size {size}, not {value['size']}")
                data_sha1 = git_blob_sha1(blob.read_bytes())
                files[path] = {"sha256": oid, "sha1": data_sha1, "size": size, "lfs": True}
            elif key == "deletedFile":
                if path not in files:
                    raise HubError(
                        404, f"A file with this name doesn't exist: {path}", code="EntryNotFound"
                    )
                del files[path]
            elif key == "deletedFolder":
                prefix = path.rstrip("/") + "/"
                doomed = [p for p in files if p.startswith(prefix)]
                if not doomed:
                    raise HubError(
                        404, f"A folder with this name doesn't exist: {path}", code="EntryNotFound"
                    )
                for p in doomed:
                    del files[p]
            else:
                raise HubError(400, f"Unknown commit operation {key!r}")
        sha = self._commit(
            repo, branch, files, header.get("summary") or "", header.get("description") or ""
        )
        commit_url = f"{self._repo_url(repo_type, repo_id)}/commit/{sha}"
        result = {
            "success": True,
            "commitOid": sha,
            "commitUrl": commit_url,
            "hookOutput": "",
            "pullRequestUrl": None,
        }
        return 200, {}, None, result

    # ------------------------------------------------------------------ refs
    def _commits_api(self, repo_type, repo_id, revision, role):
        repo = self._readable_repo(repo_type, repo_id, role)
        out = [
            {
                "id": c["id"],
                "title": c["title"],
                "message": c["message"],
                "authors": [{"user": DEFAULT_USER}],
                "date": c["date"],
            }
            for c in self._history(repo, revision)
        ]
        return 200, {}, None, out

    def _refs(self, repo_type, repo_id, role):
        repo = self._readable_repo(repo_type, repo_id, role)
        branches = [
            {"name": n, "ref": f"refs/heads/{n}", "targetCommit": s}
            for n, s in sorted(repo.branches.items())
        ]
        tags = [
            {"name": n, "ref": f"refs/tags/{n}", "targetCommit": s}
            for n, s in sorted(repo.tags.items())
        ]
        return (
            200,
            {},
            None,
            {"branches": branches, "tags": tags, "converts": [], "pullRequests": []},
        )

    def _tag(self, method, repo_type, repo_id, name_or_rev, body, role):
        repo = self._readable_repo(repo_type, repo_id, role)
        self._require_write(role, f"{repo_type}s/{repo_id}")
        if method == "DELETE":
            if name_or_rev not in repo.tags:
                raise HubError(404, f"Tag {name_or_rev} not found", code="RevisionNotFound")
            del repo.tags[name_or_rev]
            self._save(repo)
            return 200, {}, None, {}
        sha = self._resolve(repo, name_or_rev)
        tag = _json(body).get("tag")
        if not isinstance(tag, str) or not re.fullmatch(r"[A-Za-z0-9._/-]+", tag) or ".." in tag:
            raise HubError(400, f"Invalid tag name {tag!r}")
        if tag in repo.tags or tag in repo.branches:
            raise HubError(409, f"Tag {tag} already exists")
        repo.tags[tag] = sha
        self._save(repo)
        return 200, {}, None, {}

    def _branch(self, method, repo_type, repo_id, branch, body, role):
        repo = self._readable_repo(repo_type, repo_id, role)
        self._require_write(role, f"{repo_type}s/{repo_id}")
        if method == "DELETE":
            if branch not in repo.branches or branch == "main":
                raise HubError(404, f"Branch {branch} not found", code="RevisionNotFound")
            del repo.branches[branch]
            self._save(repo)
            return 200, {}, None, {}
        if branch in repo.branches or branch in repo.tags:
            raise HubError(409, f"Reference {branch} already exists")
        start = (_json(body) if body.strip() else {}).get("startingPoint") or "main"
        repo.branches[branch] = self._resolve(repo, start)
        self._save(repo)
        return 200, {}, None, {}

    # ------------------------------------------------------------------ download
    def _resolve_file(self, repo_type, repo_id, revision, path, headers, role):
        with self._lock:
            repo = self._readable_repo(repo_type, repo_id, role)
            sha = self._resolve(repo, revision)
            entry = repo.commits[sha]["files"].get(path)
        if entry is None:
            raise HubError(
                404,
                f"Entry not found: {path}",
                code="EntryNotFound",
                headers={"X-Repo-Commit": sha},
            )
        etag = entry["sha256"] if entry["lfs"] else entry["sha1"]
        out = {
            "X-Repo-Commit": sha,
            "ETag": f'"{etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'inline; filename="{path.rsplit("/", 1)[-1]}"',
        }
        if entry["lfs"]:
            out["X-Linked-Etag"] = f'"{etag}"'
            out["X-Linked-Size"] = str(entry["size"])
        data = self._blob_path(entry["sha256"]).read_bytes()
        size = len(data)
        range_header = headers.get("Range")
        if range_header:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", range_header.strip())
            if not m or (m.group(1) == "" and m.group(2) == ""):
                raise HubError(416, "Invalid range", headers={"Content-Range": f"bytes */{size}"})
            if m.group(1) == "":
                start, end = max(size - int(m.group(2)), 0), size - 1
            else:
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if start >= size or start > end:
                raise HubError(
                    416, "Range not satisfiable", headers={"Content-Range": f"bytes */{size}"}
                )
            out["Content-Range"] = f"bytes {start}-{end}/{size}"
            return 206, out, data[start : end + 1], None
        return 200, out, data, None


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"
    server_version = "LeRobotPipeTestHub/1.0"
    timeout = 60
    # One buffered write per response (flushed by handle_one_request) and no Nagle delay: without
    # these, headers and body go out as separate small segments and each request waits ~40 ms.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr logging
        pass

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _serve(self) -> None:
        hub = self.hub
        split = urlsplit(self.path)
        method = self.command
        headers = {key.title(): value for key, value in self.headers.items()}
        status = 500
        self._sent = 0
        try:
            body = self._read_body()
            query = parse_qs(split.query, keep_blank_values=True)
            fault = hub._take_fault(method, split.path)
            if fault is not None and fault.truncate:
                status, out_headers, raw, payload = hub.handle(
                    method, split.path, query, headers, body
                )
                self._send(status, out_headers, raw, payload, truncate=True)
                self.close_connection = True
                return
            if fault is not None and fault.after:
                with contextlib.suppress(HubError):
                    hub.handle(method, split.path, query, headers, body)
            if fault is not None and fault.status == 0:
                status = 0
                self.close_connection = True
                return
            if fault is not None:
                status = fault.status
                payload = (
                    fault.body
                    if fault.body is not None
                    else {"error": f"Injected fault ({status})"}
                )
                self._send(status, dict(fault.headers), None, payload)
                return
            try:
                status, out_headers, raw, payload = hub.handle(
                    method, split.path, query, headers, body
                )
            except HubError as err:
                status, out_headers, raw = err.status, dict(err.headers), None
                payload = {"error": err.message}
                if err.code:
                    out_headers["X-Error-Code"] = err.code
                    out_headers.setdefault("X-Error-Message", err.message)
            except Exception as err:  # a server bug: answer 500 with the reason
                status, out_headers, raw = 500, {}, None
                payload = {"error": f"Internal test-server error: {type(err).__name__}: {err}"}
            self._send(status, out_headers, raw, payload)
        finally:
            hub._record(method, split.path, split.query, status, headers, self._sent)

    def _send(
        self,
        status: int,
        headers: dict[str, str],
        raw: bytes | None,
        payload: Any,
        *,
        truncate: bool = False,
    ) -> None:
        if raw is None:
            raw = json.dumps(payload).encode() if payload is not None else b""
            headers.setdefault("Content-Type", "application/json")
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":
            body = raw[: len(raw) // 2] if truncate else raw
            self.wfile.write(body)
            self._sent = len(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _serve


# ---------------------------------------------------------------------- helpers
def _token_map(tokens: Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    if isinstance(tokens, Mapping):
        return dict(tokens)
    return dict.fromkeys(tokens, DEFAULT_USER)


def _json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except ValueError as err:
        raise HubError(400, f"Malformed JSON body: {err}") from None
    if not isinstance(data, dict):
        raise HubError(400, "Expected a JSON object")
    return data


def _truthy(values: list[str] | None) -> bool:
    return bool(values) and values[0].lower() in ("1", "true", "yes")


def _check_repo_path(path: str) -> None:
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise HubError(400, f"Invalid path in repo: {path!r}")
    if parts[0] == ".git":
        raise HubError(400, f"Invalid path in repo: {path!r}")


def _tree_oid(entry: dict[str, Any]) -> str:
    """The git oid the Hub lists: of the content, or of the LFS pointer file for LFS files."""
    if entry["lfs"]:
        return git_blob_sha1(_lfs_pointer(entry["sha256"], entry["size"]))
    return entry["sha1"]


def _subtree(files: dict[str, Any], path: str) -> Any:
    if path in files:
        return files[path]
    prefix = path + "/"
    return sorted((p, e["sha256"]) for p, e in files.items() if p.startswith(prefix))


def _dir_oid(path: str, files: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(_subtree(files, path)).encode()).hexdigest()


def _validate_yaml(payload: dict[str, Any]) -> tuple[int, dict[str, str], None, dict[str, Any]]:
    content = payload.get("content") or ""
    lines = content.splitlines()
    if lines and lines[0].strip() == "---" and not any(line.strip() == "---" for line in lines[1:]):
        errors = [{"message": "The YAML front matter is not closed by a '---' line"}]
        return 400, {}, None, {"errors": errors, "warnings": []}
    return 200, {}, None, {"errors": [], "warnings": []}


__all__ = [
    "DEFAULT_LFS_THRESHOLD",
    "DEFAULT_READ_TOKEN",
    "DEFAULT_USER",
    "DEFAULT_WRITE_TOKEN",
    "HubError",
    "HubServer",
    "LoggedRequest",
    "git_blob_sha1",
]
