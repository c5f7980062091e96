"""Schedules as people manage them in Feishu: `/amux schedule …` in a chat and the Schedules
section of the `/amux` card. Messages and clicks go through the fake Feishu and lark-oapi; who
may change a schedule is decided from the stored schedule, never from a card's value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.schedule_commands import split_when
from cards import actions
from hub.errors import InvalidArgument
from tests.bot.test_bot_flows import (
    ALICE,
    BOB,
    CAROL,
    GROUP,
    Bot,
    buttons,
    card_text,
    private_chat,
    running_bot,
)

pytestmark = pytest.mark.timeout(120)


def schedule_buttons(card: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["change"]: b for b in buttons(card) if b["action"] == actions.SCHEDULE_CHANGE}


async def said(bot: Bot, message_id: str) -> str:
    reply = await bot.reply_to(message_id)
    return card_text(reply.card) if reply.msg_type == "interactive" else reply.content


async def test_a_schedule_added_in_a_chat_delivers_there_and_the_chat_lists_it(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        added = await bot.say('/amux schedule add "0 9 * * 1-5" summarise yesterday', BOB)
        assert "Added schedule summarise yesterday" in await said(bot, added)
        (schedule,) = bot.hub.schedules.listed()
        assert (schedule.chat_id, schedule.chat_type) == (private_chat(BOB), "p2p")
        assert schedule.created_by == bot.ids["bob"] and schedule.spec == "0 9 * * 1-5"

        # A Chinese keyboard's quotes work too, and in a group the schedule is the group's.
        grouped = await bot.say("/amux schedule add “0 18 * * 5” weekly notes", ALICE, group=True,
                                mention=True)  # fmt: skip
        await bot.reply_to(grouped)
        listed = await bot.say("/amux schedule list", BOB, group=True, mention=True)
        shown = await said(bot, listed)
        assert "weekly notes" in shown and "summarise yesterday" not in shown
        assert {s.chat_id for s in bot.hub.schedules.listed()} == {private_chat(BOB), GROUP}


@pytest.mark.parametrize(
    ("command", "answer"),
    [
        ('/amux schedule add "* * * * *" too often', "at most every 300 s"),
        ('/amux schedule add "whenever" x', "neither a cron expression"),
        ("/amux schedule add 0 9 * * * unquoted", "put the schedule's time in quotes"),
        ('/amux schedule add "trigger" x', "amux trigger add"),
        ("/amux schedule", "Usage: /amux schedule add"),
        ("/amux schedule pause", "Usage: /amux schedule add"),
    ],
)
async def test_a_bad_schedule_command_is_answered_with_the_reason_and_adds_nothing(
    tmp_path: Path, command: str, answer: str
) -> None:
    async with running_bot(tmp_path) as bot:
        asked = await bot.say(command, BOB)
        assert answer in await said(bot, asked)
        assert bot.hub.schedules.listed() == []


def test_the_clock_is_told_from_the_prompt_by_quotes_or_a_date_and_time() -> None:
    assert split_when('"0 9 * * *" report') == ("0 9 * * *", "report")
    assert split_when("「0 9 * * *」 报告") == ("0 9 * * *", "报告")
    assert split_when("2026-12-24 18:00 wrap up\nthe year") == (
        "2026-12-24 18:00",
        "wrap up\nthe year",
    )
    with pytest.raises(InvalidArgument):
        split_when("every morning report")


async def test_the_card_shows_ones_own_schedules_and_the_owner_everyones(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        await bot.reply_to(await bot.say('/amux schedule add "0 9 * * *" bobs report', BOB))
        await bot.reply_to(await bot.say('/amux schedule add "0 7 * * *" alices digest', ALICE))
        bobs_card = await bot.card_after({"action": actions.MANAGE_OPEN}, who=BOB)
        assert "bobs report" in card_text(bobs_card)
        assert "alices digest" not in card_text(bobs_card)
        assert set(schedule_buttons(bobs_card)) == {"pause", "run", "remove"}
        owners_card = await bot.card_after({"action": actions.MANAGE_OPEN}, who=ALICE)
        assert "bobs report" in card_text(owners_card)
        assert "alices digest" in card_text(owners_card)


async def test_card_buttons_change_a_schedule_only_for_its_creator_or_the_owner(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        await bot.reply_to(await bot.say('/amux schedule add "0 9 * * *" bobs report', BOB))
        (schedule,) = bot.hub.schedules.listed()
        pause = schedule_buttons(await bot.card_after({"action": actions.MANAGE_OPEN}, who=BOB))[
            "pause"
        ]

        # Carol copies Bob's button: the Hub's record says whose schedule it is.
        refused = await bot.card_after(pause, who=CAROL)
        assert "creator or the owner" in card_text(refused)
        assert bot.hub.schedules.get(schedule.id).active

        paused = await bot.card_after(pause, who=BOB)
        assert "Paused schedule bobs report" in card_text(paused)
        assert not bot.hub.schedules.get(schedule.id).active
        assert set(schedule_buttons(paused)) == {"resume", "run", "remove"}

        run = schedule_buttons(paused)["run"]
        assert "runs now" in card_text(await bot.card_after(run, who=ALICE))
        assert bot.hub.schedules.due()[0].asked

        remove = schedule_buttons(paused)["remove"]
        assert "creator or the owner" in card_text(await bot.card_after(remove, who=CAROL))
        removed = await bot.card_after(remove, who=BOB)
        assert "Removed schedule bobs report" in card_text(removed)
        assert bot.hub.schedules.listed() == []
        # A forged change is no change at all.
        forged = await bot.card_after(dict(remove, change="explode"), who=BOB)
        assert "unknown schedule change" in card_text(forged)


async def test_a_schedule_keeps_its_creators_feishu_time_zone(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        bot.feishu.user_names.update({"ou_bob": "Bob", "ou_carol": "Carol"})
        bot.feishu.user_time_zones["ou_bob"] = "Europe/Berlin"
        await bot.reply_to(await bot.say('/amux schedule add "0 9 * * *" bobs report', BOB))
        await bot.reply_to(await bot.say('/amux schedule add "0 9 * * *" carols report', CAROL))
        zones = {s.prompt: s.time_zone for s in bot.hub.schedules.listed()}
    # Carol set none in Feishu: the Hub's schedules.time_zone.
    assert zones == {"bobs report": "Europe/Berlin", "carols report": "Asia/Shanghai"}
