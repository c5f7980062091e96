"""Chat commands through the bot's one table and its one per-sender limit: the whole service
in-process with signed events to its webhook, as ``test_bot_flows`` runs it.

A claim code seen where others read it is burnt; every message the bot answers (commands and
bare mentions too) counts against its sender's per-minute limit, with one notice per wait.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_bot_flows import BOB, CAROL, Bot, card_text, running_bot
from tests.conftest import until

pytestmark = pytest.mark.timeout(180)

# The default feishu.messages_per_minute.
PER_MINUTE = 10


def claim_codes(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The codes the log offered the owner, oldest first."""
    found = [re.search(r"/amux claim ([0-9a-f]+)", r.getMessage()) for r in caplog.records]
    return [m.group(1) for m in found if m is not None]


def replies(bot: Bot) -> list[Any]:
    """Every reply the bot asked the fake Feishu to post."""
    return bot.feishu.calls("POST", "/reply")


async def test_a_claim_code_posted_in_a_group_is_burnt_and_a_new_one_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path, enroll="closed", owner_in_feishu=False) as bot:
        (code,) = claim_codes(caplog)
        posted = await bot.say(f"/amux claim {code}", CAROL, group=True, mention=True)
        told = await bot.reply_to(posted)
        told_text = json.loads(told.content)["text"]
        # The group is sent to the log, and the code is never repeated there.
        assert "log" in told_text and code not in told_text
        old, new = claim_codes(caplog)
        assert old == code and new != code

        # Carol saw it in the group: in her private chat it no longer works.
        stolen = await bot.say(f"/amux claim {code}", CAROL)
        refusal = json.loads((await bot.reply_to(stolen)).content)["text"]
        assert "no longer works" in refusal
        carol = bot.hub.state.principal_by_alias("feishu_union_id", CAROL["sender_union_id"])
        assert carol is None or not carol.is_owner

        # The owner's claim with the new code from the log works.
        claimed = await bot.say(f"/amux claim {new}", BOB)
        assert "alice" in card_text((await bot.reply_to(claimed)).card)


async def test_a_claim_code_in_a_group_message_without_a_mention_is_burnt_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path, owner_in_feishu=False) as bot:
        (code,) = claim_codes(caplog)
        await bot.say(f"the bot wants {code.upper()}, what now?", BOB, group=True)
        await until(lambda: len(claim_codes(caplog)) == 2)
        stolen = await bot.say(f"/amux claim {code}", CAROL)
        assert "no longer works" in json.loads((await bot.reply_to(stolen)).content)["text"]
        owner = bot.hub.state.owner()
        assert owner is not None
        assert bot.hub.state.principal_by_alias("feishu_union_id", CAROL["sender_union_id"]) != (
            owner
        )


async def test_a_claim_is_taken_only_in_a_private_chat(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path, owner_in_feishu=False) as bot:
        (code,) = claim_codes(caplog)
        wrong = "0" * len(code) if code != "0" * len(code) else "1" * len(code)
        sent = await bot.say(f"/amux claim {wrong}", BOB, group=True, mention=True)
        assert "private chat" in json.loads((await bot.reply_to(sent)).content)["text"]
        # A wrong code in a group burns nothing: the code on offer still works in private.
        assert claim_codes(caplog) == [code]
        claimed = await bot.say(f"/amux claim {code}", BOB)
        assert "alice" in card_text((await bot.reply_to(claimed)).card)


async def test_two_hundred_amux_commands_from_one_member_are_answered_within_the_limit(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        for _ in range(200):
            await bot.say("/amux", BOB)
        await bot.idle()
        answered = replies(bot)
        notices = [c for c in answered if "Try again later" in str(c.body)]
        cards = [c for c in answered if "bob" in str(c.body) and c not in notices]
        # Another member is not held by Bob's flood.
        carol = await bot.say("/amux", CAROL)
        carols = card_text((await bot.reply_to(carol)).card)

    assert len(answered) == PER_MINUTE + 1, [c.body for c in answered]
    assert len(cards) == PER_MINUTE and len(notices) == 1
    assert "Not enrolled" not in carols


async def test_forty_bare_mentions_from_one_member_get_the_limit_and_one_notice(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        for _ in range(40):
            await bot.say("", BOB, group=True, mention=True)
        await bot.idle()
        answered = replies(bot)
        hints = [c for c in answered if "as text" in str(c.body)]
        notices = [c for c in answered if "Try again later" in str(c.body)]
        sessions = bot.hub.executions.db.execute("SELECT count(*) FROM sessions").fetchone()[0]

    assert len(answered) == PER_MINUTE + 1
    assert len(hints) == PER_MINUTE and len(notices) == 1
    assert sessions == 0


async def test_refusals_count_against_the_limit_too(tmp_path: Path) -> None:
    async with running_bot(tmp_path, enroll="closed") as bot:
        for _ in range(30):
            await bot.say("let me in", CAROL)
        await bot.idle()
        refusals = [c for c in replies(bot) if "Not enrolled" in str(c.body)]
        notices = [c for c in replies(bot) if "Try again later" in str(c.body)]
        assert len(refusals) == PER_MINUTE and len(notices) == 1
        assert len(replies(bot)) == PER_MINUTE + 1
