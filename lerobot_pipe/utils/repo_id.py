"""Hub repository ids (``namespace/name``): the one predicate of what looks like one, and the one
check of what the Hub accepts. Imports nothing heavy: flags are checked with it before launch."""

from __future__ import annotations

import re
from pathlib import Path

# One part of a repo id: letters, digits, '-', '_' and '.', at most 96, starting and ending with
# a letter or digit.
_REPO_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")


def looks_like_repo_id(text: str) -> bool:
    """Whether ``text`` reads as a Hub repo id rather than a local path: ``namespace/name``, not
    starting with ``.``, ``/`` or ``~``, and no such file or folder here."""
    return (
        bool(text)
        and not text.startswith((".", "/", "~"))
        and text.count("/") == 1
        and not Path(text).exists()
    )


def repo_id_problem(repo_id: object) -> str | None:
    """Why ``repo_id`` is not a valid Hub repo id (None: it is)."""
    if not isinstance(repo_id, str) or not repo_id:
        return f"invalid repo_id {repo_id!r}: expected 'namespace/name'"
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
        elif not (_REPO_PART.match(namespace) and _REPO_PART.match(name)):
            why = (
                "use letters, digits, '-', '_' and '.' only (at most 96 per part), "
                "not starting or ending with '-' or '.'"
            )
    return f"invalid repo_id {repo_id!r}: {why}; expected 'namespace/name'" if why else None
