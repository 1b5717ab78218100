"""The one retry helper for requests to the Hugging Face Hub, and the one token redaction.

Every request huggingface_hub sends only once (create repo, repo info, the commit request, tags,
the range requests of the streaming cache, the first request of a snapshot download) goes
through :func:`with_retries`: a transient failure (HTTP 408/429/5xx, a timeout, a dropped or
refused connection, a body cut short) is retried at most ``retries`` times, ``backoff_s * 2**i``
seconds apart, or after the server's ``Retry-After`` when it asks for longer, never more than
:data:`MAX_BACKOFF_S`; each retry is logged with ``logging.warning``. Anything else is raised at
once, unchanged. After the last retry, :class:`RetriesExhausted` says how many attempts were made
over how long (its ``__cause__`` is the last failure), for the caller to word its error.

Tokens never reach a log, a file or an error message: :func:`redact` replaces the known secrets
(:func:`known_secrets`: the ``token`` given, ``HF_TOKEN``, the stored login) and anything shaped
like a Hugging Face token.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TypeVar

from huggingface_hub import get_session
from huggingface_hub.errors import HfHubHTTPError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# What huggingface_hub's own http_backoff treats as transient (huggingface_hub/utils/_http.py).
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def http_client_module() -> ModuleType:
    """The HTTP client package huggingface_hub sends its requests with: httpx under
    huggingface_hub 1.x, httpx2 under 2.x (both are supported: LeRobot 0.6.1 pins the hub < 2).
    Taken from the client :func:`huggingface_hub.get_session` returns, so that the transport
    errors below are the ones its requests raise."""
    return importlib.import_module(type(get_session()).__module__.split(".")[0])


HTTP_CLIENT = http_client_module()
# Transport failures worth another try: timeouts, refused / reset / dropped connections, a
# body cut short.
NETWORK_ERRORS = (
    HTTP_CLIENT.TimeoutException,
    HTTP_CLIENT.NetworkError,
    HTTP_CLIENT.RemoteProtocolError,
)
MAX_BACKOFF_S = 60.0
# The retries of a request whose caller sets none (publish_folder's defaults).
DEFAULT_RETRIES = 5
DEFAULT_BACKOFF_S = 1.0

HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{16,}")
REDACTED = "***"


# ---------------------------------------------------------------------------- redaction
def known_secrets(token: str | None = None) -> list[str]:
    """The tokens this process may send: ``token``, ``HF_TOKEN`` / ``HUGGING_FACE_HUB_TOKEN``
    and huggingface_hub's stored login; longest first, so that a token containing another is
    replaced whole."""
    found = [token, os.environ.get("HF_TOKEN"), os.environ.get("HUGGING_FACE_HUB_TOKEN")]
    with contextlib.suppress(Exception):  # a broken stored login must not hide the real error
        from huggingface_hub import get_token

        found.append(get_token())
    return sorted({s for s in found if isinstance(s, str) and len(s) >= 4}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with each of ``secrets`` (default :func:`known_secrets`) replaced by ``***`` and
    anything shaped like a Hugging Face token by ``hf_***``."""
    for secret in known_secrets() if secrets is None else secrets:
        text = text.replace(secret, REDACTED)
    return HF_TOKEN_RE.sub(f"hf_{REDACTED}", text)


def redacted(exc: BaseException) -> str:
    """An exception's message with every known token replaced (for logs and other ranks)."""
    return redact(str(exc))


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes / contexts, each once."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


# ---------------------------------------------------------------------------- retries
class TransientResponse(Exception):
    """An answer worth asking again for (a transient status, a short body), raised by a request
    that reads the response itself; ``retry_after_s`` is what the server asked for, if anything."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class RetriesExhausted(Exception):
    """A transient failure that lasted through every retry; ``__cause__`` is the last one."""

    def __init__(self, last: BaseException, attempts: int, elapsed_s: float) -> None:
        super().__init__(f"gave up after {attempts} attempt{'s' * (attempts > 1)}: {last}")
        self.last = last
        self.attempts = attempts
        self.elapsed_s = elapsed_s


@dataclass(frozen=True)
class Transient:
    """Why a failure is worth retrying, and how long the server asked to wait."""

    reason: str
    retry_after_s: float | None = None


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The ``Retry-After`` header in seconds (its HTTP-date form is not used by the Hub)."""
    with contextlib.suppress(TypeError, ValueError):
        return max(0.0, float(headers.get("Retry-After")))
    return None


def transient_failure(exc: BaseException) -> Transient | None:
    """Why ``exc`` is worth retrying (a transient HTTP status, a network error, a
    :class:`TransientResponse`), or None when it is not."""
    if isinstance(exc, TransientResponse):
        return Transient(exc.reason, exc.retry_after_s)
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code
        if status in TRANSIENT_STATUSES:
            return Transient(f"HTTP {status}", retry_after_s(exc.response.headers))
        return None
    if isinstance(exc, NETWORK_ERRORS):
        return Transient(f"{type(exc).__name__}: {exc}")
    return None


def retry_delay(attempt: int, backoff_s: float, asked_s: float | None = None) -> float:
    """Seconds before retry number ``attempt`` (1 for the first): the exponential backoff, or
    what the server asked when longer, at most :data:`MAX_BACKOFF_S`."""
    delay = backoff_s * 2 ** (attempt - 1)
    if asked_s is not None:
        delay = max(delay, asked_s)
    return min(delay, MAX_BACKOFF_S)


def with_retries(
    call: Callable[[], T],
    *,
    what: str,
    retries: int = DEFAULT_RETRIES,
    backoff_s: float = DEFAULT_BACKOFF_S,
    transient: Callable[[BaseException], Transient | None] = transient_failure,
    secrets: Iterable[str] | None = None,
) -> T:
    """``call()``, retried at most ``retries`` times while it fails with what ``transient``
    says is worth retrying (default :func:`transient_failure`); ``what`` names the request in
    the warnings, whose reasons are redacted (``secrets``: see :func:`redact`). Other failures
    are raised unchanged; the last transient one as :class:`RetriesExhausted`."""
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except Exception as exc:
            why = transient(exc)
            if why is None:
                raise
            if attempt > retries:
                raise RetriesExhausted(exc, attempt, time.monotonic() - start) from exc
            delay = retry_delay(attempt, backoff_s, why.retry_after_s)
            logger.warning(
                "Hub: %s failed (%s); retry %d/%d in %.2f s",
                what,
                redact(why.reason, secrets),
                attempt,
                retries,
                delay,
            )
            time.sleep(delay)
