"""The Projects section of the owner's `/amux` card, as the owner and members meet it: the real
bot behind the fake Feishu server, each click signed as Feishu sends it and answered through the
real aiohttp server; the card Feishu gets back is what is checked. No worker needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cards.elements import CARD_MAX_BYTES, encoded_size
from tests.bot.test_bot_flows import (
    ALICE,
    BOB,
    GROUP,
    Bot,
    button_nodes,
    buttons,
    card_text,
    markdown_of,
    private_chat,
    running_bot,
)
from tests.bot.test_project_chats import make_repo, said
from tests.cards.structure import walk
from tests.conftest import until

pytestmark = pytest.mark.timeout(120)


async def open_management(bot: Bot, who: dict[str, str] = ALICE) -> dict[str, Any]:
    reply = await bot.reply_to(await bot.say("/amux", who))
    assert reply.card is not None
    return reply.card


def actions_of(card: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [b for b in buttons(card) if b["action"] == action]


def options(card: dict[str, Any], name: str) -> dict[str, str]:
    """The choices of the card's drop-down ``name``: value to label."""
    return {
        option["value"]: option["text"]["content"]
        for element in walk(card)
        if element["tag"] == "select_static" and element.get("name") == name
        for option in element["options"]
    }


def posted_to(bot: Bot, chat_id: str, part: str) -> list[str]:
    """Texts the bot posted to ``chat_id`` (not as replies) that hold ``part``."""
    texts = [
        json.loads(m.content).get("text", "")
        for m in bot.feishu.messages.values()
        if m.chat_id == chat_id and not m.root_id and m.msg_type == "text" and not m.sender_open_id
    ]
    return [t for t in texts if part in t]


def switch(card: dict[str, Any], name: str) -> dict[str, Any]:
    """The callback value of the card's checker ``name``."""
    (checker,) = [
        e for e in card["body"]["elements"] if e.get("tag") == "checker" and e["name"] == name
    ]
    value: dict[str, Any] = checker["behaviors"][0]["value"]
    return value


def primary_labels(card: dict[str, Any], action: str) -> list[str]:
    return [
        node["text"]["content"]
        for node in button_nodes(card)
        if node.get("type") == "primary" and node["behaviors"][0]["value"]["action"] == action
    ]


async def bind(bot: Bot, card: dict[str, Any], chat_id: str, project: str, **kw: Any) -> Any:
    """Submit the card's bind form with ``chat_id`` and ``project`` chosen."""
    (submit,) = actions_of(card, "project.bind")
    form = {"chat_id": chat_id, "project": project}
    return await bot.card_after(submit, form_value=form, **kw)


async def with_projects(bot: Bot, tmp_path: Path) -> None:
    """Two projects, a group that @mentioned the bot, and Bob's private chat."""
    alice = bot.ids["alice"]
    await bot.hub.projects.add("web", by=alice, path=str(make_repo(tmp_path / "web")))
    await bot.hub.projects.add(
        "api",
        by=alice,
        path=str(make_repo(tmp_path / "api")),
        provider="codex",
        permissions="read-only",
    )
    assert "bound to no project" in await said(bot, "/amux project", BOB, group=True)
    await open_management(bot, BOB)


async def test_the_owner_binds_a_known_chat_to_a_project_from_the_card_and_unbinds_it(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        await with_projects(bot, tmp_path)
        card = await open_management(bot)
        shown = markdown_of(card)
        assert "**Projects**" in shown
        assert f"**api** · repository `{tmp_path / 'api'}` from `main` · Agent `codex`" in shown
        assert "permissions **Read-only**" in shown and "no chat is bound to it" in shown
        assert "`amux project add NAME --path" in shown
        offered = options(card, "chat_id")
        assert offered == {
            private_chat(ALICE): "alice's private chat",
            private_chat(BOB): "bob's private chat",
            GROUP: f"group {GROUP}",
        }
        assert set(options(card, "project")) == {"api", "web"}

        # An unsaved draft of the restart settings stays on the card through the bind.
        drafted = await bot.card_after(switch(card, "memory_enabled"))
        assert "You have unsaved changes." in card_text(drafted)

        bound = await bind(bot, drafted, GROUP, "web")
        assert f"Bound group `{GROUP}` to project **web**." in markdown_of(bound)
        assert "You have unsaved changes." in card_text(bound)
        project = bot.hub.projects.binding_of(GROUP)
        assert project is not None and project.name == "web"
        # The group is told, as if /amux project bind had been typed there, and says so after.
        told = await until(lambda: posted_to(bot, GROUP, "now bound to project web:"))
        assert "share the project's memory" in told[0]
        assert "bound to project web (from main)." in await said(
            bot, "/amux project", BOB, group=True
        )
        (unbind,) = actions_of(bound, "project.unbind")
        assert (unbind["chat_id"], unbind["project"]) == (GROUP, "web")
        assert f"- group `{GROUP}`" in card_text(bound)
        assert GROUP not in options(bound, "chat_id")

        # A private chat bound from the card keeps its person's memory; the group is freed.
        bound_private = await bind(bot, bound, private_chat(BOB), "api")
        assert "Bound bob's private chat to project **api**." in markdown_of(bound_private)
        told = await until(lambda: posted_to(bot, private_chat(BOB), "project api:"))
        assert "keep your own memory" in told[0]
        unbound = await bot.card_after(unbind)
        assert f"Unbound group `{GROUP}` from project **web**." in markdown_of(unbound)
        await until(lambda: posted_to(bot, GROUP, "no longer bound to project web;"))
        assert bot.hub.projects.binding_of(GROUP) is None
        assert GROUP in options(unbound, "chat_id")
        api = bot.hub.projects.binding_of(private_chat(BOB))
        assert api is not None and api.name == "api"


async def test_the_owner_sets_how_long_unused_checkouts_are_kept_at_once(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        card = await open_management(bot)
        assert "**Checkouts kept unused**: **14** days" in markdown_of(card)
        assert primary_labels(card, "projects.worktree") == ["14 days"]
        (thirty,) = [b for b in actions_of(card, "projects.worktree") if b["worktree_days"] == 30]
        after = await bot.card_after(thirty)
        assert bot.hub.config.worktree_days == 30
        assert primary_labels(after, "projects.worktree") == ["30 days"]
        # Live: nothing waits for a restart.
        assert "Restart pending" not in card_text(after)

        forged = await bot.card_after(dict(thirty, worktree_days=0))
        assert "expected a whole number of days from 1 to 3650" in card_text(forged)
        assert bot.hub.config.worktree_days == 30


async def test_a_member_neither_sees_nor_changes_projects_from_a_card(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        await with_projects(bot, tmp_path)
        owners = await open_management(bot)
        (submit,) = actions_of(owners, "project.bind")
        (days,) = [b for b in actions_of(owners, "projects.worktree") if b["worktree_days"] == 7]
        assert "Projects" not in card_text(await open_management(bot, BOB))

        form = {"chat_id": GROUP, "project": "web"}
        refused = await bot.card_after(submit, who=BOB, form_value=form)
        assert "Owner only" in card_text(refused)
        assert bot.hub.projects.binding_of(GROUP) is None

        assert "bound to project" in await said(bot, "/amux project bind web", ALICE, group=True)
        unbind = {"action": "project.unbind", "chat_id": GROUP, "project": "web"}
        assert "Owner only" in card_text(await bot.card_after(unbind, who=BOB))
        still = bot.hub.projects.binding_of(GROUP)
        assert still is not None and still.name == "web"

        assert "Owner only" in card_text(await bot.card_after(days, who=BOB))
        assert bot.hub.config.worktree_days == 14


async def test_each_bad_bind_or_unbind_from_the_card_says_why_and_changes_nothing(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        await with_projects(bot, tmp_path)
        alice = bot.ids["alice"]
        await bot.hub.projects.add("old", by=alice, path=str(make_repo(tmp_path / "old")))
        card = await open_management(bot)
        projects = bot.hub.projects

        def bindings() -> dict[str, str]:
            return {b.chat_id: p.name for p in projects.all() for b in projects.chats(p.name)}

        unknown = markdown_of(await bind(bot, card, GROUP, "nope"))
        assert "**Nothing changed**: no project named 'nope'" in unknown
        assert "(`not_found`)" in unknown

        # The card offered "old", which is removed before the owner submits.
        await projects.remove("old")
        removed = markdown_of(await bind(bot, card, GROUP, "old"))
        assert "no project named 'old'" in removed and "`not_found`" in removed

        forged = markdown_of(await bind(bot, card, "oc_never_seen", "web"))
        assert "the bot knows no chat oc&#95;never&#95;seen" in forged
        assert "`invalid_argument`" in forged

        (submit,) = actions_of(card, "project.bind")
        unchosen = markdown_of(await bot.card_after(submit, form_value={"project": "web"}))
        assert "choose a chat to bind" in unchosen
        assert bindings() == {}

        # Bound meanwhile in the group itself: the card's bind to another project is refused.
        assert "bound to project" in await said(bot, "/amux project bind web", ALICE, group=True)
        twice = markdown_of(await bind(bot, card, GROUP, "api"))
        assert f"group `{GROUP}` is bound to project **web** already; unbind it first" in twice
        assert "`conflict`" in twice
        assert bindings() == {GROUP: "web"}

        # An Unbind from a card that showed the group under web, after it moved to api.
        shown = await open_management(bot)
        (unbind,) = actions_of(shown, "project.unbind")
        await projects.unbind(GROUP)
        await projects.bind(GROUP, "api", alice)
        moved = markdown_of(await bot.card_after(unbind))
        assert f"group `{GROUP}` is bound to project **api** now, not **web**" in moved
        assert bindings() == {GROUP: "api"}

        await projects.unbind(GROUP)
        gone = markdown_of(await bot.card_after(unbind))
        assert f"group `{GROUP}` is bound to no project" in gone and "`not_found`" in gone
        assert bindings() == {}


async def test_many_projects_and_chats_keep_the_card_within_feishus_size(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        alice = bot.ids["alice"]
        repo = str(make_repo(tmp_path / "repo"))
        for n in range(24):
            await bot.hub.projects.add(f"project-{n:02d}", by=alice, path=repo)
        for n in range(60):
            # Chat ids as long as Feishu's.
            group = f"oc_{n:032x}"
            bot.hub.chats.note_group(group)
            if n < 24:
                await bot.hub.projects.bind(group, "project-00" if n < 12 else "project-01", alice)
        card = await open_management(bot)
        assert encoded_size(card) < CARD_MAX_BYTES
        shown = card_text(card)
        assert "more projects: `amux project list`" in shown
        assert "more chats: `amux project show project-00`" in shown
        assert "project-00" in options(card, "project")
        assert 1 <= len(options(card, "chat_id")) <= 30
        # Still the whole card: the live settings below the projects are there.
        assert "**Checkouts kept unused**" in shown
