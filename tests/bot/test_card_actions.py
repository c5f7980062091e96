"""The card action table: who may click what, unknown and malformed clicks, and that every action
of the wire vocabulary is routed. Clicks go through the fake Feishu and lark-oapi, as users make
them; the table's own rules are also checked directly."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest

from bot.actions import (
    ActionTable,
    Click,
    DocumentRef,
    Draft,
    ListRequest,
    MemoryTarget,
    OpenRequest,
    Restore,
    action_table,
    no_value,
)
from bot.feishu.events import CardAction, CardResponse, UserIds
from cards import actions
from hub.errors import InvalidArgument, InvalidPath
from hub.history import Author
from hub.paths import GLOBAL_SCOPE, principal_scope
from hub.state import Principal
from tests.bot.test_bot_flows import ALICE, BOB, buttons, card_text, running_bot

pytestmark = pytest.mark.timeout(120)

# What a card of each owner-only action carries, so the refusal is not for want of fields.
DRAFT = {
    "memory_enabled": True,
    "isolation": True,
    "history_days": 7,
    "max_queued": 2,
    "messages_per_minute": 3,
    "permissions": "auto",
    "approval_timeout": 60,
}


def owner_only(answer: dict[str, Any]) -> bool:
    """Whether a click was answered Owner only: with that card, or for an action answered with
    a toast (its card shared, as the owner's budget requests), with that toast and no card."""
    if "card" in answer:
        return "Owner only" in card_text(answer["card"]["data"])
    toast = answer.get("toast", {})
    return toast.get("type") == "error" and "Only the owner" in toast.get("content", "")


def logged(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


@pytest.mark.parametrize("action", sorted(actions.OWNER_ONLY))
async def test_a_member_clicking_an_owner_only_action_gets_owner_only_and_nothing_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, action: str
) -> None:
    async with running_bot(tmp_path) as bot:
        before = bot.hub.config.saved()
        refused = await bot.click(dict(DRAFT, action=action), who=BOB)
        assert owner_only(refused)
        # Refused before the value is read: a forged value gets the same answer.
        forged = await bot.click({"action": action, "history_days": "abc"}, who=BOB)
        assert owner_only(forged)
        assert bot.hub.config.saved() == before
        assert not bot.hub.restart_requested.is_set()
    assert len(logged(caplog, f"refused owner-only card action {action} from bob")) == 2


async def test_an_action_this_version_does_not_know_is_logged_and_leaves_the_card(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path) as bot:
        assert await bot.click({"action": "memory.teleport", "path": "a.md"}) == {}
        assert await bot.click({"action": "memory.teleport"}, BOB) == {}
    assert len(logged(caplog, "unknown card action 'memory.teleport'")) == 2


async def test_a_malformed_value_is_refused_with_the_readable_error_card(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path) as bot:
        before = bot.hub.config.saved()
        for action in (actions.QUEUED_MAX, actions.SETTINGS_SAVE, actions.PERMISSIONS_SET):
            value = {"action": action, "max_queued": "lots", "permissions": "auto"}
            shown = card_text(await bot.card_after(value))
            assert "Something went wrong" in shown, action
            assert "turns.max_queued_per_principal:" in html.unescape(shown), action
        # Nothing of those clicks was saved, the live permission setting included.
        assert bot.hub.config.saved() == before
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


async def test_a_refused_toast_action_answers_with_an_error_toast(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        answer = await bot.click({"action": actions.RUN_CANCEL, "run_id": "exe_gone"})
        assert answer["toast"]["type"] == "error"
        assert answer["toast"]["content"]
        assert "card" not in answer


async def test_every_action_of_the_vocabulary_reaches_a_handler(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path) as bot:
        for action in sorted(actions.ALL):
            answer = await bot.click({"action": action})
            assert answer.get("card") or answer.get("toast"), action
    assert logged(caplog, "unknown card action") == []
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


async def test_the_table_routes_each_name_of_the_vocabulary_once() -> None:
    async def handler(click: Any, value: None) -> CardResponse:
        return CardResponse(toast="done")

    table = ActionTable("en_us")
    table.toast(actions.RUN_CANCEL, no_value, handler)
    with pytest.raises(ValueError, match="routed twice"):
        table.card(actions.RUN_CANCEL, no_value, handler)
    with pytest.raises(ValueError, match="unknown card action"):
        table.toast("run.teleport", no_value, handler)
    assert table.names == {actions.RUN_CANCEL}


def test_a_draft_keeps_what_an_older_card_lacks_and_refuses_a_forged_number() -> None:
    assert Draft.parse({"memory_enabled": "yes", "history_days": 7}) == Draft(
        None, None, 7, None, None
    )
    with pytest.raises(InvalidArgument, match="feishu.messages_per_minute"):
        Draft.parse({"messages_per_minute": -1})


# -- the memory actions: one handler each, with a typed value ----------------------------------

# Each memory action, a value of it, and the handler and typed value it reaches.
MEMORY_ROUTES: list[tuple[str, dict[str, Any], str, object]] = [
    (actions.MEMORY_LIST, {"path_prefix": "notes"}, "memory_list", ListRequest("notes")),
    (actions.MEMORY_SEARCH, {}, "memory_search", None),
    (actions.MEMORY_OPEN, {"path": "a.md", "offset": 8}, "memory_open", OpenRequest("a.md", 8)),
    (
        actions.MEMORY_FORGET_ASK,
        {"path": "a.md", "revision": "r1"},
        "forget_ask",
        DocumentRef("a.md", "r1"),
    ),
    (
        actions.MEMORY_FORGET_CONFIRM,
        {"path": "a.md", "revision": "r1"},
        "forget_confirm",
        DocumentRef("a.md", "r1"),
    ),
    (actions.MEMORY_HISTORY, {}, "memory_history", MemoryTarget(None)),
    (
        actions.MEMORY_RESTORE,
        {"path": "a.md", "revision": "r0", "expected_revision": "r1"},
        "restore",
        Restore("a.md", "r0", "r1"),
    ),
    (actions.MEMORY_ERASE_ASK, {"path": ""}, "erase_ask", MemoryTarget(None)),
    (actions.MEMORY_ERASE_CONFIRM, {"path": "a.md"}, "erase_confirm", MemoryTarget("a.md")),
]


class RecordingManagement:
    """Stands in for ``Management``: each memory handler records what reached it."""

    def __init__(self) -> None:
        self.reached: list[tuple[str, object]] = []

    def __getattr__(self, name: str) -> Any:
        async def handler(click: Click, value: object) -> dict[str, Any]:
            self.reached.append((name, value))
            return {"handled_by": name}

        return handler


@pytest.mark.parametrize(("action", "value", "handler", "typed"), MEMORY_ROUTES)
async def test_each_memory_action_reaches_its_own_handler_with_its_typed_value(
    action: str, value: dict[str, Any], handler: str, typed: object
) -> None:
    management = RecordingManagement()
    table = action_table(management, None, "en_us")  # type: ignore[arg-type]
    clicker = Principal("p_alice", "alice", "user", True)
    event = CardAction(
        event_id="",
        operator=UserIds(),
        value=dict(value, action=action),
        form_value=None,
        open_message_id="om_card",
        chat_id="oc_chat",
    )
    answer = await table.dispatch(event, clicker)
    assert answer == CardResponse(card={"handled_by": handler})
    assert management.reached == [(handler, typed)]


def test_the_memory_values_keep_what_older_cards_lack() -> None:
    assert ListRequest.parse({}) == ListRequest(None)
    assert OpenRequest.parse({"path": "a.md"}) == OpenRequest("a.md", None)
    assert DocumentRef.parse({"path": "a.md"}) == DocumentRef("a.md", "")
    assert Restore.parse({"path": "a.md", "revision": "r0"}) == Restore("a.md", "r0", "absent")
    assert MemoryTarget.parse({"path": None}) == MemoryTarget(None)


@pytest.mark.parametrize(
    ("value", "refusal"),
    [
        ({}, "path must be a string"),
        ({"path": ["a.md"]}, "path must be a string"),
        ({"path": "a.md", "revision": 5}, "revision must be a string"),
        ({"path": "a.md", "expected_revision": ["r1"]}, "expected_revision must be a string"),
    ],
)
def test_a_forged_memory_value_is_refused_by_its_parser(
    value: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(InvalidArgument, match=refusal):
        Restore.parse(value)


def test_a_forged_path_or_offset_is_never_taken_for_none() -> None:
    # A path that is not one is refused, never read as the whole memory.
    with pytest.raises(InvalidPath, match="path must be a string"):
        MemoryTarget.parse({"path": 3})
    with pytest.raises(InvalidArgument, match="offset must be an integer"):
        OpenRequest.parse({"path": "a.md", "offset": True})


async def test_a_malformed_memory_value_is_refused_with_the_readable_error_card(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path, memory=True) as bot:
        await bot.hub.store.upsert("global", "a.md", "kept\n", "absent")
        for value, refusal in (
            ({"action": actions.MEMORY_OPEN}, "path must be a string"),
            ({"action": actions.MEMORY_OPEN, "path": "a.md", "offset": "x"}, "offset must be"),
            ({"action": actions.MEMORY_LIST, "path_prefix": ["a"]}, "path_prefix must be"),
            ({"action": actions.MEMORY_FORGET_ASK, "revision": "r1"}, "path must be a string"),
            (
                {"action": actions.MEMORY_RESTORE, "path": "a.md", "revision": ["r0"]},
                "revision must be a string",
            ),
            ({"action": actions.MEMORY_ERASE_CONFIRM, "path": {"all": True}}, "path must be"),
        ):
            shown = card_text(await bot.card_after(value))
            assert "Something went wrong" in shown, value
            assert refusal in html.unescape(shown), value
        assert (await bot.hub.store.get("global", "a.md")).exists
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


async def test_each_memory_action_answers_with_its_own_card(tmp_path: Path) -> None:
    async with running_bot(tmp_path, memory=True, isolation=True) as bot:
        alice = bot.ids["alice"]
        scope, history = principal_scope(alice), bot.hub.history
        first = await history.upsert(scope, "a.md", "first\n", "absent", Author(alice, "cli"))
        second = await history.upsert(
            scope, "a.md", "second\n", first.revision, Author(alice, "cli")
        )
        # My memory is opened from the /amux card in her private chat with the bot.
        await bot.reply_to(await bot.say("/amux", ALICE))

        listed = await bot.card_after({"action": actions.MEMORY_LIST})
        assert [b["path"] for b in buttons(listed) if b["action"] == actions.MEMORY_OPEN] == [
            "a.md"
        ]
        found = await bot.card_after(
            {"action": actions.MEMORY_SEARCH}, form_value={"query": "second"}
        )
        assert "Search: second" in card_text(found)
        empty = await bot.card_after({"action": actions.MEMORY_SEARCH}, form_value={"query": " "})
        assert "type some keywords to search for" in card_text(empty)
        opened = await bot.card_after({"action": actions.MEMORY_OPEN, "path": "a.md"})
        assert second.revision[:8] in card_text(opened)
        gone = await bot.card_after({"action": actions.MEMORY_OPEN, "path": "b.md"})
        assert "b.md no longer exists" in card_text(gone)
        changes = await bot.card_after({"action": actions.MEMORY_HISTORY})
        assert "Changes to my memory" in card_text(changes)
        ask = {"action": actions.MEMORY_FORGET_ASK, "path": "a.md", "revision": second.revision}
        assert "Forget this document?" in card_text(await bot.card_after(ask))
        restore = {
            "action": actions.MEMORY_RESTORE,
            "path": "a.md",
            "revision": first.revision,
            "expected_revision": second.revision,
        }
        assert "is back at revision" in card_text(await bot.card_after(restore))
        forget = {
            "action": actions.MEMORY_FORGET_CONFIRM,
            "path": "a.md",
            "revision": first.revision,
        }
        assert "Forgotten" in card_text(await bot.card_after(forget))
        preview = await bot.card_after({"action": actions.MEMORY_ERASE_ASK})
        assert "Erase for good?" in card_text(preview)
        erased = await bot.card_after({"action": actions.MEMORY_ERASE_CONFIRM})
        assert "Erased" in card_text(erased)


async def test_an_undo_edited_to_name_another_member_is_refused_and_the_change_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Without isolation everyone's turns share one memory: the Undo's ids are all Bob can edit.
    async with running_bot(tmp_path, memory=True) as bot:
        alice, bob = bot.ids["alice"], bot.ids["bob"]
        history, path = bot.hub.history, "team/plan.md"
        first = await history.upsert(GLOBAL_SCOPE, path, "v1\n", "absent", Author(bob, "cli"))
        # Alice's turn changed it; her result card's Undo names her.
        turn = Author(alice, "mcp", "ses_alice", "exe_alice")
        second = await history.upsert(GLOBAL_SCOPE, path, "v2\n", first.revision, turn)
        undo = {
            "action": actions.MEMORY_UNDO,
            "path": path,
            "revision": second.revision,
            "previous_revision": first.revision,
            "principal_id": alice,
        }
        for forged in (undo, dict(undo, principal_id=bob)):
            refused = await bot.click(forged, BOB)
            assert refused["toast"]["type"] == "error"
            assert "Only the owner of this memory" in refused["toast"]["content"]
            assert (await bot.hub.store.get(GLOBAL_SCOPE, path)).content == "v2\n"
        # Whoever made the change still undoes it, whatever id the value names.
        undone = await bot.click(dict(undo, principal_id=bob))
        assert undone["toast"]["type"] == "success", undone
        assert (await bot.hub.store.get(GLOBAL_SCOPE, path)).content == "v1\n"
    assert len(logged(caplog, "refused an Undo of memory not theirs from bob")) == 2
