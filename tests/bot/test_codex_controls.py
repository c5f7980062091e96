"""A Codex conversation's controls, as its topic shows them: the Agent's plan and steps on its
cards with the footer, ``/compact`` and ``/btw``. The whole service in-process with a Runtime
worker launching the real ``codex app-server`` against the scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from cards.footer import FOOTER_ID
from hub.client import HubClient
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.worker import Worker
from tests.bot.test_bot_flows import Bot, card_text, running_bot
from tests.conftest import until
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import find_agent_cli
from tests.runtime_bridge.test_providers_codex import codex_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# Codex offers apply_patch only to models its catalog knows; the fake serves any name.
MODEL = "gpt-5.5"
# What Codex asks the model when it compacts a thread.
COMPACTION_PROMPT = "CONTEXT CHECKPOINT COMPACTION"


@asynccontextmanager
async def codex_worker(bot: Bot, tmp_path: Path, model: FakeModelServer) -> AsyncIterator[None]:
    """A Runtime worker beside the Hub (as `amux runtime worker` runs), launching real codex
    with the operator's config.toml naming the scripted model."""
    config = codex_config(tmp_path, model)
    config.write_text(config.read_text().replace('model = "fake-model"', f'model = "{MODEL}"'))
    state = bot.hub.state
    service = state.add_principal("test-runtime", "service")
    token, _ = state.issue_credential(service.id, "cli", label="test worker")
    settings = RuntimeSettings(
        codex=find_agent_cli("codex"), codex_config=config, work_dir=tmp_path / "runtime"
    )
    home = tmp_path / "agent-home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMUX_", "OPENAI_"))}
    env.update(HOME=str(home), OPENAI_API_KEY="sk-openai-test")
    hub = HubClient(bot.url, token, timeout=60)
    worker = Worker(hub, bot.url, settings, tmp_path / "runtime", base_env=env)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run_forever(stop))
    try:
        yield
    finally:
        stop.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await hub.close()


@asynccontextmanager
async def codex_topic(
    tmp_path: Path, script: list[Step], side_answer: str = "ok"
) -> AsyncIterator[tuple[Bot, FakeModelServer]]:
    """The bot with a Codex worker, Codex being the group's Agent."""
    async with (
        FakeModelServer(script, side_answer=side_answer) as model,
        running_bot(tmp_path) as bot,
        codex_worker(bot, tmp_path, model),
    ):
        # Edits run without asking, as the operator may set it.
        bot.hub.state.save_setting("agents.permissions", "auto")
        await bot.say("/amux provider codex", group=True, mention=True)
        await bot.idle()
        yield bot, model


def conversation(request: Any) -> str:
    return json.dumps(request.body["input"], ensure_ascii=False)


def _plan(*states: str) -> dict[str, Any]:
    steps = ("Inspect the parser", "Patch the bug", "Run the tests")
    return {"plan": [{"step": s, "status": t} for s, t in zip(steps, states, strict=True)]}


async def test_codexs_plan_and_the_file_it_edited_are_on_its_cards_with_the_footer(
    tmp_path: Path,
) -> None:
    done_planning = asyncio.Event()
    patch = "*** Begin Patch\n*** Add File: parser.py\n+fixed = True\n*** End Patch\n"
    script: list[Step] = [
        CallTool("update_plan", _plan("in_progress", "pending", "pending")),
        CallTool("apply_patch", {}, freeform=patch),
        # Held until the first plan has been seen on the progress card.
        CallTool("update_plan", _plan(*["completed"] * 3), hold=done_planning),
        Answer("Fixed and tested."),
    ]
    async with codex_topic(tmp_path, script) as (bot, model):
        try:
            asked = await bot.say("Fix the parser bug", group=True, mention=True)
            progress = await bot.reply_to(asked)

            def shown_while_running() -> bool:
                return any(
                    "🔄 Inspect the parser" in update and "⬜ Run the tests" in update
                    for update in [card_text(progress.card), *progress.updates]
                )

            await until(shown_while_running, seconds=90)
            done_planning.set()
            await until(lambda: "Fixed and tested." in card_text(progress.card), seconds=90)
            await until(lambda: "% full" in card_text(progress.card), seconds=30)
            final = card_text(progress.card)
            assert "✅ ~~Run the tests~~" in final and "(3/3 done)" in final
            assert "🔄" not in final and "⬜" not in final
            # The file Codex edited is a step; its plan is the plan, not a step.
            assert "parser.py`" in final and "**Steps** (1)" in final
            # The footer names the model Codex asked for, its tokens and its context's fill.
            assert model.main_requests[-1].body["model"] == MODEL
            (footer,) = [
                e["content"]
                for e in progress.card["body"]["elements"]
                if e.get("element_id") == FOOTER_ID
            ]
            assert re.search(
                rf"{re.escape(MODEL)} · \d+ s · \d+ in / \d+ out · context 0% full", footer
            )
        finally:
            done_planning.set()


async def test_compact_runs_codexs_own_compaction_and_the_next_turn_continues_from_it(
    tmp_path: Path,
) -> None:
    summary = "Alice asked about the release; it ships on Friday."
    script: list[Step] = [Answer("the first answer"), Answer("after")]
    async with codex_topic(tmp_path, script, side_answer=summary) as (bot, model):
        started = await bot.say("Tell me about the release", group=True, mention=True)
        progress = await bot.reply_to(started)
        await until(lambda: "the first answer" in card_text(progress.card), seconds=90)
        await bot.idle()

        compact = await bot.say("/compact", group=True, mention=True, root_id=started)
        card = await bot.reply_to(compact)
        await until(lambda: "compacted the conversation's context" in card_text(card.card), 90)
        assert "Compacting the conversation" in card_text(card.card)
        # Codex asked the model for its summary of the thread, and nothing was sent as a prompt.
        (asked,) = [r for r in model.requests if COMPACTION_PROMPT in conversation(r)]
        assert "the first answer" in conversation(asked)
        assert "/compact" not in json.dumps([conversation(r) for r in model.requests])
        session = bot.session_of(started)
        assert session is not None
        await bot.idle()
        assert [r.state for r in bot.executions_of(session.id)] == ["succeeded", "succeeded"]

        # The next turn continues the compacted thread: the summary stands for the answers.
        again = await bot.say("And now?", group=True, mention=True, root_id=started)
        answer = await bot.reply_to(again)
        await until(lambda: "after" in card_text(answer.card), seconds=90)
        resumed = conversation(model.main_requests[-1])
        assert summary in resumed and "And now?" in resumed
        assert "the first answer" not in resumed
        assert len(bot.executions_of(session.id)) == 3


async def test_btw_in_a_codex_topic_answers_from_a_fork_while_the_turn_runs(
    tmp_path: Path,
) -> None:
    held = asyncio.Event()
    script: list[Step] = [
        Answer("the first answer"),
        Answer("the running answer", hold=held),
        Answer("the side answer"),
    ]
    async with codex_topic(tmp_path, script) as (bot, model):
        try:
            started = await bot.say("Plan the release", group=True, mention=True)
            progress = await bot.reply_to(started)
            await until(lambda: "the first answer" in card_text(progress.card), seconds=90)
            await bot.idle()
            session = bot.session_of(started)
            assert session is not None
            native = bot.hub.executions.session(session.id).native_id

            running = await bot.say("Write the notes", group=True, mention=True, root_id=started)
            running_card = await bot.reply_to(running)
            await until(lambda: len(model.main_requests) == 2, seconds=90)
            side = await bot.say("/btw what day is it?", group=True, mention=True, root_id=started)
            side_card = await bot.reply_to(side)
            await until(lambda: "the side answer" in card_text(side_card.card), seconds=90)
            # Answered from the conversation so far, while its turn still runs.
            forked = conversation(model.main_requests[2])
            assert "the first answer" in forked and "what day is it?" in forked
            assert "By the way: what day is it?" in card_text(side_card.card)
            turn = bot.executions_of(session.id)[-1]
            assert bot.hub.executions.describe(turn.id).state == "running"

            held.set()
            await until(lambda: "the running answer" in card_text(running_card.card), 90)
            await bot.idle()
            assert "the side answer" not in card_text(running_card.card)
            asked = await bot.say("And now?", group=True, mention=True, root_id=started)
            answer = await bot.reply_to(asked)
            await until(lambda: "done" in card_text(answer.card), seconds=90)
            # The conversation never saw the side question, and kept its own thread.
            resumed = conversation(model.main_requests[-1])
            assert "the running answer" in resumed
            assert "what day is it?" not in resumed and "the side answer" not in resumed
            assert bot.hub.executions.session(session.id).native_id == native
            assert len(bot.executions_of(session.id)) == 3
        finally:
            held.set()
