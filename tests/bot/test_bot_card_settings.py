"""The owner's history window on the `/amux` card, as Feishu users meet it: the real bot behind
the fake Feishu server, no worker needed."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_bot_flows import BOB, Bot, buttons, card_text, running_bot

pytestmark = pytest.mark.timeout(120)

DEFAULTS = {"memory.enabled": False, "memory.isolation": "off", "memory.history_days": 30}


def saved(bot: Bot) -> dict[str, Any]:
    return bot.hub.config.saved()


def history_choices(card: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {b["history_days"]: b for b in buttons(card) if b["action"] == "history.days"}


def primary_history_labels(card: dict[str, Any]) -> list[str]:
    labels: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            behaviors = node.get("behaviors") or [{}]
            if node.get("tag") == "button" and node.get("type") == "primary":
                if behaviors[0].get("value", {}).get("action") == "history.days":
                    labels.append(node["text"]["content"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(card)
    return labels


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
        assert bot.hub.config.describe()["memory.history_days"] == {
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

        old_save = {"action": "settings.save", "memory_enabled": True, "isolation": False}
        notice = await bot.card_after(old_save, message_id=message_id)
        assert "history kept: 14 days" in card_text(notice)
        assert saved(bot) == dict(DEFAULTS, **{"memory.enabled": True, "memory.history_days": 14})
