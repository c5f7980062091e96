"""The Agent's Feishu tools through a real `amux serve`: the real ``claude`` CLI, scripted by the
fake model, calls ``amux.feishu_read`` and ``amux.feishu_search`` through ``amux mcp`` in its
sandbox, and the Hub reads Feishu (the loopback fake) as the person who sent the turn.

A sender who has not connected their account is told how to; once connected, what they may
read reaches the Agent and what only someone else may read does not, and every call Feishu saw
carried the sender's own user token. Inside the sandbox no Feishu token is anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hub.config import HubSettings
from hub.state import State
from tests.conftest import HubProcess, free_port, until
from tests.fakes.feishu import FakeDocument, FakeFeishu
from tests.fakes.feishu_events import FeishuSigner
from tests.fakes.model_server import Answer, CallTool, FakeModelServer
from tests.runtime_bridge.conftest import find_agent_cli

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
]

APP = "cli_tools"
signer = FeishuSigner(encrypt_key="ek_tools", verification_token="vt_tools", app_id=APP)
DAVE: dict[str, Any] = {
    "sender_open_id": "ou_dave",
    "sender_union_id": "on_dave",
    "sender_user_id": "u_dave",
}
CHAT = "oc_p2p_ou_dave"
PLAN = "https://acme.feishu.cn/docx/DocPlan0001"
SECRET = "https://acme.feishu.cn/docx/DocSecret001"
READ = "mcp__memory__amux_feishu_read"
SEARCH = "mcp__memory__amux_feishu_search"
COMMENT = "mcp__memory__amux_feishu_comment"


def approve_buttons(node: Any) -> dict[str, dict[str, Any]]:
    """The permission answer buttons anywhere in a card, by decision."""
    found: dict[str, dict[str, Any]] = {}
    if isinstance(node, dict):
        if node.get("tag") == "button":
            value = node["behaviors"][0]["value"]
            if value.get("action") == "run.approve":
                found[value["decision"]] = value
        for child in node.values():
            found.update(approve_buttons(child))
    elif isinstance(node, list):
        for child in node:
            found.update(approve_buttons(child))
    return found


@dataclass
class Bot:
    hub: HubProcess
    feishu: FakeFeishu
    model: FakeModelServer
    http: aiohttp.ClientSession

    async def say(self, words: str) -> str:
        stored = self.feishu.add_message(CHAT, words, sender_open_id="ou_dave")
        payload = signer.message(words, **DAVE, chat_id=CHAT, message_id=stored.message_id)
        body, headers = signer.sign(payload)
        url = f"{self.hub.url}/feishu/events"
        async with self.http.post(url, data=io.BytesIO(body), headers=headers) as response:
            assert response.status == 200
        return stored.message_id

    def answered(self, asked: str, words: str) -> str | None:
        for message in list(self.feishu.messages.values()):
            if message.sender_open_id or message.root_id != asked:
                continue
            shown = json.dumps([message.card, *message.updates], ensure_ascii=False)
            if words in shown:
                return shown
        return None

    def permission_card(self, asked: str) -> tuple[str, str, dict[str, dict[str, Any]]] | None:
        """(message id, what it shows, its answer buttons) of the card asking for a permission
        under ``asked``."""
        for message in list(self.feishu.messages.values()):
            if message.sender_open_id or message.root_id != asked:
                continue
            for card in (message.card, *message.updates):
                found = approve_buttons(card)
                if found:
                    return message.message_id, json.dumps(card, ensure_ascii=False), found
        return None

    async def click(self, message_id: str, value: dict[str, Any]) -> dict[str, Any]:
        payload = signer.card_action(
            value,
            open_message_id=message_id,
            open_chat_id=CHAT,
            operator_open_id=DAVE["sender_open_id"],
            operator_union_id=DAVE["sender_union_id"],
            operator_user_id=DAVE["sender_user_id"],
        )
        body, headers = signer.sign(payload)
        url = f"{self.hub.url}/feishu/events"
        async with self.http.post(url, data=io.BytesIO(body), headers=headers) as response:
            assert response.status == 200
            answer: dict[str, Any] = await response.json(content_type=None)
            return answer

    def said(self, pattern: str) -> re.Match[str] | None:
        for message in list(self.feishu.messages.values()):
            found = None if message.sender_open_id else re.search(pattern, message.content or "")
            if found is not None:
                return found
        return None

    def tool_results(self) -> list[str]:
        """Every tool result the Agent sent the model, in order, each once."""
        seen: dict[str, str] = {}
        for request in self.model.main_requests:
            for call_id, text in request.tool_results:
                seen.setdefault(call_id, text)
        return list(seen.values())


@contextlib.asynccontextmanager
async def running_bot(tmp_path: Path) -> AsyncIterator[Bot]:
    home = tmp_path / "amux-home"
    state = State(HubSettings(home=home).state_path)
    try:
        # The Feishu tools ride on the turn's memory credential; Bash runs without asking.
        state.save_setting("memory.enabled", True)
        state.save_setting("agents.permissions", "auto")
    finally:
        state.close()
    claude = Path(find_agent_cli("claude"))
    agent_home = tmp_path / "home"
    agent_home.mkdir()
    async with FakeFeishu(app_id=APP) as feishu, FakeModelServer() as model:
        hub = HubProcess(
            home,
            free_port(),
            extra_env={
                "PATH": f"{claude.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "HOME": str(agent_home),
                "ANTHROPIC_BASE_URL": model.base_url,
                "ANTHROPIC_API_KEY": "sk-ant-test",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "AMUX_FEISHU_APP_ID": APP,
                "AMUX_FEISHU_APP_SECRET": "secret",
                "AMUX_FEISHU_ENCRYPT_KEY": signer.encrypt_key,
                "AMUX_FEISHU_VERIFICATION_TOKEN": signer.verification_token,
                "AMUX_FEISHU_DOMAIN": feishu.url,
                "AMUX_FEISHU_LANGUAGE": "en_us",
            },
        )
        await asyncio.to_thread(hub.start)
        try:
            async with aiohttp.ClientSession() as http:
                await until(lambda: feishu.calls("GET", "/bot/v3/info"))
                yield Bot(hub, feishu, model, http)
        finally:
            await asyncio.to_thread(hub.stop)


async def test_the_agent_reads_feishu_as_its_sender_through_amux_mcp(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        feishu = bot.feishu
        feishu.documents["DocPlan0001"] = FakeDocument(
            "docx", "Release plan", "Ship on Friday.\nFreeze on Thursday.", readers={"ou_dave"}
        )
        # Alice's, which the bot's app could read too: Dave may not.
        feishu.documents["DocSecret001"] = FakeDocument(
            "docx", "Salary plan", "alice-only-figures", readers={"ou_alice"}, app_may_read=True
        )

        # Not connected: the tool says how to connect, and nothing is read as anyone.
        bot.model.add_steps([CallTool(READ, {"document": PLAN}), Answer("first answer")])
        asked = await bot.say("What does the release plan say?")
        await until(lambda: bot.answered(asked, "first answer"), seconds=120)
        (unconnected,) = bot.tool_results()
        assert "feishu_not_connected" in unconnected, unconnected
        assert "send /amux connect in your private chat" in unconnected
        assert feishu.document_reads == []

        await bot.say("/amux connect")
        code = await until(lambda: bot.said(r"code (UC-\d+)"))
        feishu.grant_device(code.group(1), "ou_dave")
        await until(lambda: bot.said("account is connected"))
        (dave_token,) = feishu.user_tokens_of("ou_dave")

        # Looked for in pieces, so the command the Agent runs does not itself hold the token.
        head, tail = dave_token[:2], dave_token[2:]
        probe = (
            f'T="{head}""{tail}"; env | cut -d= -f1 | grep -c -i feishu; '
            'env | grep -q -w -- "$T" && echo ENV-HOLDS-TOKEN; '
            'grep -r -s -l -w -- "$T" "$HOME" "$PWD" /tmp && echo FILES-HOLD-TOKEN; '
            "echo probed"
        )
        bot.model.add_steps(
            [
                CallTool(READ, {"document": PLAN}),
                CallTool(READ, {"document": SECRET}),
                CallTool(SEARCH, {"query": "plan"}),
                CallTool("Bash", {"command": probe}),
                Answer("second answer"),
            ]
        )
        asked = await bot.say("Compare the release plan with the salary plan")
        await until(lambda: bot.answered(asked, "second answer"), seconds=120)
        plan, secret, found, probed = bot.tool_results()[1:]
        read = json.loads(plan)
        assert (read["title"], read["revision"]) == ("Release plan", "7")
        assert read["text"] == "Ship on Friday.\nFreeze on Thursday."
        # Alice's document is refused to Dave though the owner (and the app) could read it.
        assert "feishu_refused" in secret and "1770032" in secret, secret
        assert "alice-only-figures" not in json.dumps(bot.model.main_requests[-1].body)
        # Search finds only what Dave may open.
        assert [hit["title"] for hit in json.loads(found)["results"]] == ["Release plan"]
        # Every Feishu call for the Agent carried Dave's own token, never the app's.
        assert {bearer for _, bearer in feishu.document_reads} == {dave_token}
        # Inside the sandbox: no Feishu variable, no token in the environment or the files.
        assert probed.splitlines()[0] == "0", probed
        assert "HOLD" not in probed and "probed" in probed, probed

        # A comment is a change: under ask, Dave sees its exact text and it waits for him.
        done = await asyncio.to_thread(
            bot.hub.cli, "system", "config", "set", "agents.permissions", "ask"
        )
        assert done.returncode == 0, done.stderr
        note = "Looks right to me; ship on Friday."
        bot.model.add_steps(
            [CallTool(COMMENT, {"document": PLAN, "text": note}), Answer("third answer")]
        )
        asked = await bot.say("Say on the release plan that it looks right")
        message_id, shown, answers = await until(lambda: bot.permission_card(asked), seconds=120)
        assert note in shown and "DocPlan0001" in shown, shown
        assert set(answers) == {"allow_once", "allow_session", "deny"}
        assert feishu.comments_added == []
        await bot.click(message_id, answers["allow_once"])
        await until(lambda: bot.answered(asked, "third answer"), seconds=120)
        assert feishu.comments_added == [("DocPlan0001", note, dave_token)]
        assert '"commented":true' in bot.tool_results()[-1]
