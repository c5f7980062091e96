"""The memory service's rules, through the service itself, and the one answer its two doors give:
the RPC method and the Feishu card, for the same person."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.actions import Click, DocumentRef
from bot.management import Management
from cards import actions
from cards.memory import forget_done_card
from cards.models import ForgetOutcome
from hub.config import HubSettings
from hub.errors import AmuxError, BindingMismatch, Conflict, Forbidden, MemoryDisabled, NotFound
from hub.history import Author
from hub.identity import Actor, authenticate, in_person
from hub.memory import (
    ForgetRequest,
    GetRequest,
    HistoryRequest,
    RestoreRequest,
    SearchRequest,
    UndoRequest,
    UpsertRequest,
)
from hub.paths import principal_scope
from hub.rpc import HUB
from hub.services import Hub
from hub.state import State
from tests.hub.test_memory_history import Caller, start

PATH = "notes/plan.md"
BODY = "# Plan\nship on Friday\n"


def revision(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def open_hub(tmp_path: Path, enabled: bool = True) -> Hub:
    settings = HubSettings(home=tmp_path / "amux-home")
    state = State(settings.state_path)
    state.save_setting("memory.enabled", enabled)
    state.save_setting("memory.isolation", "on")
    state.save_setting("memory.history_days", 30)
    state.close()
    return Hub.open(settings)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    opened = open_hub(tmp_path)
    yield opened
    opened.close()


def actor_of(hub: Hub, name: str, kind: str = "cli", binding: str | None = None) -> Actor:
    """An actor made as the RPC edge makes one: from a credential's token."""
    try:
        principal = hub.state.principal_by_name(name)
    except NotFound:
        principal = hub.state.add_principal(name)
    token, _ = hub.state.issue_credential(principal.id, kind, binding=binding)
    return authenticate(hub.state, token)


async def test_with_memory_off_every_call_but_erase_is_memory_disabled(tmp_path: Path) -> None:
    hub = open_hub(tmp_path, enabled=False)
    try:
        bob = actor_of(hub, "bob")
        await hub.history.upsert(
            principal_scope(bob.principal.id), PATH, BODY, "absent", Author(bob.principal.id)
        )
        memory = hub.memory
        refused = [
            memory.search(bob, None, SearchRequest("plan")),
            memory.get(bob, None, GetRequest(PATH)),
            memory.list_documents(bob, None, None, 10),
            memory.upsert(bob, None, UpsertRequest(PATH, "x\n", revision(BODY)), "cli"),
            memory.forget(bob, None, ForgetRequest(PATH, revision(BODY)), "cli"),
            memory.restore(bob, None, RestoreRequest(PATH, "0" * 64, revision(BODY)), "cli"),
            memory.undo(bob, UndoRequest(PATH, revision(BODY), None), "card"),
        ]
        for call in refused:
            with pytest.raises(MemoryDisabled):
                await call
        with pytest.raises(MemoryDisabled):
            memory.history(bob, None, HistoryRequest())
        with pytest.raises(MemoryDisabled):
            memory.checked_scope(bob)

        assert (await memory.preview_erase(bob, None, None)).documents_removed == 1
        receipt = await memory.erase(bob, None, None, "cli")
        assert receipt.documents_removed == 1
        assert list(hub.settings.memory_root.rglob("plan.md")) == []
    finally:
        hub.close()


async def test_an_agent_credential_must_present_its_own_binding(hub: Hub) -> None:
    owner = hub.state.principal_by_name("owner")
    issued = principal_scope(owner.id)
    agent = actor_of(hub, "owner", "delegated", binding=issued)
    upsert = UpsertRequest(PATH, BODY, "absent")
    with pytest.raises(BindingMismatch, match="needs its memory binding"):
        await hub.memory.upsert(agent, None, upsert, "mcp")
    with pytest.raises(BindingMismatch, match="does not match this Agent credential"):
        await hub.memory.upsert(agent, principal_scope("someone-else"), upsert, "mcp")
    written = await hub.memory.upsert(agent, issued, upsert, "mcp")
    assert written.changed
    # Right binding or not, an Agent never erases: a person decides that.
    with pytest.raises(Forbidden, match="cannot erase memory"):
        await hub.memory.erase(agent, issued, None, "mcp")


async def test_only_the_owner_in_person_erases_another_principals_memory(hub: Hub) -> None:
    bob = actor_of(hub, "bob")
    owner = actor_of(hub, "owner")
    owners_agent = actor_of(hub, "owner", "delegated", binding=principal_scope(owner.principal.id))
    await hub.memory.upsert(bob, None, UpsertRequest(PATH, BODY, "absent"), "cli")
    for refused in (bob, owners_agent):
        with pytest.raises(Forbidden, match="only the owner"):
            await hub.memory.erase_principal(refused, bob.principal.id, "cli")
    assert (await hub.memory.get(bob, None, GetRequest(PATH))).exists
    receipt = await hub.memory.erase_principal(owner, bob.principal.id, "cli")
    assert receipt.documents_removed == 1


async def test_an_upsert_that_changes_nothing_records_no_history(hub: Hub) -> None:
    bob = actor_of(hub, "bob")
    first = await hub.memory.upsert(bob, None, UpsertRequest(PATH, BODY, "absent"), "cli")
    again = await hub.memory.upsert(bob, None, UpsertRequest(PATH, BODY, first.revision), "cli")
    assert (first.changed, again.changed) == (True, False)
    assert again.to_wire() == {"path": PATH, "revision": revision(BODY)}
    page = hub.memory.history(bob, None, HistoryRequest())
    assert [(e.action, e.via) for e in page.entries] == [("upsert", "cli")]
    assert list((hub.settings.home / "memory-history").rglob(revision(BODY))) == []


async def test_a_card_and_an_rpc_call_forget_alike_for_the_same_person(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    _, bob, _ = await start(aiohttp_client, tmp_path, isolation=True)
    hub: Hub = bob.client.server.app[HUB]
    person = hub.state.principal_by_name("bob")
    cards = Management(hub, "en_us", "claude")

    async def by_card(expected: str) -> dict[str, Any] | None:
        value = {"action": actions.MEMORY_FORGET_CONFIRM, "path": PATH, "revision": expected}
        click = Click(person, actions.MEMORY_FORGET_CONFIRM, value, {}, "om_card", "")
        return await cards.forget_confirm(click, DocumentRef.parse(value))

    async def save(rpc: Caller) -> None:
        await rpc.ok("memory.upsert", path=PATH, content=BODY, expected_revision="absent")

    # A stale revision: the same refusal, whichever door it came through.
    await save(bob)
    status, refused = await bob.call("memory.forget", path=PATH, expected_revision="0" * 64)
    assert status == 409
    with pytest.raises(Conflict) as raised:
        await by_card("0" * 64)
    error: AmuxError = raised.value
    assert error.to_wire() == refused

    # Forgotten, then forgotten again once it is gone: the card shows what the RPC answers.
    for _ in range(2):
        answer = await bob.ok("memory.forget", path=PATH, expected_revision=revision(BODY))
        shown = forget_done_card(ForgetOutcome(answer["path"], answer["already_absent"]), "en_us")
        if not answer["already_absent"]:
            await save(bob)
        assert await by_card(revision(BODY)) == shown

    # The change log tells the doors apart and nothing else.
    logged = (await bob.ok("memory.history"))["entries"]
    forgets = [e for e in logged if e["action"] == "forget"]
    assert [e["via"] for e in forgets] == ["card", "rpc"]
    ignored = {"id", "at", "via", "restorable_until"}
    card_entry, rpc_entry = ({k: v for k, v in e.items() if k not in ignored} for e in forgets)
    assert card_entry == rpc_entry

    # And the service gives the card's person the answer it gives their CLI credential.
    clicked = in_person(person, "card")
    assert not clicked.delegated
    page = hub.memory.history(clicked, None, HistoryRequest())
    assert [entry.to_wire() for entry in page.entries] == logged


async def test_a_revision_prefix_naming_two_kept_copies_is_refused(hub: Hub) -> None:
    alice = actor_of(hub, "alice")
    memory = hub.memory
    first, second, third = "# Plan\none\n", "# Plan\ntwo\n", "# Plan\nthree\n"
    await memory.upsert(alice, None, UpsertRequest(PATH, first, "absent"), "cli")
    await memory.upsert(alice, None, UpsertRequest(PATH, second, revision(first)), "cli")
    await memory.upsert(alice, None, UpsertRequest(PATH, third, revision(second)), "cli")
    # Two kept revisions that share their first 12 digits cannot be made on purpose: the log
    # is made to say so.
    shared = revision(first)[:12]
    fake = shared + "0" * 52
    hub.state.db.execute(
        "UPDATE memory_log SET previous_revision = ? WHERE previous_revision = ?",
        (fake, revision(second)),
    )
    with pytest.raises(AmuxError) as refused:
        await memory.restore(alice, None, RestoreRequest(PATH, shared, revision(third)), "cli")
    assert refused.value.code == "invalid_argument"
    assert "2 kept copies" in refused.value.message
    restored = await memory.restore(
        alice, None, RestoreRequest(PATH, revision(first)[:20], revision(third)), "cli"
    )
    assert restored.revision == revision(first)


def inotify_watches() -> int:
    """The directories this process has an inotify watch on, as the kernel lists them."""
    count = 0
    for fdinfo in Path("/proc/self/fdinfo").iterdir():
        try:
            count += fdinfo.read_text().count("inotify wd:")
        except OSError:
            continue
    return count


async def test_a_closed_hub_gives_back_what_its_memory_watched(tmp_path: Path) -> None:
    # The watch belongs to the process, which opens another Hub on an in-place restart.
    before = inotify_watches()
    opened = open_hub(tmp_path)
    await opened.store.upsert("global", PATH, BODY, "absent")
    found = await opened.store.search("global", "friday", None, 5)
    assert [match.path for match in found.matches] == [PATH]
    assert inotify_watches() > before
    opened.close()
    assert inotify_watches() == before
