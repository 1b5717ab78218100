"""What went wrong while publishing, in words a user can act on, and the retried request.

:class:`PublishError` is the one error the publisher raises: its message says what failed (the
step and the repo) and what to do about it: 401 (``HF_TOKEN`` / ``hf auth login``), 403, 404,
and no network (the cause, e.g. name resolution or connection refused, and the host); it never
contains the token. :func:`retrying` runs one request through the retry helper of
:mod:`lerobot_pipe.utils.hub_http` and words its final failure.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError

from lerobot_pipe.utils.hub_http import (
    HTTP_CLIENT,
    NETWORK_ERRORS,
    RetriesExhausted,
    Transient,
    exception_chain,
    redact,
    transient_failure,
    with_retries,
)

T = TypeVar("T")


class PublishError(RuntimeError):
    """Publishing failed; the message says why and what to do. Never contains the token."""


@dataclass
class Target:
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


def _failed_request(exc: BaseException) -> Any:
    """The HTTP request that failed (an ``HfHubHTTPError``'s or a transport error's), or None."""
    with contextlib.suppress(RuntimeError):  # httpx(2) raises when an error has no request
        if isinstance(exc, HfHubHTTPError):
            return exc.response.request
        return getattr(exc, "request", None)
    return None


def _network_cause(exc: BaseException, request: Any) -> str:
    host = request.url.host if request is not None else "the Hub"
    for e in exception_chain(exc):
        if isinstance(e, socket.gaierror):
            return f"name resolution failed for {host} ({e.strerror})"
        if isinstance(e, ConnectionRefusedError):
            return f"connection refused by {host}"
    if isinstance(exc, HTTP_CLIENT.TimeoutException):
        return f"no answer from {host} in time"
    return f"{type(exc).__name__}: {exc}"


def _describe(exc: BaseException, step: str, target: Target) -> str:
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
    if isinstance(exc, NETWORK_ERRORS):
        origin = f"{request.url.scheme}://{request.url.netloc.decode()}" if request else "the Hub"
        return (
            f"cannot reach {origin} while trying to {step} on {target.repo}: "
            f"{_network_cause(exc, request)}; check the network connection and the endpoint "
            "(HF_ENDPOINT)"
        )
    return f"failed to {step} on {target.repo}: {type(exc).__name__}: {exc}"


def retrying(
    target: Target,
    step: str,
    call: Callable[[], T],
    sent_once: Callable[[Any], bool] = lambda request: True,
) -> T:
    """Run ``call``, retrying its transient failures when ``sent_once(failed request)``.

    huggingface_hub 2.4 sends create_repo, repo_info, the commit request (``_send_commit`` without
    ``retry_on_error``) and the tag requests once, without its ``http_backoff``: those are the
    requests retried here, at most ``target.max_retries`` times. The final error says how many
    attempts were made over how long, or that huggingface_hub's own retries gave up.
    """

    def ours(exc: BaseException) -> Transient | None:
        if isinstance(exc, PublishError) or not sent_once(_failed_request(exc)):
            return None
        why = transient_failure(exc)
        if why is not None and isinstance(exc, NETWORK_ERRORS):
            why = Transient(_network_cause(exc, _failed_request(exc)))
        return why

    start = time.monotonic()
    try:
        return with_retries(
            call,
            what=f"{step} on {target.repo}",
            retries=target.max_retries,
            backoff_s=target.backoff_s,
            transient=ours,
            secrets=target.secrets,
        )
    except PublishError:
        raise
    except RetriesExhausted as gave_up:
        exc = gave_up.last
        tries = f"{gave_up.attempts} attempt{'s' * (gave_up.attempts > 1)}"
        message = _describe(exc, step, target)
        message += f"; gave up after {tries} over {gave_up.elapsed_s:.1f} s; try again later"
    except Exception as failed:
        exc = failed
        message = _describe(exc, step, target)
        if transient_failure(exc) is not None:
            elapsed = time.monotonic() - start
            message += (
                f"; gave up after huggingface_hub's own retries over {elapsed:.1f} s; "
                "try again later"
            )
    leaked = any(s in str(e) for e in exception_chain(exc) for s in target.secrets)
    raise PublishError(redact(message, target.secrets)) from (None if leaked else exc)
