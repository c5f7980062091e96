"""The Feishu bot end to end: `amux serve` as a process, events signed as Feishu signs them.

Only Feishu's servers and the model provider are fakes (loopback). The bot, Hub, in-process
worker, real `claude` CLI and real `amux mcp` run for real, so a memory saved from one Feishu topic
and found from another proves the whole path, Feishu to memory and back.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import HubProcess, free_port, until
from tests.fakes.feishu import FakeFeishu, StoredMessage
from tests.fakes.feishu_events import FeishuSigner
from tests.fakes.model_server import Answer, CallTool, FakeModelServer
from tests.runtime_bridge.conftest import find_agent_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

signer = FeishuSigner(encrypt_key="ek_e2e", verification_token="vt_e2e", app_id="cli_e2e")
OWNER = {"sender_open_id": "ou_owner", "sender_union_id": "on_owner", "sender_user_id": "u_owner"}
OTHER = {"sender_open_id": "ou_other", "sender_union_id": "on_other", "sender_user_id": "u_other"}


def as_operator(who: dict[str, str]) -> dict[str, str]:
    return {k.replace("sender_", "operator_"): v for k, v in who.items()}


@dataclass
class Bot:
    hub: HubProcess
    feishu: FakeFeishu
    model: FakeModelServer
    http: aiohttp.ClientSession

    async def post(self, payload: dict[str, Any], **sign: Any) -> tuple[int, dict[str, Any]]:
        body, headers = signer.sign(payload, **sign)
        return await self.post_raw(body, headers)

    async def post_raw(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        async with self.http.post(
            f"{self.hub.url}/feishu/events", data=io.BytesIO(body), headers=headers
        ) as response:
            return response.status, await response.json(content_type=None)

    async def say(self, text: str, who: dict[str, str] = OWNER, **kw: Any) -> str:
        # The fake must know the user's message for the bot to reply to it.
        stored = self.feishu.add_message(kw.get("chat_id", "oc_chat1"), text)
        stored.root_id = kw.get("root_id", "")
        stored.thread_id = kw.get("thread_id", "")
        message = signer.message(text, **who, message_id=stored.message_id, **kw)
        status, _ = await self.post(message)
        assert status == 200
        return str(message["event"]["message"]["message_id"])

    async def click(
        self, value: dict[str, Any], who: dict[str, str] = OWNER, **kw: Any
    ) -> dict[str, Any]:
        status, body = await self.post(signer.card_action(value, **as_operator(who), **kw))
        assert status == 200, body
        return body

    def replies_to(self, message_id: str) -> list[StoredMessage]:
        return [m for m in self.feishu.messages.values() if m.root_id == message_id]

    async def cli(self, *args: str) -> Any:
        done = await asyncio.to_thread(self.hub.cli, *args, "--json")
        assert done.returncode == 0, done.stderr
        return done.json()


def callback_value(node: Any, action: str) -> dict[str, Any]:
    """The callback value of the card's first element that reports ``action``."""
    if isinstance(node, dict):
        value = node.get("value")
        if isinstance(value, dict) and value.get("action") == action:
            return value
        children: Any = list(node.values())
    elif isinstance(node, list):
        children = node
    else:
        children = []
    for child in children:
        found = callback_value(child, action)
        if found:
            return found
    return {}


def card_text(card: dict[str, Any]) -> str:
    return json.dumps(card, ensure_ascii=False)


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[Bot]:
    agent_home = tmp_path / "agent-home"
    agent_home.mkdir()
    async with FakeFeishu(app_id="cli_e2e") as feishu, FakeModelServer([]) as model:
        hub = HubProcess(
            tmp_path / "amux-home",
            free_port(),
            extra_env={
                "AMUX_FEISHU_APP_ID": "cli_e2e",
                "AMUX_FEISHU_APP_SECRET": "secret",
                "AMUX_FEISHU_ENCRYPT_KEY": signer.encrypt_key,
                "AMUX_FEISHU_VERIFICATION_TOKEN": signer.verification_token,
                "AMUX_FEISHU_DOMAIN": feishu.url,
                "AMUX_FEISHU_LANGUAGE": "en_us",
                "AMUX_FEISHU_CARD_UPDATE_INTERVAL_SECONDS": "0.2",
                "HOME": str(agent_home),
                "ANTHROPIC_BASE_URL": model.base_url,
                "ANTHROPIC_API_KEY": "sk-ant-test",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "AMUX_RUNTIME_CLAUDE": find_agent_cli("claude"),
                "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
            },
        )
        await asyncio.to_thread(hub.start)
        try:
            async with aiohttp.ClientSession() as http:
                bot = Bot(hub, feishu, model, http)
                await until(lambda: feishu.calls("GET", "/bot/v3/info"))
                yield bot
        finally:
            await asyncio.to_thread(hub.stop)


async def claim_owner(bot: Bot) -> None:
    code = await until(lambda: re.search(r"/amux claim ([0-9a-f]+)", bot.hub.log()))
    message_id = await bot.say(f"/amux claim {code.group(1)}")
    reply = await until(lambda: bot.replies_to(message_id))
    assert "memory" in card_text(reply[0].card).lower()


async def test_owner_enables_memory_from_the_card_and_the_restart_applies_it(bot: Bot) -> None:
    await claim_owner(bot)
    opened = await bot.say("/amux")
    card_message = (await until(lambda: bot.replies_to(opened)))[0]
    assert '"tag": "checker"' in card_text(card_message.card) or "checker" in card_text(
        card_message.card
    )

    toggled = await bot.click(
        {"action": "memory.toggle", "memory_enabled": True, "isolation": False},
        open_message_id=card_message.message_id,
    )
    assert toggled["card"]["type"] == "raw"
    # The Save of the card as shown (it carries the revision of the settings it was built from).
    save = dict(callback_value(card_message.card, "settings.save"), memory_enabled=True)
    saved = await bot.click(save, open_message_id=card_message.message_id)
    assert "Restart now" in card_text(saved["card"]["data"])
    config = await bot.cli("system", "config", "get")
    assert config["memory.enabled"] == {"saved": True, "running": False, "restart_pending": True}

    # A member who is not the owner cannot save or restart, whatever card they hold.
    refused = await bot.click(
        {"action": "settings.save", "memory_enabled": False, "isolation": True},
        who=OTHER,
        open_message_id=card_message.message_id,
    )
    assert "owner" in card_text(refused["card"]["data"]).lower()
    refused = await bot.click({"action": "restart.now"}, who=OTHER)
    assert "owner" in card_text(refused["card"]["data"]).lower()
    assert (await bot.cli("system", "config", "get"))["memory.isolation"]["saved"] == "off"

    await bot.click({"action": "restart.now"}, open_message_id=card_message.message_id)

    def running() -> bool:
        done = bot.hub.cli("system", "config", "get", "--json")
        return done.returncode == 0 and done.json()["memory.enabled"]["running"] is True

    await until(lambda: running() if bot.hub.healthy() else False, seconds=60)
    # The new process refreshes the card the owner clicked with the running values.
    refreshed = await until(lambda: bot.feishu.messages[card_message.message_id].updates)
    assert "restarted" in refreshed[-1].lower()


async def test_forged_duplicate_and_non_owner_events(bot: Bot) -> None:
    stored = bot.feishu.add_message("oc_chat1", "/amux")
    payload = signer.message("/amux", **OTHER, message_id=stored.message_id)
    body, headers = signer.sign(payload)
    forged = dict(headers, **{"X-Lark-Signature": "0" * 64})
    status, _ = await bot.post_raw(body, forged)
    assert status == 401

    status, _ = await bot.post_raw(body, headers)
    assert status == 200
    message_id = payload["event"]["message"]["message_id"]
    replies = await until(lambda: bot.replies_to(message_id))
    # A retry of the same event (same event_id) is acknowledged but not processed again.
    again_body, again_headers = signer.sign(payload)
    status, _ = await bot.post_raw(again_body, again_headers)
    assert status == 200
    await bot.say("/amux", who=OTHER)  # a fresh event, to know the earlier one had its chance
    await until(lambda: len([m for m in bot.feishu.messages.values() if m.root_id]) >= 2)
    assert len(bot.replies_to(message_id)) == len(replies) == 1
    # Non-owners see their identity but no switches.
    assert "checker" not in card_text(replies[0].card)


async def test_save_in_one_topic_and_recall_in_a_new_topic(bot: Bot) -> None:
    await asyncio.to_thread(bot.hub.enable_memory)
    content = "# Review format\nconclusion, evidence, risks and items to confirm\n"
    bot.model.add_steps(
        [
            CallTool(
                "mcp__memory__amux_memory_upsert",
                {
                    "path": "topics/review-format.md",
                    "content": content,
                    "expected_revision": "absent",
                },
            ),
            Answer("Saved topics/review-format.md."),
        ]
    )
    first = await bot.say("Remember our review report format")
    progress = (await until(lambda: bot.replies_to(first)))[0]
    assert any(
        r.body.get("reply_in_thread") is True for r in bot.feishu.calls("POST", f"{first}/reply")
    )
    await until(lambda: "Saved topics/review-format.md." in card_text(progress.card))
    shown = await bot.cli("memory", "show", "topics/review-format.md")
    assert shown["content"] == content

    # A follow-up in the same topic resumes the same conversation.
    bot.model.add_steps([Answer("Same topic.")])
    follow = await bot.say("And one more thing", root_id=first, thread_id="omt_topic1")
    await until(lambda: any("Same topic." in card_text(m.card) for m in bot.replies_to(first)))
    assert "Remember our review report format" in json.dumps(
        bot.model.main_requests[-1].body["messages"]
    )
    assert follow

    # A new topic is a new conversation that finds the memory through the tools.
    bot.model.add_steps(
        [
            CallTool("mcp__memory__amux_memory_search", {"query": "review format"}),
            Answer("Found it in topics/review-format.md."),
        ]
    )
    second = await bot.say("What is our agreed review report format?")
    await until(
        lambda: any(
            "Found it in topics/review-format.md." in card_text(m.card)
            for m in bot.replies_to(second)
        )
    )
    fresh = bot.model.main_requests[-1]
    assert "Remember our review report format" not in json.dumps(fresh.body["messages"])
    assert "topics/review-format.md" in bot.model.tool_results[-1][1]


def _todos(*states: str) -> dict[str, Any]:
    steps = ("Inspect the parser", "Patch the bug", "Run the tests")
    return {
        "todos": [
            {"content": step, "status": state, "activeForm": step}
            for step, state in zip(steps, states, strict=True)
        ]
    }


async def test_the_agents_plan_and_steps_are_on_the_progress_card_and_the_result(
    bot: Bot,
) -> None:
    done_planning = asyncio.Event()
    bot.model.add_steps(
        [
            CallTool("TodoWrite", _todos("in_progress", "pending", "pending")),
            CallTool("Glob", {"pattern": "**/*.py"}),
            # Held until the first plan has been seen on the progress card.
            CallTool("TodoWrite", _todos(*["completed"] * 3), hold=done_planning),
            Answer("Fixed and tested."),
        ]
    )
    asked = await bot.say("Fix the parser bug")
    progress = (await until(lambda: bot.replies_to(asked)))[0]

    def shown_while_running() -> bool:
        return any(
            "🔄 Inspect the parser" in update and "⬜ Run the tests" in update
            for update in [card_text(progress.card), *progress.updates]
        )

    await until(shown_while_running)
    assert "(0/3 done)" in card_text(progress.card)
    done_planning.set()
    # The streamed card shows the answer's words before the turn's final card replaces it,
    # footer and all.
    await until(
        lambda: (
            "Fixed and tested." in card_text(progress.card) and "% full" in card_text(progress.card)
        )
    )
    final = card_text(progress.card)
    assert "✅ ~~Run the tests~~" in final and "(3/3 done)" in final
    assert "🔄" not in final and "⬜" not in final
    # The tools it used are listed, its todo list being the plan rather than a step.
    assert "- search `**/*.py`" in final and "**Steps** (1)" in final
    # The footer names the model Claude asked for and how full its context is.
    model = bot.model.main_requests[-1].body["model"]
    assert model in final and "% full" in final
