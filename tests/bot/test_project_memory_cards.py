"""My memory opened from a card in a chat bound to a project, as Feishu users meet it: in a
bound group (under isolation) it is the project's memory, which every member may read there and
only the owner may change from a card; a private chat, bound or not, shows its person's own.
The real bot behind the fake Feishu server; no worker needed."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from hub.history import Author
from hub.paths import GLOBAL_SCOPE, principal_scope
from tests.bot.test_bot_flows import (
    ALICE,
    BOB,
    GROUP,
    Bot,
    buttons,
    card_text,
    private_chat,
    running_bot,
)
from tests.bot.test_project_chats import make_repo, said

pytestmark = pytest.mark.timeout(120)

TEAM = "team/deploy.md"
TEAM_TEXT = "# Deploy\nthe team ships on Tuesdays\n"
TEAM_AFTER = "# Deploy\nthe team ships on Thursdays\n"
BOBS = "me/secret.md"
ALICES = "me/alice.md"


def revision(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


def listed_paths(card: dict[str, Any]) -> list[str]:
    return [b["path"] for b in buttons(card) if b["action"] == "memory.open"]


async def bound_team(bot: Bot, tmp_path: Path) -> str:
    """Project ``web`` bound to the group by the owner, with a document in its memory that the
    project's group turns wrote and then changed; each member with a document of their own.
    Returns the project's scope."""
    project = await bot.hub.projects.add(
        "web", by=bot.ids["alice"], path=str(make_repo(tmp_path / "repo"))
    )
    assert "bound to project" in await said(bot, "/amux project bind web", ALICE, group=True)
    history, team = bot.hub.history, principal_scope(project.principal_id)
    author = Author(project.principal_id, "mcp")
    await history.upsert(team, TEAM, TEAM_TEXT, "absent", author)
    await history.upsert(team, TEAM, TEAM_AFTER, revision(TEAM_TEXT), author)
    for who, path in (("bob", BOBS), ("alice", ALICES)):
        person = bot.ids[who]
        await history.upsert(
            principal_scope(person), path, "mine\n", "absent", Author(person, "cli")
        )
    # Each person opened /amux in their private chat once, as the My memory button comes from.
    for who in (ALICE, BOB):
        await bot.reply_to(await bot.say("/amux", who))
    return team


async def test_my_memory_in_a_bound_group_is_the_projects_and_a_private_chat_keeps_ones_own(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, memory=True, isolation=True) as bot:
        await bound_team(bot, tmp_path)
        # The owner's own private chat is bound too: it still shows her own memory.
        assert "Turns here keep your own memory" in await said(
            bot, "/amux project bind web", ALICE, group=False
        )

        # The way in from the group: /amux project answers with the project memory's button.
        asked = await bot.say("/amux project", BOB, group=True, mention=True)
        answer = await bot.reply_to(asked)
        assert answer.msg_type == "interactive"
        assert "bound to project **web**" in card_text(answer.card)
        (open_memory,) = [b for b in buttons(answer.card) if b["action"] == "memory.list"]
        in_group = await bot.card_after(
            open_memory, who=BOB, chat_id=GROUP, message_id=answer.message_id
        )
        assert listed_paths(in_group) == [TEAM]
        assert "The memory of project **web**" in card_text(in_group)
        assert "secret" not in card_text(in_group)
        found = await bot.card_after(
            {"action": "memory.search"}, who=BOB, chat_id=GROUP, form_value={"query": "mine"}
        )
        assert BOBS not in card_text(found) and "Nothing matched" in card_text(found)
        opened = await bot.card_after(
            {"action": "memory.open", "path": TEAM}, who=BOB, chat_id=GROUP
        )
        assert "Thursdays" in card_text(opened)
        own_in_group = await bot.card_after(
            {"action": "memory.open", "path": BOBS}, who=BOB, chat_id=GROUP
        )
        assert f"{BOBS} no longer exists" in card_text(own_in_group)

        privately = await bot.card_after({"action": "memory.list"}, who=BOB)
        assert listed_paths(privately) == [BOBS]
        assert "project" not in card_text(privately)
        alice_bound_private = await bot.card_after(
            {"action": "memory.list"}, who=ALICE, chat_id=private_chat(ALICE)
        )
        assert listed_paths(alice_bound_private) == [ALICES]
        alice_in_group = await bot.card_after({"action": "memory.list"}, who=ALICE, chat_id=GROUP)
        assert listed_paths(alice_in_group) == [TEAM]


async def test_a_member_cannot_change_the_projects_memory_from_a_card_and_the_owner_can(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, memory=True, isolation=True) as bot:
        team = await bound_team(bot, tmp_path)
        store = bot.hub.store
        opened = await bot.card_after(
            {"action": "memory.open", "path": TEAM}, who=BOB, chat_id=GROUP
        )
        (restore,) = [b for b in buttons(opened) if b["action"] == "memory.restore"]
        (forget,) = [b for b in buttons(opened) if b["action"] == "memory.forget.ask"]
        attempts = [
            forget,
            dict(forget, action="memory.forget.confirm"),
            restore,
            {"action": "memory.erase.ask", "path": TEAM},
            {"action": "memory.erase.ask"},
            {"action": "memory.erase.confirm"},
        ]
        for value in attempts:
            refused = await bot.card_after(value, who=BOB, chat_id=GROUP)
            shown = card_text(refused)
            assert "Owner only" in shown, (value, shown)
            assert "only the owner of this Hub changes or erases it" in shown
            assert "project **web**" in shown
        kept = await store.get(team, TEAM)
        assert kept.exists and kept.content == TEAM_AFTER
        # Bob's own memory is his to change from his private chat, as before.
        bobs = principal_scope(bot.ids["bob"])
        mine = await bot.card_after({"action": "memory.open", "path": BOBS}, who=BOB)
        (own_forget,) = [b for b in buttons(mine) if b["action"] == "memory.forget.ask"]
        await bot.card_after(dict(own_forget, action="memory.forget.confirm"), who=BOB)
        assert not (await store.get(bobs, BOBS)).exists

        # The owner restores the project's earlier version from the group's card.
        done = await bot.card_after(restore, who=ALICE, chat_id=GROUP)
        assert "is back at revision" in card_text(done)
        assert (await store.get(team, TEAM)).content == TEAM_TEXT
        log = await bot.card_after({"action": "memory.history"}, who=BOB, chat_id=GROUP)
        assert "restore" in card_text(log) and "project:web (card)" in card_text(log)
        assert (await store.get(principal_scope(bot.ids["alice"]), ALICES)).exists


async def test_only_the_owner_undoes_a_bound_groups_turn_from_its_result_card(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, memory=True, isolation=True) as bot:
        team = await bound_team(bot, tmp_path)
        project = bot.hub.projects.get("web")
        # The Undo a group turn's result card carries for its change of the project's memory.
        undo = {
            "action": "memory.undo",
            "path": TEAM,
            "revision": revision(TEAM_AFTER),
            "previous_revision": revision(TEAM_TEXT),
            "principal_id": project.principal_id,
        }
        refused = await bot.click(undo, BOB, chat_id=GROUP)
        assert refused["toast"]["type"] == "error"
        assert "Only the owner of this memory" in refused["toast"]["content"]
        assert (await bot.hub.store.get(team, TEAM)).content == TEAM_AFTER

        undone = await bot.click(undo, ALICE, chat_id=GROUP)
        assert undone["toast"]["type"] == "success", undone
        assert (await bot.hub.store.get(team, TEAM)).content == TEAM_TEXT
        # The owner's own memory is untouched.
        assert (await bot.hub.store.get(principal_scope(bot.ids["alice"]), ALICES)).exists


async def test_without_isolation_a_bound_groups_memory_card_is_the_one_global_memory(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, memory=True, isolation=False) as bot:
        await bot.hub.projects.add("web", by=bot.ids["alice"], path=str(make_repo(tmp_path / "r")))
        assert "bound to project" in await said(bot, "/amux project bind web", ALICE, group=True)
        shared = await bot.hub.store.upsert(GLOBAL_SCOPE, "shared.md", "everyone\n", "absent")
        # No memory of the project's own to open: /amux project answers in words only.
        answer = await bot.reply_to(await bot.say("/amux project", BOB, group=True, mention=True))
        assert answer.msg_type == "text" and "bound to project web (from main)." in answer.content
        in_group = await bot.card_after({"action": "memory.list"}, who=BOB, chat_id=GROUP)
        assert listed_paths(in_group) == ["shared.md"]
        assert "project" not in card_text(in_group)
        # As in any chat: whoever may change the global memory may do so here.
        value = {
            "action": "memory.forget.confirm",
            "path": "shared.md",
            "revision": shared.revision,
        }
        done = await bot.card_after(value, who=BOB, chat_id=GROUP)
        assert "was deleted" in card_text(done)
        assert not (await bot.hub.store.get(GLOBAL_SCOPE, "shared.md")).exists


async def test_ones_own_memory_card_clicked_in_an_unbound_group_shows_nothing_of_it(
    tmp_path: Path,
) -> None:
    # A card forwarded from a private chat into a group: its update would be seen by everyone.
    async with running_bot(tmp_path, memory=True, isolation=True) as bot:
        bobs = principal_scope(bot.ids["bob"])
        await bot.hub.history.upsert(bobs, BOBS, "mine\n", "absent", Author(bot.ids["bob"], "cli"))
        await bot.reply_to(await bot.say("/amux", BOB))
        for value in (
            {"action": "memory.list"},
            {"action": "memory.open", "path": BOBS},
            {"action": "memory.history"},
            {"action": "memory.erase.ask", "path": BOBS},
            {"action": "memory.erase.confirm", "path": BOBS},
        ):
            refused = card_text(await bot.card_after(value, who=BOB, chat_id=GROUP))
            assert "shown only in your private chat with the bot" in refused, (value, refused)
            assert "secret" not in refused and "mine" not in refused
        assert (await bot.hub.store.get(bobs, BOBS)).exists
        # In his private chat the same card is his, as before.
        assert listed_paths(await bot.card_after({"action": "memory.list"}, who=BOB)) == [BOBS]
