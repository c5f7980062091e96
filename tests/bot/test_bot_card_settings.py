"""The owner's history window on the `/amux` card, and erasing one's memory while memory is off,
as Feishu users meet them: the real bot behind the fake Feishu server, no worker needed."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest

from hub.client import HubClient
from hub.history import Author
from hub.paths import principal_scope
from tests.bot.test_bot_flows import (
    ALICE,
    BOB,
    Bot,
    button_nodes,
    buttons,
    card_text,
    running_bot,
)

pytestmark = pytest.mark.timeout(120)

DEFAULTS = {
    "memory.enabled": False,
    "memory.isolation": "off",
    "memory.history_days": 30,
    "turns.max_queued_per_principal": 5,
    "feishu.messages_per_minute": 10,
    "agents.permissions": "ask",
    "agents.approval_timeout": 600,
    "agents.max_events_per_turn": 2000,
    "agents.max_event_bytes_per_turn": 4 * 1024 * 1024,
    "budget.daily_tokens": 0,
    "budget.turn_tokens": 0,
    "projects.worktree_days": 14,
    "schedules.min_interval_seconds": 300,
    "schedules.max_per_principal": 20,
    "schedules.grace_seconds": 3600,
    "schedules.time_zone": "Asia/Shanghai",
}


def saved(bot: Bot) -> dict[str, Any]:
    return bot.hub.config.saved()


def history_choices(card: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {b["history_days"]: b for b in buttons(card) if b["action"] == "history.days"}


def primary_history_labels(card: dict[str, Any]) -> list[str]:
    return [
        node["text"]["content"]
        for node in button_nodes(card)
        if node.get("type") == "primary"
        and (node.get("behaviors") or [{}])[0].get("value", {}).get("action") == "history.days"
    ]


def save_button(card: dict[str, Any]) -> dict[str, Any]:
    (save,) = [b for b in buttons(card) if b["action"] == "settings.save"]
    return save


async def open_management(bot: Bot) -> tuple[str, dict[str, Any]]:
    asked = await bot.say("/amux")
    reply = await bot.reply_to(asked)
    return reply.message_id, reply.card


# -- the history window on the owner's card ----------------------------------------------------


async def test_the_owner_chooses_seven_days_of_history_and_saves_it_for_the_next_restart(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        message_id, card = await open_management(bot)
        assert "History kept" in card_text(card)
        assert "saved: **30 days**, running: **30 days**" in card_text(card)
        assert primary_history_labels(card) == ["30 days"]
        assert sorted(history_choices(card)) == [0, 7, 30, 90, 365]

        chosen = await bot.card_after(history_choices(card)[7], message_id=message_id)
        assert primary_history_labels(chosen) == ["7 days"]
        assert "You have unsaved changes." in card_text(chosen)
        assert saved(bot) == DEFAULTS, "choosing is a draft, not a save"

        notice = await bot.card_after(save_button(chosen), message_id=message_id)
        assert "history kept: 7 days" in card_text(notice)
        assert "saved: **7 days**, running: **30 days**" in card_text(notice)
        assert "Restart now" in card_text(notice)
        assert bot.hub.config.describe()["memory.history_days"].to_wire() == {
            "saved": 7,
            "running": 30,
            "restart_pending": True,
        }
        # The rest of the draft is saved as it was shown.
        assert saved(bot) == dict(DEFAULTS, **{"memory.history_days": 7})

        _, reopened = await open_management(bot)
        assert "saved: **7 days**, running: **30 days**" in card_text(reopened)
        assert "Restart pending" in card_text(reopened)
        assert primary_history_labels(reopened) == ["7 days"]


async def test_a_member_cannot_see_or_change_the_history_window(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        opened = await bot.say("/amux", BOB)
        card = (await bot.reply_to(opened)).card
        assert "History kept" not in card_text(card)
        assert history_choices(card) == {}

        draft = {"memory_enabled": True, "isolation": True, "history_days": 7}
        for action in ("history.days", "settings.save"):
            refused = await bot.card_after(dict(draft, action=action), who=BOB)
            assert "Owner only" in card_text(refused)
        assert saved(bot) == DEFAULTS


async def test_a_forged_history_window_is_refused_readably_and_saves_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path) as bot:
        for forged in (-3, "abc", [7], {"days": 7}, 3651, 2.5, True):
            for action in ("history.days", "settings.save"):
                value = {
                    "action": action,
                    "memory_enabled": True,
                    "isolation": True,
                    "history_days": forged,
                }
                shown = card_text(await bot.card_after(value))
                assert "Something went wrong" in shown, (forged, action)
                # As the user reads it: the card escapes markdown.
                expected = "memory.history_days: expected a whole number of days from 0 to 3650"
                assert expected in html.unescape(shown), (forged, action)
                assert "Traceback" not in shown
                # Memory and isolation from the same click are not saved either.
                assert saved(bot) == DEFAULTS, (forged, action)
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


async def test_a_card_from_before_the_history_setting_keeps_the_saved_window(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        # Chosen with the CLI, and none of the card's choices.
        bot.hub.config.save("memory.history_days", 14)
        message_id, card = await open_management(bot)
        assert "saved: **14 days**, running: **30 days**" in card_text(card)
        assert primary_history_labels(card) == []
        assert save_button(card)["history_days"] == 14

        old_toggle = {"action": "memory.toggle", "memory_enabled": True, "isolation": False}
        toggled = await bot.card_after(old_toggle, message_id=message_id)
        assert save_button(toggled)["history_days"] == 14

        # A card from before Save carried the settings' revision cannot tell what changed since
        # it was shown: its Save is refused with the current values, whose own Save works.
        old_save = {"action": "settings.save", "memory_enabled": True, "isolation": False}
        refused = await bot.card_after(old_save, message_id=message_id)
        assert "Nothing was saved" in card_text(refused)
        assert saved(bot) == dict(DEFAULTS, **{"memory.history_days": 14})
        retried = dict(save_button(refused), memory_enabled=True)
        notice = await bot.card_after(retried, message_id=message_id)
        assert "history kept: 14 days" in card_text(notice)
        assert saved(bot) == dict(DEFAULTS, **{"memory.enabled": True, "memory.history_days": 14})


async def test_a_stale_cards_save_is_refused_and_shows_the_settings_changed_since(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        message_id, card = await open_management(bot)
        # The owner turns isolation on from the CLI while the card above stays in the chat.
        token, _ = bot.hub.state.issue_credential(bot.ids["alice"], "cli")
        async with HubClient(bot.url, token) as cli:
            await cli.config_set("memory.isolation", "on")
        # A switch clicked on the stale card keeps the draft it was built from ...
        (memory_switch,) = [
            e["behaviors"][0]["value"]
            for e in card["body"]["elements"]
            if e.get("tag") == "checker" and e["behaviors"][0]["value"]["action"] == "memory.toggle"
        ]
        toggled = await bot.card_after(memory_switch, message_id=message_id)
        assert save_button(toggled)["isolation"] is False

        # ... and neither its Save nor the old card's own puts isolation back off.
        for stale in (save_button(toggled), save_button(card)):
            refused = await bot.card_after(stale, message_id=message_id)
            shown = card_text(refused)
            assert "Nothing was saved" in shown
            assert "changed elsewhere after your card was shown" in shown
            assert "saved: **on**, running: **off**" in shown
            assert saved(bot) == dict(DEFAULTS, **{"memory.isolation": "on"})
            # The card shows the current values: isolation saved on, to save from here.
            assert save_button(refused)["isolation"] is True
            assert save_button(refused)["memory_enabled"] is False

        fresh = dict(save_button(refused), memory_enabled=True)
        notice = await bot.card_after(fresh, message_id=message_id)
        assert "Restart now" in card_text(notice)
        assert saved(bot) == dict(DEFAULTS, **{"memory.enabled": True, "memory.isolation": "on"})


# -- erasing while memory is off ---------------------------------------------------------------


async def test_with_memory_off_a_member_can_still_erase_their_memory_and_nothing_else(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, memory=False, isolation=True) as bot:
        bob, alice = bot.ids["bob"], bot.ids["alice"]
        mine = principal_scope(bob)
        author = Author(bob, "cli")
        first = await bot.hub.history.upsert(
            mine, "notes/mine.md", "bob's note\n", "absent", author
        )
        await bot.hub.history.upsert(
            mine, "notes/mine.md", "bob's second note\n", first.revision, author
        )
        await bot.hub.store.upsert(principal_scope(alice), "hers.md", "alice's\n", "absent")
        memory_root = bot.hub.settings.memory_root
        assert [p.name for p in memory_root.rglob("mine.md")] == ["mine.md"]
        # My memory is opened from the /amux card in his private chat with the bot.
        await bot.reply_to(await bot.say("/amux", BOB))

        disabled = await bot.card_after({"action": "memory.list"}, who=BOB)
        assert "Memory unavailable" in card_text(disabled)
        (erase,) = buttons(disabled)
        assert erase == {"action": "memory.erase.ask"}

        ask = await bot.card_after(erase, who=BOB)
        assert "removes **1** document(s) (your whole memory)" in card_text(ask)
        assert "**1** kept earlier version(s)" in card_text(ask)
        assert "**2** change-log entries" in card_text(ask)
        (confirm,) = [b for b in buttons(ask) if b["action"] == "memory.erase.confirm"]
        assert list(memory_root.rglob("mine.md")), "asking erases nothing"

        # A path that is not one is refused, not taken for the whole memory.
        forged = await bot.card_after(dict(confirm, path=["notes/mine.md"]), who=BOB)
        assert "Something went wrong" in card_text(forged)
        assert list(memory_root.rglob("mine.md"))

        receipt = await bot.card_after(confirm, who=BOB)
        assert "Removed 1 document(s) and 1 kept earlier version(s)" in card_text(receipt)
        assert "replaced in 2 change-log entries" in card_text(receipt)
        assert list(memory_root.rglob("mine.md")) == []
        kept = bot.hub.settings.home / "memory-history"
        assert [p for p in kept.rglob("*") if p.is_file()] == []
        # Only Bob's own memory: Alice's document is untouched.
        assert (await bot.hub.store.get(principal_scope(alice), "hers.md")).exists

        for value in (
            {"action": "memory.list"},
            {"action": "memory.search"},
            {"action": "memory.open", "path": "hers.md"},
            {"action": "memory.history"},
            {"action": "memory.restore", "path": "notes/mine.md", "revision": first.revision},
            {"action": "memory.forget.ask", "path": "hers.md", "revision": "absent"},
            {"action": "memory.forget.confirm", "path": "hers.md", "revision": "absent"},
        ):
            still_off = await bot.card_after(value, who=ALICE)
            assert "Memory unavailable" in card_text(still_off), value
        assert (await bot.hub.store.get(principal_scope(alice), "hers.md")).exists


# -- the Agents' permission settings: live, saved at once, owner only ----------------------------


def live_choices(card: dict[str, Any], action: str, field: str) -> dict[Any, dict[str, Any]]:
    return {b[field]: b for b in buttons(card) if b["action"] == action}


async def test_the_owner_changes_the_permission_policy_and_timeout_at_once_without_a_restart(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        message_id, card = await open_management(bot)
        assert "Policy: **Ask**" in card_text(card)
        assert "denied after **10 min**" in card_text(card)
        assert "apply to turns started after the change" in card_text(card)
        # With a draft of the restart-pending settings on the card, that stays a draft.
        drafted = await bot.card_after(history_choices(card)[7], message_id=message_id)
        policies = live_choices(drafted, "agents.permissions", "permissions")
        assert sorted(policies) == ["ask", "auto", "read-only"]

        changed = await bot.card_after(policies["read-only"], message_id=message_id)
        assert bot.hub.config.permissions == "read-only", "saved at once"
        assert bot.hub.config.describe()["agents.permissions"].restart_pending is False
        assert "Policy: **Read-only**" in card_text(changed)
        assert "Restart pending" not in card_text(changed)
        assert primary_history_labels(changed) == ["7 days"]
        assert "You have unsaved changes." in card_text(changed)
        assert saved(bot)["memory.history_days"] == 30

        timeouts = live_choices(changed, "agents.timeout", "approval_timeout")
        shorter = await bot.card_after(timeouts[60], message_id=message_id)
        assert bot.hub.config.approval_timeout == 60
        assert "denied after **1 min**" in card_text(shorter)
        assert "Policy: **Read-only**" in card_text(shorter)

        _, reopened = await open_management(bot)
        assert "Policy: **Read-only**" in card_text(reopened)
        assert "denied after **1 min**" in card_text(reopened)


async def test_the_owner_sets_the_token_budgets_on_the_card_at_once(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        message_id, card = await open_management(bot)
        assert "**Tokens per turn**: **no limit**" in card_text(card)
        daily = live_choices(card, "budget.daily", "daily_tokens")
        changed = await bot.card_after(daily[1_000_000], message_id=message_id)
        assert bot.hub.config.daily_tokens == 1_000_000, "saved at once"
        assert "per day** (UTC): **1,000,000**" in card_text(changed)
        per_turn = live_choices(changed, "budget.turn", "turn_tokens")
        await bot.card_after(per_turn[50_000], message_id=message_id)
        assert bot.hub.config.turn_tokens == 50_000
        refused = await bot.card_after({"action": "budget.turn", "turn_tokens": 0}, who=BOB)
        assert "Owner only" in card_text(refused)
        forged = await bot.card_after({"action": "budget.daily", "daily_tokens": -5})
        assert "Something went wrong" in card_text(forged)
        assert bot.hub.config.turn_tokens == 50_000
        assert bot.hub.config.daily_tokens == 1_000_000


async def test_a_member_cannot_see_or_change_the_permission_settings(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        opened = await bot.say("/amux", BOB)
        card = (await bot.reply_to(opened)).card
        assert "Agents' permissions" not in card_text(card)
        assert not live_choices(card, "agents.permissions", "permissions")

        for forged in (
            {"action": "agents.permissions", "permissions": "auto"},
            {"action": "agents.timeout", "approval_timeout": 3600},
        ):
            refused = await bot.card_after(forged, who=BOB)
            assert "Owner only" in card_text(refused)
        assert saved(bot) == DEFAULTS


async def test_a_forged_permission_value_is_refused_readably_and_saves_nothing(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        for value in (
            {"action": "agents.permissions", "permissions": "everything"},
            {"action": "agents.permissions"},
            {"action": "agents.timeout", "approval_timeout": 0},
            {"action": "agents.timeout", "approval_timeout": True},
            {"action": "agents.timeout", "approval_timeout": [60]},
            {"action": "agents.permissions", "permissions": "auto", "history_days": -1},
        ):
            shown = card_text(await bot.card_after(value))
            assert "Something went wrong" in shown, value
            assert "Traceback" not in shown
            assert saved(bot) == DEFAULTS, value
