"""Authentication of every Hub call and derivation of the caller's memory scope.

The scope comes from the running isolation policy and the authenticated actor, never from the
caller. A binding (``AMUX_MEMORY_BINDING``) is an equality precondition on that derived scope:
delegated Agent credentials must present the one they were issued with; enrolled CLI credentials
may omit it. Nothing here ever falls back to global memory while isolation is on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hub.errors import BindingMismatch, Unauthenticated
from hub.paths import GLOBAL_SCOPE, principal_scope
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


def memory_scope(actor: Actor, isolation: bool) -> str:
    return principal_scope(actor.principal.id) if isolation else GLOBAL_SCOPE


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
