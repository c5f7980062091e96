"""Token budgets as Feishu users notice them, with the whole service in-process (the bot of
``test_bot_flows``): the test plays the Runtime worker, claiming each turn and completing it with
what its model gateway counted, as a worker reports it."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import pytest

from hub.contract import WARNING, TurnOutcome, TurnResult
from hub.usage import Usage
from runtime_bridge.worker import BUDGET_WARNING
from tests.bot.test_bot_flows import (
    ALICE,
    BOB,
    Bot,
    buttons,
    card_text,
    markdown_of,
    private_chat,
    running_bot,
)
from tests.conftest import until
from tests.fakes.feishu import StoredMessage

pytestmark = pytest.mark.timeout(120)

EXTEND = "budget.extend"


async def run_of(bot: Bot, asked: str) -> str:
    """The execution of the turn ``asked`` started, from its progress card's Stop."""
    progress = await bot.reply_to(asked)
    (stop,) = [b for b in buttons(progress.card) if b["action"] == "run.cancel"]
    return str(stop["run_id"])


async def finish(
    bot: Bot,
    run_id: str,
    tokens: int,
    *,
    reached: bool = False,
    warned: Callable[[], bool] | None = None,
) -> None:
    """Claim the turn as a worker would and complete it having used ``tokens``: with its
    answer, or (``reached``) ended by its budget. With ``warned`` the worker first says 80 % is
    spent, and the turn completes once ``warned`` holds."""
    executions = bot.hub.executions
    runtime = bot.hub.state.add_principal(f"runtime-{run_id[:8]}", "service")
    worker = executions.register_worker("budget-worker", runtime.id)
    claimed = await executions.claim(worker, runtime.id, 0)
    assert claimed is not None and claimed.execution_id == run_id
    if warned is not None:
        await executions.add_event(run_id, worker, WARNING, BUDGET_WARNING)
        await until(warned)
    usage = {"gateway": {"input_tokens": tokens - tokens // 4, "output_tokens": tokens // 4}}
    if reached:
        result = TurnResult(usage=usage, budget=tokens // 2, budget_reached=True)
        outcome = TurnOutcome(False, result, f"budget reached: {tokens}/{tokens // 2} tokens")
    else:
        outcome = TurnOutcome(True, TurnResult(text="All done.", usage=usage), None)
    await executions.complete(run_id, worker, outcome)


def owners_requests(bot: Bot) -> list[StoredMessage]:
    """The cards in Alice's (the owner's) private chat that carry an Extend button."""
    return [
        m
        for m in bot.feishu.messages.values()
        if m.chat_id == private_chat(ALICE)
        and m.msg_type == "interactive"
        and any(b["action"] == EXTEND for b in buttons(m.card))
    ]


def extension_rows(bot: Bot) -> list[tuple[Any, ...]]:
    rows = bot.hub.state.db.execute("SELECT principal_id, day, tokens FROM budget_extensions")
    return [tuple(row) for row in rows]


async def spend_bobs_day(bot: Bot) -> tuple[str, StoredMessage]:
    """Bob's turn ends for want of his day's budget (1,000 tokens, 1,200 used); returns his
    message and the owner's request card that follows."""
    # Alice's private chat is known to the bot once she has written there.
    await bot.reply_to(await bot.say("/amux", ALICE))
    bot.hub.config.save("budget.daily_tokens", 1000)
    asked = await bot.say("a big job", BOB)
    await finish(bot, await run_of(bot, asked), 1200, reached=True)
    (request,) = await until(lambda: owners_requests(bot))
    return asked, request


async def test_a_spent_budget_asks_the_owner_in_their_chat_and_tells_the_member(
    tmp_path: Any,
) -> None:
    async with running_bot(tmp_path) as bot:
        asked, request = await spend_bobs_day(bot)
        said = card_text(request.card)
        assert "bob" in said and "1,200 of 1,000 tokens" in said and "Today's" in said
        # Bob's topic says the day is spent and that the owner was asked; no button for him.
        told = await until(
            lambda: [
                m
                for m in bot.replies_to(asked)
                if "owner of this Hub has been asked" in card_text(m.card)
            ]
        )
        assert "1,200 of 1,000 tokens (UTC day)" in card_text(told[0].card)
        assert not [
            b for m in bot.replies_to(asked) for b in buttons(m.card) if b["action"] == EXTEND
        ]


async def test_extend_clicked_by_a_member_is_refused_with_a_toast_and_the_card_stays(
    tmp_path: Any,
) -> None:
    async with running_bot(tmp_path) as bot:
        _, request = await spend_bobs_day(bot)
        (extend,) = [b for b in buttons(request.card) if b["action"] == EXTEND]
        refused = await bot.click(extend, who=BOB, message_id=request.message_id)
        assert refused["toast"]["type"] == "error"
        assert "Only the owner" in refused["toast"]["content"]
        assert "card" not in refused
        assert extension_rows(bot) == []


async def test_extend_clicked_twice_by_the_owner_adds_once(tmp_path: Any) -> None:
    async with running_bot(tmp_path) as bot:
        _, request = await spend_bobs_day(bot)
        (extend,) = [b for b in buttons(request.card) if b["action"] == EXTEND]
        first = await bot.click(extend, message_id=request.message_id)
        assert first["toast"]["type"] == "success", first
        again = await bot.click(extend, message_id=request.message_id)
        assert (
            again["toast"]["type"] != "success" and "Already extended" in again["toast"]["content"]
        )
        bob = bot.hub.state.principal_by_name("bob")
        today = datetime.datetime.now(datetime.UTC).date().isoformat()
        assert extension_rows(bot) == [(bob.id, today, 1000)]


async def test_an_extend_card_from_yesterday_adds_nothing_today(tmp_path: Any) -> None:
    async with running_bot(tmp_path) as bot:
        bob = bot.hub.state.principal_by_name("bob")
        # A request the bot made yesterday: the Hub's own record, made with yesterday's clock.
        yesterday = Usage(bot.hub.state, clock=lambda: time.time() - 86_400)
        old, _ = await yesterday.ask_extension(bob.id, 1000)
        stale = await bot.click({"action": EXTEND, "request": old})
        assert stale["toast"]["type"] == "warning" and "for its own day only" in str(stale)
        # A card from before requests named whom and how much: it extends nothing either.
        older = await bot.click({"action": EXTEND, "principal_id": bob.id, "tokens": 1000})
        assert older["toast"]["type"] == "warning" and "out of date" in str(older)
        assert extension_rows(bot) == []


async def test_a_turn_with_nothing_left_of_the_day_is_refused_before_it_starts_in_chinese(
    tmp_path: Any,
) -> None:
    async with running_bot(tmp_path, language="zh_cn") as bot:
        await bot.reply_to(await bot.say("/amux", ALICE))
        bot.hub.config.save("budget.daily_tokens", 1000)
        first = await bot.say("first job", BOB)
        await finish(bot, await run_of(bot, first), 1000)
        await until(lambda: "All done." in json_of(bot.replies_to(first)))

        refused = await bot.say("second job", BOB)
        card = await bot.reply_to(refused)
        said = card_text(card.card)
        assert "未开始处理" in said and "1,000 / 1,000" in said and "UTC 日" in said, said
        assert "已请本 Hub 的所有者延长预算" in said
        # Refused at submit: no turn was queued for it, so no worker launches one to fail.
        bob = bot.hub.state.principal_by_name("bob")
        queued = bot.hub.state.db.execute(
            "SELECT COUNT(*) FROM executions WHERE submitted_by = ?", (bob.id,)
        ).fetchone()[0]
        assert queued == 1
        await until(lambda: owners_requests(bot))
        # Another message while the request waits is refused too, and asks the owner no more.
        again = await bot.say("third job", BOB)
        assert "已请本 Hub 的所有者延长预算" in card_text((await bot.reply_to(again)).card)
        await bot.idle()
        assert len(owners_requests(bot)) == 1


async def test_the_budget_warning_is_on_the_result_card_in_the_chats_language(
    tmp_path: Any,
) -> None:
    async with running_bot(tmp_path, language="zh_cn") as bot:
        bot.hub.config.save("budget.daily_tokens", 1000)
        asked = await bot.say("a job", BOB)
        progress = await bot.reply_to(asked)
        # While it runs, the progress says so in the chat's language too.
        running = "本轮可用的 token 已用去 80%"
        await finish(
            bot, await run_of(bot, asked), 850, warned=lambda: running in card_text(progress.card)
        )
        await until(lambda: "All done." in card_text(progress.card))
        shown = markdown_of(progress.card)
        assert "今日 token 预算已用 85%：850 / 1,000 个 token（UTC 日）" in shown, shown
        await bot.idle()
        # Not a separate notice in English as well.
        assert BUDGET_WARNING not in json_of(bot.replies_to(asked))


def json_of(messages: list[StoredMessage]) -> str:
    return "".join(
        card_text(m.card) if m.msg_type == "interactive" else m.content for m in messages
    )
