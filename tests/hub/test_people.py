"""The bot's doors to the Hub's people and settings, through the services themselves: whom aliases
name (or why they name nobody), enrolment in one commit under a free name, the private chat's
holder, a chat's Agent and the restart card, kept across a reopen."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.aliases import FeishuApp
from hub.config import HubSettings
from hub.people import Alias, OtherIds, People, Resolved, TwoPrincipals
from hub.preferences import RestartCard
from hub.services import Hub
from hub.state import State

ANNA = [Alias("feishu_union_id", "on_anna"), Alias("feishu:t:user_id", "u_anna")]


@pytest.fixture
def state(tmp_path: Path) -> Iterator[State]:
    opened = State(tmp_path / "state.sqlite3")
    yield opened
    opened.close()


def test_aliases_nobody_holds_enrol_a_newcomer_under_a_free_name_only_when_asked(
    state: State,
) -> None:
    people = People(state)
    assert people.resolve(ANNA, None) == Resolved(None)
    state.add_principal("feishu-anna", "user")
    found = people.resolve(ANNA, "feishu-anna")
    assert isinstance(found, Resolved) and found.enrolled and found.taken == ()
    assert found.principal is not None and found.principal.name == "feishu-anna-2"
    assert people.aliases(found.principal.id) == sorted(ANNA, key=lambda a: a.kind)
    # Known now: the same Principal, nobody new.
    assert people.resolve(ANNA[:1], "feishu-anna") == Resolved(found.principal)


def test_aliases_that_disagree_are_a_typed_refusal_and_change_nothing(state: State) -> None:
    people = People(state)
    anna = people.resolve(ANNA, "anna")
    bob = people.resolve([Alias("feishu_union_id", "on_bob")], "bob")
    assert isinstance(anna, Resolved) and anna.principal is not None
    assert isinstance(bob, Resolved) and bob.principal is not None
    before = state.aliases(anna.principal.id)
    two = people.resolve([Alias("feishu_union_id", "on_bob"), ANNA[1]], "x")
    assert two == TwoPrincipals(tuple(sorted((anna.principal.id, bob.principal.id))))
    other = people.resolve([ANNA[0], Alias("feishu:t:user_id", "u_else")], "x")
    assert other == OtherIds(anna.principal.id, ("feishu:t:user_id",))
    assert state.aliases(anna.principal.id) == before
    assert [p.name for p in state.principals()] == ["anna", "bob"]


def test_a_private_chat_belongs_to_whoever_was_last_seen_in_it(state: State) -> None:
    people = People(state)
    anna = state.add_principal("anna", "user")
    bob = state.add_principal("bob", "user")
    assert people.private_chat_holder("oc_1") is None
    people.note_private_chat("oc_1", anna)
    people.note_private_chat("oc_1", bob)
    assert people.private_chat_holder("oc_1") == bob
    people.note_private_chat("", anna)
    assert people.private_chat_holder("") is None


def test_the_owner_claim_moves_aliases_and_the_app_is_recorded(state: State) -> None:
    people = People(state)
    owner = state.add_principal("owner", "user", owner=True)
    assert not people.has_feishu_identity(owner.id)
    found = people.resolve(ANNA, "anna")
    assert isinstance(found, Resolved) and found.principal is not None
    people.move_aliases(ANNA, owner.id)
    assert people.has_feishu_identity(owner.id)
    assert people.aliases(found.principal.id) == []
    assert people.recorded_app() is None
    assert people.bind_app(FeishuApp("cli_a", "t")) == []
    assert people.recorded_app() == FeishuApp("cli_a", "t")


def test_a_chats_agent_and_the_restart_card_are_kept_across_a_restart(tmp_path: Path) -> None:
    settings = HubSettings(home=tmp_path / "amux-home")
    hub = Hub.open(settings, providers=("claude", "codex"))
    try:
        assert hub.chats.provider("oc_1") is None
        assert hub.chats.choose_provider("oc_1", "gemini") == "unknown_provider"
        assert hub.chats.choose_provider("", "codex") == "no_chat"
        assert hub.chats.choose_provider("oc_1", "codex") == "saved"
        hub.restart_cards.remember(RestartCard("om_1", "p_1"))
    finally:
        hub.close()
    hub = Hub.open(settings, providers=("claude", "codex"))
    try:
        assert hub.chats.provider("oc_1") == "codex"
        assert hub.chats.provider("oc_2") is None
        assert hub.restart_cards.take() == RestartCard("om_1", "p_1")
        assert hub.restart_cards.take() is None
    finally:
        hub.close()
