"""Logical memory paths and scope directories: pure rules, no file system access."""

from __future__ import annotations

import hashlib
import unicodedata

from hub.errors import InvalidArgument, InvalidPath
from hub.limits import DEFAULT_LIMITS, Limits

GLOBAL_SCOPE = "global"
PRINCIPAL_SCOPE_PREFIX = "principal:"


def validate_path(path: object, limits: Limits = DEFAULT_LIMITS) -> tuple[str, ...]:
    """Check a logical document path and return its components, in Unicode NFC.

    Raises:
        InvalidPath: the path is not a relative, visible, plain ``.md`` path.
    """
    parts = _validate_components(path, limits, what="path")
    if not parts[-1].endswith(".md") or parts[-1] == ".md":
        raise InvalidPath("memory paths must name a Markdown document ending in .md", path=path)
    return parts


def validate_prefix(prefix: object, limits: Limits = DEFAULT_LIMITS) -> tuple[str, ...]:
    """Check a search ``path_prefix`` (a directory or a document); empty means the whole scope.

    Raises:
        InvalidPath: the prefix is absolute, escapes the scope or names a hidden component.
    """
    if prefix is None or prefix == "":
        return ()
    if isinstance(prefix, str):
        prefix = prefix.rstrip("/")
        if prefix == "":
            raise InvalidPath("path_prefix must be relative to the memory scope", path_prefix="/")
    return _validate_components(prefix, limits, what="path_prefix")


def check_new_path(parts: tuple[str, ...], path: str) -> None:
    """The rules for a path a write creates, beyond ``validate_path``; documents stored before
    them stay readable and writable.

    Raises:
        InvalidPath: a name in it begins or ends with a space.
    """
    for part in parts:
        if part != part.strip():
            raise InvalidPath("a name in path must not begin or end with a space", path=path)


def name_fold(name: str) -> str:
    """What two names in one directory are the same by, as a case-insensitive file system sees
    them: ``memory.md`` and ``MEMORY.md`` are one."""
    return unicodedata.normalize("NFC", name.casefold())


def _validate_components(path: object, limits: Limits, *, what: str) -> tuple[str, ...]:
    if not isinstance(path, str):
        raise InvalidPath(f"{what} must be a string")
    if not path.isascii():
        # One document however its letters were composed: "café" typed on one system may arrive
        # decomposed (NFD) from another, and the file system would keep the two names apart.
        # Every check below sees the normalized name, the one that reaches the disk.
        path = unicodedata.normalize("NFC", path)
    if path == "":
        raise InvalidPath(f"{what} is empty")
    if len(path.encode("utf-8", "surrogatepass")) > limits.path_bytes:
        raise InvalidPath(f"{what} is longer than {limits.path_bytes} bytes", path=path[:64])
    # Printable ASCII holds no control character or surrogate: only the backslash to look for.
    if path.isascii() and path.isprintable():
        if "\\" in path:
            raise InvalidPath(f"{what} must use '/' separators, not backslashes", path=path)
    else:
        _check_characters(path, what)
    if path.startswith("/"):
        raise InvalidPath(f"{what} must be relative to the memory scope, not absolute", path=path)
    parts = tuple(path.split("/"))
    if len(parts) > limits.path_depth:
        raise InvalidPath(f"{what} is deeper than {limits.path_depth} directories", path=path)
    for part in parts:
        if part == "":
            raise InvalidPath(f"{what} has an empty component", path=path)
        if part in (".", ".."):
            raise InvalidPath(f"{what} must not contain '.' or '..'", path=path)
        if part.startswith("."):
            raise InvalidPath(f"{what} must not contain hidden components", path=path)
        if len(part.encode("utf-8")) > limits.name_bytes:
            raise InvalidPath(
                f"a name in {what} is longer than {limits.name_bytes} bytes", path=path
            )
    return parts


def _check_characters(path: str, what: str) -> None:
    for ch in path:
        if "\ud800" <= ch <= "\udfff":
            raise InvalidPath(f"{what} is not valid UTF-8")
        if ch == "\\":
            raise InvalidPath(f"{what} must use '/' separators, not backslashes", path=path)
        if _is_control(ch):
            raise InvalidPath(
                f"{what} contains a control character",
                path=path.encode("utf-8", "surrogatepass").hex(),
            )


def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") and ch not in ("\u200d", "\u200c")


def scope_directory(scope: str) -> tuple[str, ...]:
    """The directory of a scope below the memory root, derived by the Hub, never by the caller.

    Raises:
        InvalidArgument: the scope string is neither ``global`` nor ``principal:<id>``.
    """
    if scope == GLOBAL_SCOPE:
        return ("global",)
    if scope.startswith(PRINCIPAL_SCOPE_PREFIX) and len(scope) > len(PRINCIPAL_SCOPE_PREFIX):
        principal_id = scope[len(PRINCIPAL_SCOPE_PREFIX) :]
        return ("users", hashlib.sha256(principal_id.encode("utf-8")).hexdigest())
    raise InvalidArgument("unknown memory scope", scope=scope)


def principal_scope(principal_id: str) -> str:
    return PRINCIPAL_SCOPE_PREFIX + principal_id


def memory_scope(principal_id: str, isolation: bool) -> str:
    """The memory scope a Principal's calls and launches use: its own under isolation, else the
    one global scope. Nothing falls back to global while isolation is on.

    The one home of this rule: a session's frozen binding, a delegated credential's binding, a
    memory call's scope and what ``system.whoami`` and the management card show all come from it.
    """
    return principal_scope(principal_id) if isolation else GLOBAL_SCOPE


def in_prefix(parts: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
    """Whether a document lies under a directory prefix (whole components) or is that document."""
    return parts[: len(prefix)] == prefix
