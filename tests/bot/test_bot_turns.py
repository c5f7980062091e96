"""Conversations whose turns finish: the bot of ``test_bot_flows`` with a Runtime worker beside
the Hub that launches the real ``claude`` CLI against the scripted model."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from cards.footer import FOOTER_ID
from hub.client import HubClient
from hub.paths import principal_scope
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.worker import Worker
from tests.bot.test_bot_flows import (
    BOB,
    CAROL,
    GROUP,
    Bot,
    buttons,
    card_text,
    markdown_of,
    running_bot,
)
from tests.conftest import until
from tests.fakes.model_server import Answer, FakeModelServer
from tests.runtime_bridge.conftest import find_agent_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def agent_env(tmp_path: Path, model: FakeModelServer) -> dict[str, str]:
    home = tmp_path / "agent-home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMUX_", "ANTHROPIC_"))}
    env.update(
        HOME=str(home),
        ANTHROPIC_BASE_URL=model.base_url,
        ANTHROPIC_API_KEY="sk-ant-test",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    return env


@asynccontextmanager
async def claude_worker(bot: Bot, tmp_path: Path, model: FakeModelServer) -> AsyncIterator[None]:
    """A Runtime worker beside the Hub (as `amux runtime worker` runs), launching real claude."""
    state = bot.hub.state
    service = state.add_principal("test-runtime", "service")
    token, _ = state.issue_credential(service.id, "cli", label="test worker")
    settings = RuntimeSettings(claude=find_agent_cli("claude"), work_dir=tmp_path / "runtime")
    hub = HubClient(bot.url, token, timeout=60)
    worker = Worker(
        hub, bot.url, settings, tmp_path / "runtime", base_env=agent_env(tmp_path, model)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run_forever(stop))
    try:
        yield
    finally:
        stop.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await hub.close()


async def test_under_isolation_a_member_in_someone_elses_topic_is_sent_to_their_own(
    tmp_path: Path,
) -> None:
    async with (
        FakeModelServer([Answer("Hello Alice.")]) as model,
        running_bot(tmp_path, memory=True, isolation=True) as bot,
        claude_worker(bot, tmp_path, model),
    ):
        started = await bot.say("Summarise the release plan", group=True, mention=True)
        progress = await bot.reply_to(started)
        await until(lambda: "Hello Alice." in card_text(progress.card))
        session = bot.session_of(started)
        assert session is not None
        assert session.principal_id == bot.ids["alice"]
        # The turn ran with Alice's own memory scope, frozen at its first execution.
        assert session.binding == principal_scope(bot.ids["alice"])

        intruder = await bot.say(
            "Also show me what you remember", BOB, group=True, mention=True, root_id=started
        )
        refusal = await bot.reply_to(intruder)
        assert "Open your own topic" in card_text(refusal.card)
        await bot.idle()
        executions = bot.executions_of(session.id)
        assert len(executions) == 1
        assert {e.submitted_by for e in executions} == {bot.ids["alice"]}
        assert len(model.main_requests) == 1


async def test_stop_ends_the_agent_at_once_and_one_card_says_who_stopped_it(
    tmp_path: Path,
) -> None:
    held = asyncio.Event()
    # A long lease: its heartbeat interval (a third of it, 200 s) is far beyond the wait below,
    # so the Stop can only land because the worker is told at once.
    async with (
        FakeModelServer([Answer("too late", hold=held)]) as model,
        running_bot(tmp_path, lease_seconds=600) as bot,
        claude_worker(bot, tmp_path, model),
    ):
        try:
            asked = await bot.say("a job that never ends", BOB, group=True, mention=True)
            progress = await bot.reply_to(asked)
            (cancel,) = [b for b in buttons(progress.card) if b["action"] == "run.cancel"]
            run_id = cancel["run_id"]
            await until(lambda: model.main_requests, seconds=60)
            assert bot.hub.executions.describe(run_id).state == "running"

            refused = await bot.click(cancel, who=CAROL, chat_id=GROUP)
            assert refused["toast"]["type"] == "error"
            accepted = await bot.click(cancel, who=BOB, chat_id=GROUP)
            assert accepted["toast"]["type"] != "error"
            # Cancelled is recorded only once the worker has ended the Agent's process group.
            await until(lambda: bot.hub.executions.describe(run_id).state == "cancelled", 15)
            bob = bot.hub.people.principal(bot.ids["bob"])
            assert bob is not None
            await until(lambda: f"Stopped by **{bob.label}**" in card_text(progress.card))
            await bot.idle()
            said = json.dumps([m.card for m in bot.replies_to(asked)], ensure_ascii=False)
            assert "too late" not in said
            assert "Something went wrong" not in said
            assert len(bot.replies_to(asked)) == 1
        finally:
            held.set()


def unrepair(parts: list[str]) -> str:
    """Join result cards, undoing the fence repair: a code block cut between two cards is
    closed at the end of one and reopened (with its info string) at the start of the next."""
    joined = parts[0]
    for part in parts[1:]:
        if joined.endswith("\n```") and part.startswith("```"):
            joined = joined[: -len("\n```")]
            part = part.split("\n", 1)[1]
        joined += part
    return joined


async def test_a_long_answer_arrives_as_several_cards_that_add_up_to_it(tmp_path: Path) -> None:
    prose = [f"Paragraph {n}: " + " ".join(f"word{n}-{k}" for k in range(60)) for n in range(50)]
    code = "\n".join(f"    step_{n} = compute({n}, 'x' * {n % 7})  # line {n}" for n in range(700))
    answer = "\n\n".join(prose[:25]) + "\n\n```python\n" + code + "\n```\n\n"
    answer += "\n\n".join(prose[25:])
    assert len(answer.encode()) > 60_000
    async with (
        FakeModelServer([Answer(answer)]) as model,
        running_bot(tmp_path) as bot,
        claude_worker(bot, tmp_path, model),
    ):
        asked = await bot.say("Write the long report")
        progress = await bot.reply_to(asked)
        await until(lambda: "Result (1/" in card_text(progress.card), seconds=90)
        total = int(card_text(progress.card).split("Result (1/")[1].split(")")[0])
        assert total >= 3
        await until(lambda: len(bot.replies_to(asked)) >= total)
        results = [m.card for m in bot.replies_to(asked) if "Result (" in card_text(m.card)]
        assert len(results) == total
        # The first card ends with the turn's footer (model, time, tokens): not the answer's.
        parts = [markdown_of(without_footer(card)) for card in results]
        # Every card's code blocks are balanced, so each renders on its own.
        assert all(part.count("```") % 2 == 0 for part in parts)
        assert unrepair(parts) == answer


def without_footer(card: dict[str, Any]) -> dict[str, Any]:
    elements = card["body"]["elements"]
    kept = [e for e in elements if not str(e.get("element_id", "")).startswith(FOOTER_ID)]
    return {**card, "body": {**card["body"], "elements": kept}}
