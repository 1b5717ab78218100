"""pytest fixtures for a local Hugging Face Hub server (``tests/hub_server.py``).

Not a conftest: import the fixtures you want into a folder's ``conftest.py`` or a test module.
``tests/`` is on pytest's ``pythonpath`` (pyproject), so::

    # tests/<folder>/conftest.py
    from conftest_hub import hub_server  # noqa: F401  (function scope)
    from conftest_hub import hub_server_module  # noqa: F401  (module scope)
    from conftest_hub import hub_snapshot, local_files  # helpers

    # or a customised one (any HubServer keyword):
    from conftest_hub import make_hub_server_fixture

    small_lfs_hub = make_hub_server_fixture(scope="module", lfs_threshold=1024)

(Outside pytest, put ``tests/`` on ``sys.path`` first.)

and in a test::

    from huggingface_hub import HfApi, snapshot_download

    def test_roundtrip(hub_server, tmp_path):
        api = HfApi(endpoint=hub_server.url, token=hub_server.token)
        api.create_repo("alice/ds", repo_type="dataset")
        api.upload_folder(repo_id="alice/ds", repo_type="dataset", folder_path=...)
        path = snapshot_download(
            "alice/ds", repo_type="dataset", local_dir=tmp_path / "dl",
            endpoint=hub_server.url, token=hub_server.token, cache_dir=hub_server.cache_dir,
        )
        # or: path = hub_snapshot(hub_server, "alice/ds", tmp_path / "dl", repo_type="dataset")

What the fixture gives:

* a started ``HubServer`` (``.url``, ``.token`` (write), ``.read_token``, ``.cache_dir``,
  ``.commit_count()``, ``.list_files()``, ``.read_file()``, ``.tags()``, ``.commit_files()`` to seed a
  repo without HTTP, ``.inject_fault()``, ``.requests``, ``.env()`` for subprocesses);
* while it runs, huggingface_hub's *import-time* settings are patched in-process (and restored
  afterwards): ``HF_HUB_DISABLE_XET`` on (plain LFS), offline mode off, ``HF_HUB_CACHE`` = the
  server's ``cache_dir``, and the default endpoint = the server, so even a call that forgets
  ``endpoint=`` cannot reach the real Hub. Still pass ``endpoint=hub_server.url`` explicitly: that
  is what production code must support.
* ``HF_TOKEN`` is NOT set: pass ``token=hub_server.token`` or ``monkeypatch.setenv("HF_TOKEN", ...)``.
* subprocesses (torchrun, snakemake, CLIs) read the settings at import: run them with
  ``env={**os.environ, **hub_server.env()}`` (HF_ENDPOINT, HF_HUB_DISABLE_XET, HF_TOKEN...).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if __package__:
    from .hub_server import HubServer
else:
    from hub_server import HubServer

__all__ = [
    "HubServer",
    "hub_client_settings",
    "hub_server",
    "hub_server_module",
    "hub_snapshot",
    "local_files",
    "make_hub_server_fixture",
]


@contextlib.contextmanager
def hub_client_settings(server: HubServer) -> Iterator[None]:
    """Point huggingface_hub's import-time settings at ``server`` for the duration (in-process)."""
    from huggingface_hub import constants

    patched: dict[str, Any] = {
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_CACHE": str(server.cache_dir),
        "ENDPOINT": server.url,
        "HUGGINGFACE_CO_URL_TEMPLATE": server.url + "/{repo_id}/resolve/{revision}/{filename}",
    }
    saved = {name: getattr(constants, name) for name in patched if hasattr(constants, name)}
    saved_env = os.environ.get("HF_HUB_DISABLE_XET")
    try:
        for name, value in patched.items():
            setattr(constants, name, value)
        os.environ["HF_HUB_DISABLE_XET"] = "1"
        _forget_transformers_client()
        yield
    finally:
        _forget_transformers_client()
        for name in patched:
            if name in saved:
                setattr(constants, name, saved[name])
            else:
                delattr(constants, name)
        if saved_env is None:
            os.environ.pop("HF_HUB_DISABLE_XET", None)
        else:
            os.environ["HF_HUB_DISABLE_XET"] = saved_env


def _forget_transformers_client() -> None:
    """transformers keeps one ``HfApi`` per process (``transformers.utils.hub.hf_api()``), its
    endpoint fixed when first made: made during an earlier test, it would call that test's
    stopped server, and a tokenizer load would wait ~45 s in huggingface_hub's retries before
    falling back to the cache. Each server's tests start without it."""
    import sys

    hub = sys.modules.get("transformers.utils.hub")
    if hub is not None and hasattr(hub, "_hf_api"):
        hub._hf_api = None


def make_hub_server_fixture(scope: str = "function", **server_kwargs: Any):
    """A pytest fixture yielding a started ``HubServer(**server_kwargs)`` (root in a tmp dir)."""

    @pytest.fixture(scope=scope)
    def _hub_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
        kwargs = dict(server_kwargs)
        kwargs.setdefault("root", tmp_path_factory.mktemp("hub-server"))
        with HubServer(**kwargs) as server, hub_client_settings(server):
            yield server

    return _hub_server


hub_server = make_hub_server_fixture(scope="function")
hub_server_module = make_hub_server_fixture(scope="module")


def hub_snapshot(
    server: HubServer,
    repo_id: str,
    local_dir: str | os.PathLike[str],
    *,
    repo_type: str = "model",
    revision: str | None = None,
    token: str | None = None,
    **kwargs: Any,
) -> Path:
    """``snapshot_download`` from ``server`` into ``local_dir`` (explicit endpoint/token/cache)."""
    from huggingface_hub import snapshot_download

    path = snapshot_download(
        repo_id,
        repo_type=repo_type,
        revision=revision,
        local_dir=local_dir,
        endpoint=server.url,
        token=token if token is not None else server.token,
        cache_dir=server.cache_dir,
        **kwargs,
    )
    return Path(path)


def local_files(folder: str | os.PathLike[str]) -> dict[str, bytes]:
    """{relative POSIX path: bytes} of the files under ``folder``, without ``.cache/`` (the
    download metadata snapshot_download keeps in ``local_dir``)."""
    root = Path(folder)
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] != ".cache"
    }
