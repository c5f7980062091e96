"""A turn's memory on its Feishu result card: what it saved, with an Undo only the memory's
owner can press. The real ``claude`` CLI saves through the real ``amux mcp`` against the scripted
model."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from hub.history import Author
from hub.paths import GLOBAL_SCOPE, principal_scope
from tests.bot.test_bot_flows import ALICE, BOB, buttons, card_text, running_bot
from tests.bot.test_bot_turns import claude_worker
from tests.conftest import until
from tests.fakes.model_server import Answer, CallTool, FakeModelServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PATH = "topics/review-format.md"
BEFORE = "# Review format\nconclusion first\n"
AFTER = "# Review format\nconclusion, evidence, unresolved questions\n"


def revision(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def test_a_turn_that_saves_shows_the_path_and_only_its_owner_can_undo_it(
    tmp_path: Path,
) -> None:
    script = [
        CallTool(
            "mcp__memory__amux_memory_upsert",
            {"path": PATH, "content": AFTER, "expected_revision": revision(BEFORE)},
        ),
        Answer("Updated the review format."),
    ]
    async with (
        FakeModelServer(script) as model,
        running_bot(tmp_path, memory=True, isolation=True) as bot,
        claude_worker(bot, tmp_path, model),
    ):
        alice = bot.ids["alice"]
        scope = principal_scope(alice)
        await bot.hub.history.upsert(scope, PATH, BEFORE, "absent", Author(alice, "cli"))

        asked = await bot.say("Add evidence and open questions to our review format")
        progress = await bot.reply_to(asked)
        await until(lambda: "**Memory**" in card_text(progress.card), seconds=90)
        shown = card_text(progress.card)
        assert f"Saved `{PATH}` ({revision(AFTER)[:8]})" in shown
        (undo,) = [b for b in buttons(progress.card) if b["action"] == "memory.undo"]
        assert undo["principal_id"] == alice
        assert undo["previous_revision"] == revision(BEFORE)

        refused = await bot.click(undo, BOB)
        assert "Only the owner of this memory" in refused["toast"]["content"]
        assert (await bot.hub.store.get(scope, PATH)).revision == revision(AFTER)

        undone = await bot.click(undo)
        assert undone["toast"]["type"] == "success", undone
        assert (await bot.hub.store.get(scope, PATH)).content == BEFORE
        latest = bot.hub.history.entries(scope, alice, PATH).entries[0]
        assert (latest.action, latest.via) == ("restore", "card")

        # Pressed again, the document is no longer as the turn left it.
        again = await bot.click(undo)
        assert "changed since" in again["toast"]["content"]
        assert (await bot.hub.store.get(scope, PATH)).content == BEFORE


async def test_a_bound_turn_that_touches_no_memory_says_so(tmp_path: Path) -> None:
    async with (
        FakeModelServer([Answer("Just an answer.")]) as model,
        running_bot(tmp_path, memory=True) as bot,
        claude_worker(bot, tmp_path, model),
    ):
        asked = await bot.say("What is two plus two?")
        progress = await bot.reply_to(asked)
        await until(lambda: "**Memory**" in card_text(progress.card), seconds=90)
        assert "Just an answer." in card_text(progress.card)
        assert "Memory not used." in card_text(progress.card)
        assert not [b for b in buttons(progress.card) if b["action"] == "memory.undo"]


async def test_my_memory_lists_changes_restores_a_version_and_erases_with_a_receipt(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, memory=True, isolation=True) as bot:
        alice = bot.ids["alice"]
        scope = principal_scope(alice)
        history = bot.hub.history
        await history.upsert(scope, PATH, BEFORE, "absent", Author(alice, "cli"))
        await history.upsert(scope, PATH, AFTER, revision(BEFORE), Author(alice, "cli"))
        # My memory is opened from the /amux card in each one's private chat with the bot.
        for who in (ALICE, BOB):
            await bot.reply_to(await bot.say("/amux", who))

        opened = await bot.card_after({"action": "memory.open", "path": PATH})
        shown = card_text(opened)
        assert "Recent changes" in shown and "alice (cli)" in shown
        assert "restorable until" in shown
        (restore,) = [b for b in buttons(opened) if b["action"] == "memory.restore"]
        assert restore["revision"] == revision(BEFORE)
        assert restore["expected_revision"] == revision(AFTER)

        # Bob's memory holds none of this: his list of changes is empty.
        theirs = await bot.card_after({"action": "memory.history"}, who=BOB)
        assert "No changes recorded." in card_text(theirs)

        done = await bot.card_after(restore)
        assert "is back at revision" in card_text(done)
        assert (await bot.hub.store.get(scope, PATH)).content == BEFORE
        changes = await bot.card_after({"action": "memory.history"})
        assert "restore" in card_text(changes)

        ask = await bot.card_after({"action": "memory.erase.ask"})
        # One document, its two kept earlier versions, three log entries.
        assert "removes **1** document(s)" in card_text(ask)
        assert "**2** kept earlier version(s)" in card_text(ask)
        assert "**3** change-log entries" in card_text(ask)
        assert "not erased" in card_text(ask)
        (confirm,) = [b for b in buttons(ask) if b["action"] == "memory.erase.confirm"]
        receipt = await bot.card_after(confirm)
        assert "Removed 1 document(s) and 2 kept earlier version(s)" in card_text(receipt)
        assert (await bot.hub.store.get(scope, PATH)).exists is False
        assert list((bot.hub.settings.home / "memory-history").rglob("*.md")) == []


async def test_erasing_my_shared_memory_keeps_and_names_what_a_colleague_changed_too(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, memory=True, isolation=False) as bot:
        alice, bob = bot.ids["alice"], bot.ids["bob"]
        history = bot.hub.history
        shared, mine = "topics/shared.md", "topics/alice-only.md"
        await history.upsert(GLOBAL_SCOPE, shared, BEFORE, "absent", Author(bob, "cli"))
        await history.upsert(GLOBAL_SCOPE, shared, AFTER, revision(BEFORE), Author(alice, "cli"))
        await history.upsert(GLOBAL_SCOPE, mine, BEFORE, "absent", Author(alice, "cli"))

        ask = await bot.card_after({"action": "memory.erase.ask"})
        assert "removes **1** document(s)" in card_text(ask)
        assert f"Kept **1** shared document(s) someone else changed too: `{shared}`" in card_text(
            ask
        )
        (confirm,) = [b for b in buttons(ask) if b["action"] == "memory.erase.confirm"]
        receipt = card_text(await bot.card_after(confirm))
        assert "Removed 1 document(s)" in receipt
        assert f"`{shared}`" in receipt and "someone else changed too" in receipt

        store = bot.hub.store
        assert (await store.get(GLOBAL_SCOPE, mine)).exists is False
        assert (await store.get(GLOBAL_SCOPE, shared)).content == AFTER
