"""The credential cache: a revocation applies to the very next call, wherever it was made."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from hub.errors import Unauthenticated
from hub.identity import Authenticator
from hub.state import State


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def state(tmp_path: Path) -> State:
    state = State(tmp_path / "state.sqlite3")
    yield state  # type: ignore[misc]
    state.close()


def cached_alice(state: State) -> tuple[Authenticator, str, str]:
    """An authenticator that has just answered for alice's token: it, the token and its id."""
    principal = state.add_principal("alice")
    token, credential = state.issue_credential(principal.id)
    auth = Authenticator(state, ttl=60, clock=Clock())
    assert auth(token).principal.name == "alice"
    return auth, token, credential.id


def test_a_revocation_through_the_hub_applies_to_the_very_next_call(state: State) -> None:
    auth, token, credential_id = cached_alice(state)
    state.revoke_credential(credential_id)
    with pytest.raises(Unauthenticated):
        auth(token)


def test_a_revocation_by_another_process_applies_to_the_very_next_call(
    state: State, tmp_path: Path
) -> None:
    auth, token, credential_id = cached_alice(state)
    other = sqlite3.connect(tmp_path / "state.sqlite3")
    other.execute(
        "UPDATE credentials SET revoked_at = ? WHERE id = ?", (time.time(), credential_id)
    )
    other.commit()
    other.close()
    with pytest.raises(Unauthenticated):
        auth(token)


def test_a_cached_credential_still_expires_on_time(state: State) -> None:
    principal = state.add_principal("alice")
    wall = Clock()
    token, _ = state.issue_credential(
        principal.id, "delegated", binding="global", expires_at=wall.now + 30
    )
    auth = Authenticator(state, ttl=60, clock=Clock(), wall_clock=wall)
    auth(token)
    wall.now += 31
    with pytest.raises(Unauthenticated):
        auth(token)


def test_unknown_tokens_are_never_cached(state: State) -> None:
    auth = Authenticator(state, ttl=60, clock=Clock())
    with pytest.raises(Unauthenticated):
        auth("amux_not_yet")
    principal = state.add_principal("bob")
    token, _ = state.issue_credential(principal.id)
    assert auth(token).principal.name == "bob"


def test_a_cached_credential_is_not_read_again_while_nothing_changed(state: State) -> None:
    auth, token, credential_id = cached_alice(state)
    # A change the cache cannot see (same connection, not through revoke_credential) shows that
    # the second call answered from the cache rather than from the database.
    state.db.execute("UPDATE credentials SET revoked_at = 1 WHERE id = ?", (credential_id,))
    state.db.commit()
    assert auth(token).principal.name == "alice"
