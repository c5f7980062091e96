"""What a person controls of a topic's conversation: messages sent during a turn wait and run
together as its next turn; ``/model`` chooses the model of its next turns. The whole service
in-process with a Runtime worker launching the real ``claude`` CLI against the scripted model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.bot.test_bot_flows import ALICE, BOB, GROUP, buttons, card_text, running_bot
from tests.bot.test_bot_topics import prompts
from tests.bot.test_bot_turns import claude_worker
from tests.conftest import until
from tests.fakes.model_server import Answer, FakeModelServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def last_user_text(body: dict[str, object]) -> str:
    """The text of the last user message a Messages request carries."""
    messages = body.get("messages")
    assert isinstance(messages, list)
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return json.dumps(users[-1]["content"], ensure_ascii=False)


async def test_messages_sent_while_a_turn_runs_wait_and_run_as_one_next_turn_per_sender(
    tmp_path: Path,
) -> None:
    held = asyncio.Event()
    async with (
        FakeModelServer(
            [Answer("notes started", hold=held), Answer("alice's two done"), Answer("bob's done")]
        ) as model,
        running_bot(tmp_path) as bot,
        claude_worker(bot, tmp_path, model),
    ):
        try:
            started = await bot.say("Start the release notes", group=True, mention=True)
            progress = await bot.reply_to(started)
            await until(lambda: model.main_requests, seconds=60)
            asked = [("add the date", ALICE), ("and the authors", BOB), ("then sort them", ALICE)]
            waiting = [
                await bot.say(text, who, group=True, mention=True, root_id=started)
                for text, who in asked
            ]
            # Each waiting message is told it waits, and nothing more starts meanwhile.
            notes = [await bot.reply_to(m) for m in waiting]
            assert all("waits for the running turn" in json.dumps(n.content) for n in notes)
            assert len(model.main_requests) == 1
            held.set()
            await until(lambda: "notes started" in card_text(progress.card), seconds=60)
            await until(lambda: len(model.main_requests) == 3, seconds=90)
            # Alice's two messages are one turn of hers, in the order she sent them...
            alices = last_user_text(model.main_requests[1].body)
            assert alices.index("add the date") < alices.index("then sort them")
            assert "and the authors" not in alices and "Message from bob" not in alices
            # ...and Bob's is a turn of his own: nobody's words run as someone else's.
            bobs = last_user_text(model.main_requests[2].body)
            assert "and the authors" in bobs and "Message from bob" in bobs
            assert "add the date" not in bobs and "Message from alice" not in bobs
            # Alice's turn answers on a card in reply to her first waiting message, Bob's his.
            async def answered(message: str, note: str, answer: str) -> None:
                (card, *_) = await until(
                    lambda: [m for m in bot.replies_to(message) if m.message_id != note]
                )
                await until(lambda: answer in card_text(card.card), seconds=60)

            await answered(waiting[0], notes[0].message_id, "alice's two done")
            await answered(waiting[1], notes[1].message_id, "bob's done")
            await bot.idle()
            session = bot.session_of(started)
            assert session is not None
            turns = bot.executions_of(session.id)
            senders = [turn.submitted_by for turn in turns]
            assert len(turns) == 3 and senders[0] == senders[1] != senders[2]
            assert len(model.main_requests) == 3
        finally:
            held.set()


async def test_a_stop_ends_the_turn_at_once_and_the_waiting_messages_then_run_as_one(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        started = await bot.say("Start the release notes", group=True, mention=True)
        progress = await bot.reply_to(started)
        waiting = [
            await bot.say(text, ALICE, group=True, mention=True, root_id=started)
            for text in ("add the date", "and the authors")
        ]
        for message in waiting:
            await bot.reply_to(message)
        assert len(prompts(bot)) == 1
        (stop,) = [b for b in buttons(progress.card) if b["action"] == "run.cancel"]
        stopped = await bot.click(stop, chat_id=GROUP)
        assert stopped["toast"]["type"] != "error"
        assert bot.hub.executions.describe(stop["run_id"]).state == "cancelled"
        (joined,) = await until(lambda: prompts(bot)[1:])
        assert joined.index("add the date") < joined.index("and the authors")
        await until(lambda: "Stopped by" in card_text(progress.card))


MODELS = {"claude": ["claude-sonnet-test", "claude-haiku-test"]}


async def test_model_in_a_topic_chooses_its_next_turns_model_from_the_owners_list(
    tmp_path: Path,
) -> None:
    async with (
        FakeModelServer([Answer("first answer"), Answer("second answer")]) as model,
        running_bot(tmp_path, models=MODELS) as bot,
        claude_worker(bot, tmp_path, model),
    ):
        started = await bot.say("Hello", group=True, mention=True)
        progress = await bot.reply_to(started)
        await until(lambda: "first answer" in card_text(progress.card), seconds=60)
        await bot.idle()

        async def command(text: str) -> str:
            sent = await bot.say(text, group=True, mention=True, root_id=started)
            return json.loads((await bot.reply_to(sent)).content)["text"]

        shown = await command("/model")
        assert "the Agent's default (claude)" in shown
        assert "claude-sonnet-test, claude-haiku-test" in shown
        refused = await command("/model gpt-9")
        assert "gpt-9 is not a model this Hub allows for claude" in refused
        assert "claude-sonnet-test, claude-haiku-test" in refused
        session = bot.session_of(started)
        assert session is not None
        assert bot.hub.executions.session(session.id).model is None
        chosen = await command("/model claude-haiku-test")
        assert "next turns run claude-haiku-test" in chosen
        assert "claude-haiku-test" in await command("/model")

        asked = await bot.say("And now?", group=True, mention=True, root_id=started)
        answer = await bot.reply_to(asked)
        await until(lambda: "second answer" in card_text(answer.card), seconds=60)
        first, second = model.main_requests
        assert first.body["model"] != "claude-haiku-test"
        assert second.body["model"] == "claude-haiku-test"
        # The answer's footer names the model that answered.
        await until(lambda: "claude-haiku-test" in card_text(answer.card))


async def test_compact_runs_claudes_own_compaction_of_the_topics_session(tmp_path: Path) -> None:
    summary = "<summary>Alice asked about the release.</summary>"
    async with (
        FakeModelServer([Answer("first answer"), Answer(summary), Answer("after")]) as model,
        running_bot(tmp_path) as bot,
        claude_worker(bot, tmp_path, model),
    ):
        started = await bot.say("Tell me about the release", group=True, mention=True)
        progress = await bot.reply_to(started)
        await until(lambda: "first answer" in card_text(progress.card), seconds=60)
        await bot.idle()

        compact = await bot.say("/compact", group=True, mention=True, root_id=started)
        card = await bot.reply_to(compact)
        await until(lambda: "Result" in card_text(card.card), seconds=60)
        asked_to_summarise = model.main_requests[1]
        assert "summar" in last_user_text(asked_to_summarise.body).lower()
        session = bot.session_of(started)
        assert session is not None
        runs = bot.executions_of(session.id)
        assert [r.state for r in runs] == ["succeeded", "succeeded"]

        # The next turn resumes the compacted session: the summary stands for what came before.
        asked = await bot.say("And now?", group=True, mention=True, root_id=started)
        answer = await bot.reply_to(asked)
        await until(lambda: "after" in card_text(answer.card), seconds=60)
        resumed = json.dumps(model.main_requests[-1].body["messages"])
        assert "Alice asked about the release." in resumed
        assert len(bot.executions_of(session.id)) == 3


async def test_compact_in_a_conversation_of_another_agent_is_refused_by_name(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        await bot.say("/amux provider pi", group=True, mention=True)
        await bot.idle()
        started = await bot.say("Tell me about the release", group=True, mention=True)
        await bot.reply_to(started)
        compact = await bot.say("/compact", group=True, mention=True, root_id=started)
        said = json.loads((await bot.reply_to(compact)).content)["text"]
        assert said == "/compact is not supported by pi."
        session = bot.session_of(started)
        assert session is not None
        assert len(bot.executions_of(session.id)) == 1


async def test_btw_answers_from_a_fork_while_the_turn_runs_and_leaves_the_conversation_as_it_was(
    tmp_path: Path,
) -> None:
    held = asyncio.Event()
    script = [
        Answer("first answer"),
        Answer("the running answer", hold=held),
        Answer("the side answer"),
    ]
    async with (
        FakeModelServer(script) as model,
        running_bot(tmp_path) as bot,
        claude_worker(bot, tmp_path, model),
    ):
        try:
            started = await bot.say("Plan the release", group=True, mention=True)
            progress = await bot.reply_to(started)
            await until(lambda: "first answer" in card_text(progress.card), seconds=60)
            await bot.idle()
            session = bot.session_of(started)
            assert session is not None
            native = bot.hub.executions.session(session.id).native_id

            running = await bot.say("Write the notes", group=True, mention=True, root_id=started)
            running_card = await bot.reply_to(running)
            await until(lambda: len(model.main_requests) == 2, seconds=60)
            side = await bot.say("/btw what day is it?", group=True, mention=True, root_id=started)
            side_card = await bot.reply_to(side)
            await until(lambda: "the side answer" in card_text(side_card.card), seconds=60)
            # Answered from the conversation so far, while its turn still runs.
            forked = json.dumps(model.main_requests[2].body["messages"])
            assert "first answer" in forked and "what day is it?" in forked
            assert "By the way: what day is it?" in card_text(side_card.card)
            assert (
                bot.hub.executions.describe(bot.executions_of(session.id)[-1].id).state == "running"
            )

            held.set()
            await until(lambda: "the running answer" in card_text(running_card.card), seconds=60)
            await bot.idle()
            asked = await bot.say("And now?", group=True, mention=True, root_id=started)
            answer = await bot.reply_to(asked)
            await until(lambda: "done" in card_text(answer.card), seconds=60)
            # The conversation never saw the side question, and kept its own session.
            resumed = json.dumps(model.main_requests[-1].body["messages"])
            assert "the running answer" in resumed
            assert "what day is it?" not in resumed and "the side answer" not in resumed
            assert bot.hub.executions.session(session.id).native_id == native
            assert len(bot.executions_of(session.id)) == 3
        finally:
            held.set()


async def test_btw_in_a_conversation_of_another_agent_is_refused_by_name(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        await bot.say("/amux provider pi", group=True, mention=True)
        await bot.idle()
        started = await bot.say("Tell me about the release", group=True, mention=True)
        await bot.reply_to(started)
        side = await bot.say("/btw what day is it?", group=True, mention=True, root_id=started)
        said = json.loads((await bot.reply_to(side)).content)["text"]
        assert said == "/btw is not supported by pi."
