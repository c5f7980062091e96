"""`/amux claim CODE` cannot be guessed: wrong codes lock a sender, then everyone.

The whole service in-process with signed events to its webhook, as ``test_bot_flows`` runs it;
enrollment is closed, as it is when an outsider is most tempted to claim the Hub instead.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from bot.identity import CLAIM_TRIES_IN_ALL, CLAIM_TRIES_PER_SENDER
from tests.bot.test_bot_flows import BOB, CAROL, Bot, Who, card_text, running_bot

pytestmark = pytest.mark.timeout(120)

WRONG = "That claim code is not valid."
LOCKED = (
    "Too many wrong claim codes: claims from you are refused for 60 minutes, even with the right "
    "code."
)
LOCKED_FOR_ALL = (
    "Too many wrong claim codes: claiming is locked. Restart amux serve and send the new code "
    "from its log."
)


def the_code(caplog: pytest.LogCaptureFixture) -> str:
    (line,) = [r.getMessage() for r in caplog.records if "/amux claim" in r.getMessage()]
    found = re.search(r"/amux claim ([0-9a-f]+)", line)
    assert found is not None
    return found.group(1)


def guesser(n: int) -> Who:
    return {"sender_open_id": f"ou_g{n}", "sender_union_id": f"on_g{n}", "sender_user_id": None}


async def answer_to(bot: Bot, text: str, who: Who) -> str:
    replied = await bot.reply_to(await bot.say(text, who))
    value: Any = json.loads(replied.content).get("text", "")
    return str(value)


async def test_a_sender_is_locked_after_five_wrong_codes_even_for_the_right_one(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path, enroll="closed", owner_in_feishu=False) as bot:
        code = the_code(caplog)
        wrong = "0" * len(code) if code != "0" * len(code) else "1" * len(code)
        answers = [
            await answer_to(bot, f"/amux claim {wrong}", CAROL)
            for _ in range(CLAIM_TRIES_PER_SENDER)
        ]
        # The right code, too late: still refused, and nobody became the owner.
        late = await answer_to(bot, f"/amux claim {code}", CAROL)
        owner = bot.hub.state.owner()
        assert owner is not None
        carol_is_owner = (
            bot.hub.state.principal_by_alias("feishu_union_id", CAROL["sender_union_id"])
            is not None
        )
        # Someone else who has not guessed may still claim with the code.
        claimed = await bot.say(f"/amux claim {code}", BOB)
        claimed_card = card_text((await bot.reply_to(claimed)).card)

    assert answers == [WRONG] * (CLAIM_TRIES_PER_SENDER - 1) + [LOCKED]
    assert late == LOCKED and not carol_is_owner
    assert "alice" in claimed_card
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "owner claims from Feishu user on_carol are locked for 60 minutes after 5 wrong codes" in m
        for m in messages
    ), messages
    # The code is in the one line that offers it to the owner, and in no other.
    assert [m for m in messages if code in m] == [m for m in messages if "/amux claim" in m]


async def test_twenty_wrong_codes_in_all_lock_claims_for_everyone(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path, enroll="closed", owner_in_feishu=False) as bot:
        code = the_code(caplog)
        wrong = "0" * len(code) if code != "0" * len(code) else "1" * len(code)
        senders = CLAIM_TRIES_IN_ALL // (CLAIM_TRIES_PER_SENDER - 1)
        answers = [
            await answer_to(bot, f"/amux claim {wrong}", guesser(n))
            for n in range(senders)
            for _ in range(CLAIM_TRIES_PER_SENDER - 1)
        ]
        # Nobody is locked on their own, yet everyone is, with the right code too.
        fresh = await answer_to(bot, f"/amux claim {code}", BOB)
        bob = bot.hub.state.principal_by_alias("feishu_union_id", BOB["sender_union_id"])
        owner = bot.hub.state.owner()

    assert len(answers) == CLAIM_TRIES_IN_ALL
    assert answers == [WRONG] * (CLAIM_TRIES_IN_ALL - 1) + [LOCKED_FOR_ALL]
    assert fresh == LOCKED_FOR_ALL
    assert owner is not None and (bob is None or bob.id != owner.id)
    assert any(
        "owner claims from Feishu are locked after 20 wrong codes; restart amux serve" in m
        for m in (r.getMessage() for r in caplog.records)
    )
