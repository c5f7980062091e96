"""Each Feishu sender's share as users meet it: past the messages-a-minute limit or the waiting
turns cap a message starts nothing and is answered with when to try again; the owner changes
both on the `/amux` card. The real bot behind the fake Feishu server, no worker needed."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from bot.quotas import SenderLimit
from tests.bot.test_bot_flows import ALICE, BOB, Bot, buttons, card_text, running_bot
from tests.conftest import save_settings, until

pytestmark = pytest.mark.timeout(120)

OVER_LIMIT = "is over the per-minute limit"


def queued_of(bot: Bot, name: str) -> int:
    principal = bot.hub.state.principal_by_name(name)
    row = bot.hub.executions.db.execute(
        "SELECT COUNT(*) AS n FROM executions WHERE submitted_by = ?", (principal.id,)
    ).fetchone()
    return int(row["n"])


def is_progress(card: dict[str, Any]) -> bool:
    return any(b.get("action") == "run.cancel" for b in buttons(card))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_sender_over_the_limit_is_told_once_per_wait_and_others_are_not_held() -> None:
    clock = Clock()
    limit = SenderLimit(2, clock=clock)
    assert [limit.check("bob") for _ in range(2)] == [None, None]
    first = limit.check("bob")
    assert first is not None and first.tell and first.retry_after == 60
    clock.now += 20
    again = limit.check("bob")
    assert again is not None and not again.tell and again.retry_after == 40
    assert limit.check("alice") is None
    # A refused message is not counted: the wait ends a minute after the first admitted one.
    clock.now += 40
    assert limit.check("bob") is None
    assert SenderLimit(0).check("bob") is None


async def test_messages_past_the_per_minute_limit_start_nothing_and_are_told_when_to_retry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="amux.bot")
    home = tmp_path / "amux-home"
    save_settings(home, {"feishu.messages_per_minute": 3, "turns.max_queued_per_principal": 0})
    async with running_bot(tmp_path) as bot:
        asked = [await bot.say(f"job {n}", BOB) for n in range(5)]
        for message in asked[:3]:
            assert is_progress((await bot.reply_to(message)).card)
        refusal = (await bot.reply_to(asked[3])).card
        text = card_text(refusal)
        assert "Try again later" in text
        assert "more than 3 messages in a minute" in text
        assert "Try again in " in text and " s;" in text
        assert "`rate_limited`" in text
        await until(lambda: caplog.text.count(OVER_LIMIT) == 2)
        # The second refused message of the same wait gets no answer of its own.
        assert bot.replies_to(asked[4]) == []
        assert queued_of(bot, "bob") == 3

        # Another sender is not held to Bob's count.
        owner = await bot.say("the owner's own job", ALICE)
        assert is_progress((await bot.reply_to(owner)).card)


async def test_a_message_past_the_waiting_turns_cap_is_told_when_to_retry(tmp_path: Path) -> None:
    home = tmp_path / "amux-home"
    save_settings(home, {"turns.max_queued_per_principal": 2, "feishu.messages_per_minute": 0})
    async with running_bot(tmp_path) as bot:
        asked = [await bot.say(f"job {n}", BOB) for n in range(2)]
        for message in asked:
            assert is_progress((await bot.reply_to(message)).card)
        over = await bot.say("one more", BOB)
        text = card_text((await bot.reply_to(over)).card)
        assert "Try again later" in text
        assert "2 of your turns are already waiting" in text
        assert "Try again in about 30 s" in text
        assert "`quota_exceeded`" in text
        assert queued_of(bot, "bob") == 2


def fair_share_choices(card: dict[str, Any], action: str) -> dict[int, dict[str, Any]]:
    field = {"turns.queued": "max_queued", "feishu.rate": "messages_per_minute"}[action]
    return {b[field]: b for b in buttons(card) if b["action"] == action}


async def test_the_owner_sets_each_persons_share_on_the_card_for_the_next_restart(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        opened = await bot.say("/amux")
        card = (await bot.reply_to(opened)).card
        assert "Fair share" in card_text(card)
        assert "Waiting turns per person" in card_text(card)
        assert sorted(fair_share_choices(card, "turns.queued")) == [0, 1, 3, 5, 10, 20]
        assert sorted(fair_share_choices(card, "feishu.rate")) == [0, 5, 10, 20, 60]

        chosen = await bot.card_after(fair_share_choices(card, "turns.queued")[10])
        chosen = await bot.card_after(fair_share_choices(chosen, "feishu.rate")[0])
        assert "You have unsaved changes." in card_text(chosen)
        assert bot.hub.config.saved()["turns.max_queued_per_principal"] == 5
        (save,) = [b for b in buttons(chosen) if b["action"] == "settings.save"]
        notice = await bot.card_after(save)
        assert "saved: **10**, running: **5**" in card_text(notice)
        assert "saved: **no limit**, running: **10**" in card_text(notice)
        described = bot.hub.config.describe()
        assert described["turns.max_queued_per_principal"].saved == 10
        assert described["feishu.messages_per_minute"].saved == 0
        assert described["memory.history_days"].saved == 30

        # Members see no such section, and a forged click of theirs is refused.
        member = (await bot.reply_to(await bot.say("/amux", BOB))).card
        assert "Fair share" not in card_text(member)
        forged = await bot.card_after({"action": "turns.queued", "max_queued": 0}, who=BOB)
        assert "Owner only" in card_text(forged)
        assert bot.hub.config.saved()["turns.max_queued_per_principal"] == 10
