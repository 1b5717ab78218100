"""The error every step of a conversion raises, and the one-line description of a failure it
carries (DCP wraps a rank's failure in a ``CheckpointException``)."""

from __future__ import annotations


class ConversionError(RuntimeError):
    """The conversion cannot proceed; the message says why in one line. Nothing was deleted."""


def innermost(exc: BaseException) -> BaseException:
    """The first rank's failure of a DCP CheckpointException (its failures map rank ->
    (exception, traceback)); ``exc`` itself otherwise."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        inner = inner[0] if isinstance(inner, tuple) else inner
        if isinstance(inner, BaseException):
            return inner
    return exc


def one_line(exc: BaseException) -> str:
    """A one-line description of ``exc`` (of the innermost failure of a CheckpointException)."""
    exc = innermost(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
