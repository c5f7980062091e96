"""Messages sent while the bot could not hear them are answered once it hears again: after the
long connection comes back, and after the Hub restarts. `amux serve` as a process, over the
long connection to the fake Feishu, with the stand-in Agent ``tests/fakes/gate_agent.sh``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import HubProcess, free_port, stand_in, until
from tests.fakes.feishu import FakeFeishu, StoredMessage
from tests.fakes.feishu_events import FeishuSigner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

signer = FeishuSigner(app_id="cli_cu")
ALICE = {"sender_open_id": "ou_alice", "sender_union_id": "on_alice", "sender_user_id": "u_alice"}
BOB = {"sender_open_id": "ou_bob", "sender_union_id": "on_bob", "sender_user_id": "u_bob"}
ALICE_CHAT = "oc_p2p_alice"


@dataclass
class Bot:
    hub: HubProcess
    feishu: FakeFeishu
    http: aiohttp.ClientSession
    gate: Path

    async def say(self, who: dict[str, str] = ALICE) -> str:
        """A message pushed over the long connection as Feishu delivers one live."""
        stored = self.feishu.add_message(
            ALICE_CHAT, str(self.gate), sender_open_id=who["sender_open_id"]
        )
        await self.push(stored, who)
        return stored.message_id

    async def push(self, stored: StoredMessage, who: dict[str, str] = ALICE) -> None:
        payload = signer.message(
            str(self.gate), **who, chat_id=ALICE_CHAT, message_id=stored.message_id
        )
        payload["event"]["message"]["create_time"] = str(stored.create_time_ms)
        ack = await self.feishu.push(payload)
        assert ack["code"] == 200

    def missed(self, who: dict[str, str] = ALICE) -> StoredMessage:
        """A message sent while the bot hears nothing: Feishu keeps it, pushes nothing."""
        return self.feishu.add_message(
            ALICE_CHAT, str(self.gate), sender_open_id=who["sender_open_id"]
        )

    def replies_to(self, message_id: str) -> list[StoredMessage]:
        return [m for m in self.feishu.messages.values() if m.root_id == message_id]

    def answered(self, message_id: str) -> bool:
        return any("the answer" in shown(m) for m in self.replies_to(message_id))

    def runs(self) -> int:
        path = self.gate.with_name(self.gate.name + ".runs")
        return len(path.read_text().splitlines()) if path.exists() else 0

    async def link(self) -> str:
        async with self.http.get(f"{self.hub.url}/healthz") as response:
            body: dict[str, Any] = await response.json()
        return str(body["feishu_long_connection"]["state"])

    async def metrics(self) -> str:
        async with self.http.get(f"{self.hub.url}/metrics") as response:
            return await response.text()

    async def click(self, note: StoredMessage, who: dict[str, str]) -> dict[str, Any]:
        operator = {k.replace("sender_", "operator_"): v for k, v in who.items()}
        payload = signer.card_action(
            {"action": "catchup.run"},
            **operator,
            open_chat_id=ALICE_CHAT,
            open_message_id=note.message_id,
        )
        ack = await self.feishu.push(payload, kind="card")
        assert ack["code"] == 200
        data: dict[str, Any] = ack["data"]
        return data


def shown(message: StoredMessage) -> str:
    return json.dumps([message.content, *message.updates], ensure_ascii=False)


def caught_up(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('amux_feishu_events_total{outcome="caught_up"}'):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture
async def bot(
    tmp_path: Path, shared_dir: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Bot]:
    window = getattr(request, "param", "600")
    # A 1 s ping interval: a connection silent for 3 s is replaced, and amux itself retries
    # when Feishu tells the SDK not to (0 reconnects).
    async with FakeFeishu(app_id="cli_cu", ping_interval=1, reconnect_count=0) as feishu:
        hub = HubProcess(
            tmp_path / "amux-home",
            free_port(),
            extra_env={
                "AMUX_FEISHU_APP_ID": "cli_cu",
                "AMUX_FEISHU_APP_SECRET": "secret",
                "AMUX_FEISHU_MODE": "long_connection",
                "AMUX_FEISHU_DOMAIN": feishu.url,
                "AMUX_FEISHU_LANGUAGE": "en_us",
                "AMUX_FEISHU_CARD_UPDATE_INTERVAL_SECONDS": "0.2",
                "AMUX_FEISHU_CATCH_UP_WINDOW_SECONDS": window,
                "AMUX_FEISHU_PROVIDER": "gate",
                "AMUX_RUNTIME_PROVIDERS": json.dumps({"gate": str(stand_in("gate_agent.sh"))}),
                "AMUX_RUNTIME_SANDBOX": "off",
                "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
            },
        )
        gate = shared_dir / "gate"
        # Every turn answers at once.
        gate.write_text("the answer\n")
        await asyncio.to_thread(hub.start)
        try:
            async with aiohttp.ClientSession() as http:
                await until(lambda: feishu.calls("GET", "/bot/v3/info"))
                await until(lambda: feishu.ws_connected.is_set())
                yield Bot(hub, feishu, http, gate)
        finally:
            await asyncio.to_thread(hub.stop)


async def answered_live(bot: Bot) -> str:
    """A message the bot answers as it comes: the chat is one the bot serves from now on."""
    live = await bot.say()
    await until(lambda: bot.answered(live), seconds=60)
    return live


async def test_messages_sent_while_the_long_connection_was_down_are_each_answered_once(
    bot: Bot,
) -> None:
    await answered_live(bot)
    bot.feishu.go_silent()
    await bot.feishu.go_down()

    async def down() -> bool:
        return await bot.link() != "connected"

    deadline = time.monotonic() + 30
    while not await down():
        assert time.monotonic() < deadline, "the silent connection was never given up"
        await asyncio.sleep(0.1)
    missed = [bot.missed() for _ in range(3)]
    await bot.feishu.come_back()

    await until(lambda: all(bot.answered(m.message_id) for m in missed), seconds=60)
    assert bot.runs() == 4
    assert "amux_feishu_events_total" in await bot.metrics()
    assert caught_up(await bot.metrics()) == 3

    # Feishu delivering one of them late after all runs nothing more.
    await bot.push(missed[0])
    after = await answered_live(bot)
    assert bot.answered(after) and bot.runs() == 5
    for message in missed:
        assert len(bot.replies_to(message.message_id)) == 1, message.message_id


async def test_messages_sent_while_the_hub_was_stopped_are_each_answered_once_after(
    bot: Bot,
) -> None:
    await answered_live(bot)
    await asyncio.to_thread(bot.hub.stop)
    missed = [bot.missed() for _ in range(3)]
    await asyncio.to_thread(bot.hub.start)

    await until(lambda: all(bot.answered(m.message_id) for m in missed), seconds=60)
    assert bot.runs() == 4
    assert caught_up(await bot.metrics()) == 3
    await bot.push(missed[1])
    after = await answered_live(bot)
    assert bot.answered(after) and bot.runs() == 5
    for message in missed:
        assert len(bot.replies_to(message.message_id)) == 1, message.message_id


@pytest.mark.parametrize("bot", ["1"], indirect=True)
async def test_a_message_found_after_the_window_waits_for_its_senders_click_to_run_once(
    bot: Bot,
) -> None:
    await answered_live(bot)
    await asyncio.to_thread(bot.hub.stop)
    late = bot.missed()
    # Older than the 1 s window by the time the Hub lists it.
    await until(lambda: time.time() * 1000 - late.create_time_ms > 1500)
    await asyncio.to_thread(bot.hub.start)

    (note,) = await until(lambda: bot.replies_to(late.message_id), seconds=60)
    assert "Sent while I was away" in shown(note) and "Run it now" in shown(note)
    assert bot.runs() == 1

    refused = await bot.click(note, BOB)
    assert refused["toast"]["type"] == "error"
    assert "Only the person who sent" in refused["toast"]["content"]
    assert "card" not in refused

    ran = await bot.click(note, ALICE)
    assert ran["toast"]["type"] == "success"
    assert "Run it now" not in json.dumps(ran["card"])
    await until(lambda: bot.answered(late.message_id), seconds=60)
    assert bot.runs() == 2

    again = await bot.click(note, ALICE)
    assert again["toast"]["type"] == "error" and "run already" in again["toast"]["content"]
    # Bob's refused click and the second one ran nothing: a later message is the next run.
    after = await answered_live(bot)
    assert bot.answered(after) and bot.runs() == 3
