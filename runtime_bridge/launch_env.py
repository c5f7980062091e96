"""Environment hygiene for agent launches: pure, no I/O.

A launch never inherits the service's environment wholesale. It starts from the variables that
match the configured ``pass_env`` globs, collapses case variants of path-like keys, drops the
agents' home selectors and amux connection variables that belong to another launch, points each
agent's home at the launch's own directory, and only then adds what this launch needs.

A launch through the model gateway never carries a provider credential: the variables that hold
one (``ANTHROPIC_API_KEY``, ``CLAUDE_CODE_OAUTH_TOKEN``, ``OPENAI_API_KEY``…, any key, token or
secret of the providers' families, and the provider base URLs) are removed even when an
operator's ``pass_env`` glob names them; the launch's placeholder and the gateway's URL take
their place.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from fnmatch import translate

DEFAULT_PASS_ENV: tuple[str, ...] = (
    "ANTHROPIC_*",
    "OPENAI_*",
    "CLAUDE_CODE_*",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "PATH",
    "HOME",
    "LANG",
    "LC_*",
    "TERM",
    "TMPDIR",
    "USER",
)

# Keys whose case variants (``Path``, ``home``) are the same variable to a child on some
# platforms; two spellings would leave which one wins to the child.
PATH_LIKE_KEYS: tuple[str, ...] = ("PATH", "HOME", "TMPDIR")

# Home selectors inherited from the service would point an agent at the service user's native
# state (sessions, memories, credentials); each launch sets its own or none.
HOME_SELECTORS: tuple[str, ...] = ("CODEX_HOME", "PI_CODING_AGENT_DIR", "CLAUDE_CONFIG_DIR")

# Memory connection settings come only from the launch's own binding, never from the service,
# so an unbound conversation cannot silently adopt memory.
MEMORY_UNAVAILABLE = "AMUX_MEMORY_UNAVAILABLE"
MEMORY_KEYS: tuple[str, ...] = (
    "AMUX_HUB_URL",
    "AMUX_TOKEN",
    "AMUX_MEMORY_BINDING",
    MEMORY_UNAVAILABLE,
)

# Set in every launch: an ``amux`` an Agent runs never picks up an owner token lying under
# ``./.amux`` (or any AMUX_HOME) in place of its own delegated credential.
NO_OWNER_TOKEN: dict[str, str] = {"AMUX_OWNER_TOKEN_FALLBACK": "false"}


# Provider credentials the worker's gateway holds, and the upstream addresses it forwards to:
# an Agent behind the gateway gets neither (the gateway's URL and a placeholder instead).
CREDENTIAL_VARIABLES: tuple[str, ...] = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENAI_BASE_URL",
)
# Any other secret-looking variable of the providers' own families (``OPENAI_ADMIN_KEY``,
# ``CLAUDE_CODE_SESSION_ACCESS_TOKEN``…).
_PROVIDER_SECRET = re.compile(
    r"^(ANTHROPIC|OPENAI|CLAUDE_CODE|CODEX)_.*(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)",
    re.IGNORECASE,
)


def is_provider_credential(name: str, hidden: Iterable[str] = ()) -> bool:
    """Whether a launch behind the gateway must not carry the variable ``name``."""
    return name in CREDENTIAL_VARIABLES or name in hidden or bool(_PROVIDER_SECRET.match(name))


def collapse_case_variants(env: Mapping[str, str]) -> dict[str, str]:
    """Keep one spelling of each path-like key: the upper-case one, else the first seen."""
    out: dict[str, str] = {}
    for key, value in env.items():
        canonical = key.upper()
        if canonical in PATH_LIKE_KEYS and key != canonical:
            if canonical in env or canonical in out:
                continue
            key = canonical
        out[key] = value
    return out


def filter_env(env: Mapping[str, str], pass_env: Iterable[str]) -> dict[str, str]:
    """The variables whose names match one of the (case-sensitive) globs."""
    matches = _globs(tuple(pass_env))
    return {k: v for k, v in env.items() if matches(k)}


@functools.lru_cache(maxsize=32)
def _globs(globs: tuple[str, ...]) -> Callable[[str], re.Match[str] | None]:
    """One expression for all of ``globs``, as ``fnmatchcase`` reads each: a launch filters
    the worker's whole environment, and matching every name against each glob in turn cost a
    millisecond of the event loop per launch."""
    if not globs:
        return lambda _name: None
    return re.compile("|".join(translate(glob) for glob in globs)).match


def join_path(prepend: Iterable[str], path: str | None) -> str:
    """``prepend`` then ``path``'s entries, each directory once, empty and relative entries
    dropped: either names a directory under the Agent's working directory, its own to write, where
    a program it planted would run in place of the one a command names (and a command judged safe
    to run unasked would run it)."""
    seen: list[str] = []
    for entry in [*prepend, *(path or "").split(":")]:
        if entry.startswith("/") and entry not in seen:
            seen.append(entry)
    return ":".join(seen)


def launch_env(
    base_env: Mapping[str, str],
    pass_env: Iterable[str] = DEFAULT_PASS_ENV,
    *,
    homes: Mapping[str, str] | None = None,
    prepend_path: Iterable[str] = (),
    overrides: Mapping[str, str] | None = None,
    gateway: Mapping[str, str] | None = None,
    hidden: Iterable[str] = (),
) -> dict[str, str]:
    """The environment of one launch, sorted by name.

    ``homes`` sets home selectors (``CODEX_HOME``…) to the launch's own directories; every other
    home selector is removed. ``prepend_path`` directories go first on PATH. ``overrides`` are
    applied last.

    Given ``gateway`` (the variables pointing the Agent at the model gateway), no provider
    credential of ``base_env`` is kept, whatever ``pass_env`` says: neither the usual variables,
    nor those named in ``hidden``; then ``gateway`` is applied, after ``overrides``.
    """
    env = filter_env(collapse_case_variants(base_env), pass_env)
    for key in (*HOME_SELECTORS, *MEMORY_KEYS):
        env.pop(key, None)
    if gateway is not None:
        names = frozenset(hidden)
        env = {k: v for k, v in env.items() if not is_provider_credential(k, names)}
    env.update(homes or {})
    prepend = list(prepend_path)
    if prepend or "PATH" in env:
        env["PATH"] = join_path(prepend, env.get("PATH"))
    env.update(overrides or {})
    env.update(gateway or {})
    env.update(NO_OWNER_TOKEN)
    return dict(sorted(env.items()))
