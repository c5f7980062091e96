"""A message recalled in Feishu is never answered as if it stood: the bot of ``test_bot_flows``
(real lark-oapi against the fake Feishu, real Hub), with the in-process worker running a stand-in
Agent (``tests/fakes/turn_agent.sh``) on one slot where a turn must run or queue."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime_bridge.config import RuntimeSettings
from tests.bot.test_bot_flows import (
    ALICE,
    BOB,
    GROUP,
    Bot,
    buttons,
    card_text,
    private_chat,
    running_bot,
    signer,
)
from tests.bot.test_bot_topics import TOPIC, mention_in_topic, prompts
from tests.conftest import stand_in, until
from tests.fakes.feishu import StoredMessage

pytestmark = pytest.mark.timeout(120)


async def recall(bot: Bot, message_id: str, chat_id: str) -> None:
    status, _ = await bot.post(signer.recall(message_id, chat_id=chat_id))
    assert status == 200


def run_id_of(progress: StoredMessage) -> str:
    """The turn a progress card's Stop stops; empty while the card shows none."""
    found = [b for b in buttons(progress.card) if b["action"] == "run.cancel"]
    return str(found[0]["run_id"]) if found else ""


@pytest.mark.e2e
async def test_a_recalled_request_never_runs_when_queued_and_stops_when_running(
    tmp_path: Path, shared_dir: Path
) -> None:
    # Made here, writable by all: the Agent may run as a uid of its own.
    log = shared_dir / "started"
    log.touch()
    log.chmod(0o666)
    runtime = RuntimeSettings(
        providers={"turn": str(stand_in("turn_agent.sh"))},
        sandbox="off",
        slots=1,
        work_dir=shared_dir / "runtime",
    )
    chat = private_chat(BOB)
    async with running_bot(tmp_path, runtime=runtime) as bot:
        chosen = await bot.say("/amux provider turn", BOB)
        await bot.reply_to(chosen)
        bob = bot.hub.people.principal(bot.ids["bob"])
        assert bob is not None
        recalled = f"Recalled by **{bob.label}**"
        try:
            first = await bot.say(f"turn {log} first", BOB)
            await until(lambda: log.read_text().split() == ["first"], seconds=30)
            running = await bot.reply_to(first)
            running_id = await until(lambda: run_id_of(running))
            second = await bot.say(f"turn {log} second", BOB)
            queued = await bot.reply_to(second)
            queued_id = await until(lambda: run_id_of(queued))
            assert bot.hub.executions.describe(queued_id).state == "queued"

            await recall(bot, second, chat)
            await until(lambda: recalled in card_text(queued.card))
            assert bot.hub.executions.describe(queued_id).state == "cancelled"
            # Only the recalled message's turn: the running one goes on.
            assert bot.hub.executions.describe(running_id).state == "running"

            await recall(bot, first, chat)
            await until(lambda: recalled in card_text(running.card), seconds=30)
            assert bot.hub.executions.describe(running_id).state == "cancelled"

            # The slot is free again: the next request runs, the recalled one never did.
            third = await bot.say(f"turn {log} third", BOB)
            await until(lambda: log.read_text().split() == ["first", "third"], seconds=30)
            log.with_name("started.all").touch()
            await until(lambda: "done third" in card_text(bot.replies_to(third)[0].card))
            await bot.idle()
            assert log.read_text().split() == ["first", "third"]
            for asked in (first, second):
                (only,) = bot.replies_to(asked)
                assert "done" not in card_text(only.card)
        finally:
            log.with_name("started.all").touch()


async def test_a_recalled_message_of_a_topic_is_left_out_of_the_next_turns_context(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        root = bot.feishu.add_message(
            GROUP, "Shall we ship on Friday?", sender_open_id="ou_bob", thread_id=TOPIC
        )
        taken_back = bot.feishu.add_message(
            GROUP, "the staging password is hunter2", sender_open_id="ou_bob", thread_id=TOPIC
        )
        await recall(bot, taken_back.message_id, GROUP)
        await bot.idle()

        await mention_in_topic(bot, "what do you think?", ALICE, root)
        (prompt,) = await until(lambda: prompts(bot))
        assert "Shall we ship on Friday?" in prompt
        assert "hunter2" not in prompt


async def test_a_request_recalled_before_its_turn_is_queued_is_never_started_nor_answered(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        root = bot.feishu.add_message(
            GROUP, "Shall we ship on Friday?", sender_open_id="ou_bob", thread_id=TOPIC
        )
        # Reading the topic waits out a rate limit: the request is not queued yet meanwhile.
        bot.feishu.fail_next(
            1, path_contains="/im/v1/messages", headers={"x-ogw-ratelimit-reset": "2"}
        )
        asked = await mention_in_topic(bot, "what do you think?", ALICE, root)
        await until(lambda: bot.feishu.failures_left() == 0)
        await recall(bot, asked, GROUP)
        # Done once the request's handler has ended, or the turn was answered after all.
        await until(lambda: bot.adapter.dispatcher.pending == 0 or bot.replies_to(asked))
        assert len(bot.feishu.calls("GET", "/im/v1/messages")) == 2
        assert prompts(bot) == []
        assert bot.replies_to(asked) == []
