"""Authentication of every Hub call and derivation of the caller's memory scope.

The scope comes from the running isolation policy and the authenticated actor, never from the
caller. A binding (``AMUX_MEMORY_BINDING``) is an equality precondition on that derived scope:
delegated Agent credentials must present the one they were issued with; enrolled CLI credentials
may omit it. Nothing here ever falls back to global memory while isolation is on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from hub.errors import BindingMismatch, Forbidden, NotFound, Unauthenticated
from hub.state import Credential, Principal, State

BEARER = "bearer "


@dataclass(frozen=True)
class Actor:
    """Who is calling: the effective Principal and the credential that proved it."""

    principal: Principal
    credential: Credential

    @property
    def delegated(self) -> bool:
        return self.credential.kind == "delegated"

    @property
    def owner_in_person(self) -> bool:
        """The owner with a credential of their own: owner administration never trusts the
        owner's Agent acting through a delegated credential."""
        return self.principal.is_owner and not self.delegated


def in_person(principal: Principal, channel: str) -> Actor:
    """A person acting in person through a channel that proved who they are without a Hub
    credential of theirs (a signed Feishu card click, ``channel`` ``card``): never delegated, so
    it is held to the rules of a person with their own CLI credential."""
    credential = Credential(
        id="",
        principal_id=principal.id,
        kind=channel,
        binding=None,
        label=channel,
        expires_at=None,
        revoked_at=None,
        created_at=0.0,
    )
    return Actor(principal, credential)


def require_owner(actor: Actor, message: str) -> None:
    """Raises: Forbidden (with ``message``): the caller is not the owner in person."""
    if not actor.owner_in_person:
        raise Forbidden(message)


def bearer_token(header: str | None) -> str:
    """Raises: Unauthenticated: no ``Authorization: Bearer <token>`` header."""
    if not header or not header[: len(BEARER)].lower() == BEARER:
        raise Unauthenticated("missing credential: send 'Authorization: Bearer <token>'")
    token = header[len(BEARER) :].strip()
    if not token:
        raise Unauthenticated("missing credential: the bearer token is empty")
    return token


def authenticate(state: State, token: str, now: float | None = None) -> Actor:
    """Raises: Unauthenticated: unknown, revoked or expired credential."""
    found = state.credential_by_token(token)
    # One message for every failure, so a caller cannot probe which tokens once existed.
    if found is None:
        raise Unauthenticated("invalid credential")
    credential, principal = found
    moment = time.time() if now is None else now
    if credential.revoked_at is not None:
        raise Unauthenticated("invalid credential")
    if credential.expires_at is not None and credential.expires_at <= moment:
        raise Unauthenticated("invalid credential")
    return Actor(principal, credential)


class Authenticator:
    """``authenticate`` with a short-lived cache of known credentials.

    Every RPC authenticates, and the lookup is the largest fixed cost of a small read. A cached
    credential is still checked for expiry on each call, and a revocation applies to the very next
    call: one through this Hub bumps its count, one committed to the database by another process
    (``amux token revoke`` on the Hub's host) changes SQLite's data version, and either empties
    the cache. ``ttl`` bounds how long anything else about a credential is trusted unread.
    """

    def __init__(
        self,
        state: State,
        ttl: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 4096,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._state = state
        self._ttl = ttl
        self._clock = clock
        self._wall_clock = wall_clock
        self._max_entries = max_entries
        self._cache: dict[str, tuple[Actor, float, tuple[int, int]]] = {}

    def __call__(self, token: str) -> Actor:
        """Raises: Unauthenticated: unknown, revoked or expired credential."""
        now = self._clock()
        generation = (self._state.credential_changes, self._state.commits_elsewhere())
        hit = self._cache.get(token)
        if hit is not None and now - hit[1] < self._ttl and hit[2] == generation:
            actor = hit[0]
            expires_at = actor.credential.expires_at
            if expires_at is not None and expires_at <= self._wall_clock():
                raise Unauthenticated("invalid credential")
            return actor
        actor = authenticate(self._state, token, self._wall_clock())
        if len(self._cache) >= self._max_entries:
            self._cache.clear()
        self._cache[token] = (actor, now, generation)
        return actor


def check_binding(actor: Actor, presented: str | None, scope: str) -> None:
    """Raises: BindingMismatch: the presented or issued binding is not the derived scope."""
    if actor.delegated:
        if not presented:
            raise BindingMismatch(
                "this Agent credential needs its memory binding (AMUX_MEMORY_BINDING)"
            )
        if presented != actor.credential.binding:
            raise BindingMismatch("the memory binding does not match this Agent credential")
    if presented and presented != scope:
        raise BindingMismatch(
            "this conversation's memory binding no longer matches the Hub's policy; "
            "start a new conversation",
            binding=presented,
        )


def require_service(actor: Actor) -> None:
    """Raises: Forbidden: the caller is not a Runtime service acting with its own credential."""
    if actor.principal.kind != "service" or actor.delegated:
        raise Forbidden("only a Runtime service principal can do this")


def acting_for(actor: Actor, state: State, principal_id: str | None) -> Principal:
    """The Principal a call acts for: the caller by default, or the one a service names.

    Raises:
        Forbidden: a caller other than a service names someone else.
        NotFound: no such Principal.
    """
    if principal_id is None or principal_id == actor.principal.id:
        return actor.principal
    require_service(actor)
    principal = state.principal(principal_id)
    if principal is None:
        raise NotFound("no such principal", principal_id=principal_id)
    return principal
