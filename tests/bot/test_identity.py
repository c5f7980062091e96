"""Feishu people → Principals, and the owner claim code: once, and for 30 minutes only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.feishu.events import UserIds
from bot.identity import ALIAS_KINDS, CLAIM_SECONDS, ClaimRefused, FeishuIdentities
from hub.cli import ALIAS_KINDS as CLI_ALIAS_KINDS
from hub.state import Principal, State

NEWCOMER = UserIds(open_id="ou_new", union_id="on_new", user_id="u_new")
STRANGER = UserIds(open_id="ou_stranger", union_id="on_stranger", user_id="u_stranger")


class Clock:
    """Wall-clock seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def state(tmp_path: Path) -> Iterator[State]:
    opened = State(tmp_path / "state.sqlite3")
    opened.add_principal("owner", "user", owner=True)
    yield opened
    opened.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def identities(state: State, clock: Clock) -> FeishuIdentities:
    return FeishuIdentities(state, enroll=True, clock=clock)


def test_a_fresh_code_expires_thirty_minutes_after_it_is_offered(
    identities: FeishuIdentities, clock: Clock
) -> None:
    assert identities.offer_claim() is not None
    assert identities.claim_expires_at == clock.now + 30 * 60 == clock.now + CLAIM_SECONDS


def test_the_code_makes_the_sender_the_owner_just_before_it_expires(
    identities: FeishuIdentities, clock: Clock, state: State
) -> None:
    code = identities.offer_claim()
    assert code is not None
    clock.now += CLAIM_SECONDS - 1
    owner = identities.claim(f"  {code} ", NEWCOMER)
    assert isinstance(owner, Principal) and owner.is_owner
    assert state.principal_by_alias("feishu_union_id", "on_new") == owner


def test_an_expired_code_is_refused_as_expired_and_claims_nothing(
    identities: FeishuIdentities, clock: Clock, state: State
) -> None:
    code = identities.offer_claim()
    assert code is not None
    clock.now += CLAIM_SECONDS
    assert identities.claim(code, NEWCOMER) is ClaimRefused.EXPIRED
    clock.now += 3600
    assert identities.claim(code, NEWCOMER) is ClaimRefused.EXPIRED
    assert state.principal_by_alias("feishu_union_id", "on_new") is None


def test_a_used_code_is_refused_as_used_even_for_its_claimant(
    identities: FeishuIdentities, state: State
) -> None:
    code = identities.offer_claim()
    assert code is not None
    owner = identities.claim(code, NEWCOMER)
    assert isinstance(owner, Principal)
    assert identities.claim(code, STRANGER) is ClaimRefused.USED
    assert identities.claim(code, NEWCOMER) is ClaimRefused.USED
    assert state.principal_by_alias("feishu_union_id", "on_stranger") is None


def test_a_wrong_code_is_refused_as_wrong_and_the_right_one_still_works(
    identities: FeishuIdentities,
) -> None:
    code = identities.offer_claim()
    assert code is not None
    wrong = "0" * 8 if code != "0" * 8 else "1" * 8
    assert identities.claim(wrong, STRANGER) is ClaimRefused.WRONG
    assert identities.claim("", STRANGER) is ClaimRefused.WRONG
    assert isinstance(identities.claim(code, NEWCOMER), Principal)


def test_no_code_is_offered_once_the_owner_has_a_feishu_identity(
    identities: FeishuIdentities, state: State
) -> None:
    owner = state.owner()
    assert owner is not None
    state.add_alias(owner.id, "feishu_union_id", "on_owner")
    assert identities.offer_claim() is None
    assert identities.claim("deadbeef", NEWCOMER) is ClaimRefused.WRONG


def test_the_cli_maps_only_the_outside_identities_the_bot_resolves() -> None:
    # An alias kind nothing looks up would be stored and never consulted.
    assert set(CLI_ALIAS_KINDS) == {kind for kind, _ in ALIAS_KINDS}
