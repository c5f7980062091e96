"""Feishu people → Principals: the tenant an event must come from, aliases namespaced by it, no
merging of ids that disagree, and the owner claim code: once, and for 30 minutes only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.feishu.events import UserIds
from bot.identity import (
    CLAIM_LOCK_SECONDS,
    CLAIM_SECONDS,
    CLAIM_TRIES_IN_ALL,
    CLAIM_TRIES_PER_SENDER,
    ClaimRefused,
    FeishuIdentities,
)
from hub.aliases import ID_FIELDS
from hub.cli import ALIAS_FIELDS
from hub.errors import Conflict
from hub.people import People
from hub.state import Principal, State

APP = "cli_app"
TENANT = "tenant_own"
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
    people = People(state)
    return FeishuIdentities(people, enroll=True, app_id=APP, tenant_key=TENANT, clock=clock)


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


def test_a_senders_lock_lifts_an_hour_after_their_first_wrong_code(
    identities: FeishuIdentities, clock: Clock
) -> None:
    code = identities.offer_claim()
    assert code is not None
    wrong = "0" * 8 if code != "0" * 8 else "1" * 8
    for _ in range(CLAIM_TRIES_PER_SENDER - 1):
        assert identities.claim(wrong, STRANGER) is ClaimRefused.WRONG
        clock.now += 60
    assert identities.claim(wrong, STRANGER) is ClaimRefused.LOCKED
    clock.now = clock.now - 60 * (CLAIM_TRIES_PER_SENDER - 1) + CLAIM_LOCK_SECONDS - 1
    assert identities.claim(code, STRANGER) is ClaimRefused.LOCKED
    clock.now += 1
    # The oldest wrong code is an hour old: one more try, and a wrong one locks again.
    assert identities.claim(wrong, STRANGER) is ClaimRefused.LOCKED
    clock.now += CLAIM_LOCK_SECONDS
    assert identities.claim(code, STRANGER) is ClaimRefused.EXPIRED


def test_a_new_code_lifts_the_lock_on_everyone(identities: FeishuIdentities) -> None:
    code = identities.offer_claim()
    assert code is not None
    wrong = "0" * 8 if code != "0" * 8 else "1" * 8
    guessers = [
        UserIds(open_id=f"ou_{n}", union_id=f"on_{n}")
        for n in range(CLAIM_TRIES_IN_ALL // (CLAIM_TRIES_PER_SENDER - 1))
    ]
    for guesser in guessers:
        for _ in range(CLAIM_TRIES_PER_SENDER - 1):
            identities.claim(wrong, guesser)
    assert identities.claim(code, NEWCOMER) is ClaimRefused.LOCKED_FOR_ALL
    fresh = identities.offer_claim()
    assert fresh is not None
    assert isinstance(identities.claim(fresh, NEWCOMER), Principal)


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
    assert set(ALIAS_FIELDS) == set(ID_FIELDS)


def owner_with_ids(identities: FeishuIdentities, state: State) -> Principal:
    code = identities.offer_claim()
    assert code is not None
    owner = identities.claim(code, NEWCOMER)
    assert isinstance(owner, Principal)
    return owner


def test_user_and_open_ids_are_kept_in_the_namespace_of_their_tenant(
    identities: FeishuIdentities, state: State
) -> None:
    owner = owner_with_ids(identities, state)
    assert state.aliases(owner.id) == [
        ("feishu:tenant_own:cli_app:open_id", "ou_new"),
        ("feishu:tenant_own:user_id", "u_new"),
        ("feishu_union_id", "on_new"),
    ]
    # The same user_id in another tenant is someone else.
    elsewhere = UserIds(open_id="ou_other", user_id="u_new", tenant_key="tenant_other")
    other = identities.resolve(elsewhere)
    assert other is not None and other.id != owner.id


def test_events_of_another_tenant_or_app_or_of_none_are_not_admitted(
    identities: FeishuIdentities,
) -> None:
    own = UserIds(open_id="ou_a", tenant_key=TENANT)
    assert identities.admits(TENANT, APP, own)
    assert identities.admits(TENANT, "", own)  # The old card callbacks name no app.
    assert not identities.admits("tenant_other", APP, own)
    assert not identities.admits(TENANT, APP, UserIds(open_id="ou_a", tenant_key="tenant_other"))
    assert not identities.admits(TENANT, "cli_other", own)
    assert not identities.admits("", APP, UserIds(open_id="ou_a"))


def test_without_a_configured_tenant_the_first_event_teaches_it_and_the_state_keeps_it(
    state: State,
) -> None:
    learning = FeishuIdentities(People(state), enroll=True, app_id=APP)
    assert learning.app is None
    assert learning.admits("tenant_first", APP, UserIds(open_id="ou_a"))
    assert not learning.admits("tenant_second", APP, UserIds(open_id="ou_b"))
    restarted = FeishuIdentities(People(state), enroll=True, app_id=APP)
    assert restarted.app is not None and restarted.app.tenant_key == "tenant_first"
    assert not restarted.admits("tenant_second", APP, UserIds(open_id="ou_b"))
    # Another app's tenant is learned afresh.
    assert FeishuIdentities(People(state), enroll=True, app_id="cli_next").app is None


def test_ids_naming_two_principals_are_refused_and_nothing_is_merged(
    identities: FeishuIdentities, state: State, caplog: pytest.LogCaptureFixture
) -> None:
    owner = owner_with_ids(identities, state)
    stranger = identities.resolve(STRANGER)
    assert stranger is not None
    before = (state.aliases(owner.id), state.aliases(stranger.id))
    mixed = UserIds(open_id="ou_stranger", union_id="on_stranger", user_id="u_new")
    with pytest.raises(Conflict):
        identities.resolve(mixed)
    assert (state.aliases(owner.id), state.aliases(stranger.id)) == before
    (line,) = [r.getMessage() for r in caplog.records if "nothing merged" in r.getMessage()]
    assert owner.id in line and stranger.id in line


def test_an_id_unlike_the_one_its_principal_has_is_refused_and_nothing_is_added(
    identities: FeishuIdentities, state: State, caplog: pytest.LogCaptureFixture
) -> None:
    owner = owner_with_ids(identities, state)
    before = state.aliases(owner.id)
    # An admin gave the owner's user_id to someone new: their open_id and union_id are theirs.
    reassigned = UserIds(open_id="ou_newcomer", union_id="on_newcomer", user_id="u_new")
    with pytest.raises(Conflict):
        identities.resolve(reassigned)
    assert state.aliases(owner.id) == before
    assert state.principal_by_alias("feishu_union_id", "on_newcomer") is None
    (line,) = [r.getMessage() for r in caplog.records if "nothing merged" in r.getMessage()]
    assert owner.id in line and "union_id, open_id differ" in line
    # The owner's own ids still resolve, and ids only partly known are added.
    assert identities.resolve(NEWCOMER) == owner
    assert identities.resolve(UserIds(union_id="on_new", user_id="u_new")) == owner


def test_aliases_waiting_for_the_tenant_are_bound_to_it_once_it_is_known(state: State) -> None:
    owner = state.owner()
    assert owner is not None
    state.add_alias(owner.id, "feishu:*:user_id", "u_owner")
    state.add_alias(owner.id, "feishu:*:open_id", "ou_owner")
    identities = FeishuIdentities(People(state), enroll=True, app_id=APP)
    assert identities.resolve(UserIds(user_id="u_owner", tenant_key=TENANT)) is None
    assert identities.admits(TENANT, APP, UserIds(user_id="u_owner"))
    assert state.aliases(owner.id) == [
        ("feishu:tenant_own:cli_app:open_id", "ou_owner"),
        ("feishu:tenant_own:user_id", "u_owner"),
    ]
    assert identities.resolve(UserIds(user_id="u_owner", tenant_key=TENANT)) == owner


# -- the owner named by `amux feishu setup` --------------------------------------------------------


def test_the_person_who_scanned_the_apps_qr_code_is_the_owner_at_their_first_message(
    state: State, caplog: pytest.LogCaptureFixture
) -> None:
    scanned = FeishuIdentities(
        People(state), enroll=True, app_id=APP, tenant_key=TENANT, scanner_open_id="ou_new"
    )
    assert scanned.offer_claim() is None, "no claim code while the scanner is to be the owner"
    assert scanned.resolve(STRANGER) is not None and not scanned.resolve(STRANGER).is_owner
    principal = scanned.resolve(NEWCOMER)
    assert principal is not None and principal.is_owner
    assert state.principal_by_alias("feishu_union_id", "on_new") == principal


def test_a_scanner_who_is_not_the_claimed_owner_does_not_replace_them(
    identities: FeishuIdentities, state: State, caplog: pytest.LogCaptureFixture
) -> None:
    code = identities.offer_claim()
    assert code is not None
    owner = identities.claim(code, NEWCOMER)
    assert isinstance(owner, Principal)
    scanned = FeishuIdentities(
        People(state), enroll=True, app_id=APP, tenant_key=TENANT, scanner_open_id="ou_stranger"
    )
    with caplog.at_level("WARNING", logger="amux.bot"):
        assert scanned.offer_claim() is None
    said = [r.getMessage() for r in caplog.records if "ou_stranger" in r.getMessage()]
    assert len(said) == 1 and "is not the owner" in said[0]
    stranger = scanned.resolve(STRANGER)
    assert stranger is not None and not stranger.is_owner
    assert state.principal_by_alias("feishu_union_id", "on_new") == owner
