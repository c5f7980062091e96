"""The whole bot over Feishu's long connection: events and card clicks arrive as WebSocket frames.

The fake's WebSocket speaks the SDK's protobuf frames; the bot answers a card click inside the
frame's acknowledgement (there is no HTTP response to carry it) and messages through the API.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from bot.commands.doctor import Check, check_feishu_connection
from bot.config import FeishuSettings
from tests.bot.test_bot_flows import (
    ALICE,
    BOB,
    as_operator,
    card_text,
    private_chat,
    running_bot,
    signer,
)
from tests.bot.test_feishu_monitoring import sample
from tests.conftest import until

pytestmark = pytest.mark.timeout(60)


async def test_messages_and_card_clicks_work_over_the_long_connection(tmp_path: Path) -> None:
    async with running_bot(tmp_path, mode="long_connection") as bot:
        feishu = bot.feishu
        assert feishu.ws_connected.is_set()
        # No webhook route in this mode: nobody can post events around the connection.
        body, headers = signer.sign(signer.message("/amux", **BOB))
        response = await bot.client.post("/feishu/events", data=body, headers=headers)
        assert response.status == 404

        stored = feishu.add_message(private_chat(ALICE), "/amux")
        ack = await feishu.push(
            signer.message(
                "/amux", **ALICE, chat_id=private_chat(ALICE), message_id=stored.message_id
            )
        )
        assert ack["code"] == 200
        card = await bot.reply_to(stored.message_id)
        assert "alice" in card_text(card.card)
        assert '"checker"' in card_text(card.card), "the owner sees the memory switch"

        for kind in ("card", "event"):
            click = signer.card_action(
                {"action": "memory.toggle", "memory_enabled": True, "isolation": False},
                **as_operator(ALICE),
                open_chat_id=private_chat(ALICE),
                open_message_id=card.message_id,
            )
            ack = await feishu.push(click, kind=kind)
            assert ack["code"] == 200
            shown = ack["data"]["card"]
            assert shown["type"] == "raw"
            assert "Save" in card_text(shown["data"])

        refused = signer.card_action(
            {"action": "settings.save", "memory_enabled": True, "isolation": True},
            **as_operator(BOB),
            open_chat_id=private_chat(BOB),
        )
        ack = await feishu.push(refused, kind="card")
        assert "Owner only" in card_text(ack["data"]["card"]["data"])
        assert bot.hub.config.describe()["memory.enabled"].saved is False


async def test_a_silent_long_connection_is_replaced_and_healthz_shows_it(tmp_path: Path) -> None:
    # Feishu's client config sets a 1 s ping interval: 3 s without a frame is a dead connection.
    config = {"ping_interval": 1, "reconnect_count": -1}
    async with running_bot(tmp_path, mode="long_connection", long_connection_config=config) as bot:
        feishu = bot.feishu

        async def health() -> dict[str, Any]:
            body: dict[str, Any] = await (await bot.client.get("/healthz")).json()
            return body

        link = (await health())["feishu_long_connection"]
        assert link["state"] == "connected" and link["silence_bound_seconds"] == 3.0
        assert link["silent_reconnects"] == 0 and link["last_event_age_seconds"] is None
        await until(lambda: feishu.ws_pings >= 1)

        feishu.go_silent()
        silenced = time.monotonic()
        seen: list[dict[str, Any]] = []

        async def replaced() -> bool:
            seen.append((await health())["feishu_long_connection"])
            return seen[-1]["silent_reconnects"] == 1 and seen[-1]["state"] == "connected"

        deadline = silenced + 10
        while not await replaced():
            assert time.monotonic() < deadline, seen[-1]
            await asyncio.sleep(0.1)
        assert feishu.ws_connections == 2
        # The silence grew in plain view before the connection was replaced.
        assert max(s["last_frame_age_seconds"] or 0 for s in seen) >= 2.0

        stored = feishu.add_message(private_chat(ALICE), "/amux")
        await feishu.push(
            signer.message(
                "/amux", **ALICE, chat_id=private_chat(ALICE), message_id=stored.message_id
            )
        )
        assert "alice" in card_text((await bot.reply_to(stored.message_id)).card)
        link = (await health())["feishu_long_connection"]
        assert link["last_event_age_seconds"] is not None and link["last_event_age_seconds"] < 5

        metrics = await (await bot.client.get("/metrics")).text()
        assert sample(metrics, "amux_feishu_long_connection_state", state="connected") == 1
        assert sample(metrics, "amux_feishu_long_connection_state", state="reconnecting") == 0
        assert "\namux_feishu_long_connection_silent_reconnects_total 1.0\n" in metrics
        assert "amux_feishu_long_connection_last_frame_age_seconds " in metrics


async def test_doctor_shows_a_long_connection_that_is_down_and_back(tmp_path: Path) -> None:
    # Feishu tells the SDK not to reconnect on its own (0 attempts); amux tries again itself.
    config = {"ping_interval": 1, "reconnect_count": 0}
    async with running_bot(tmp_path, mode="long_connection", long_connection_config=config) as bot:
        settings = bot.adapter.settings
        # Connected before its first frame reads "nothing heard yet": wait for one.
        check = await until_ok(settings, bot.url, heard=True)
        assert check.status == "ok" and check.detail.startswith("connected; last frame")
        assert "last event none yet" in check.detail

        bot.feishu.go_silent()
        await bot.feishu.go_down()
        await until(
            lambda: bot.adapter.link_health is not None
            and bot.adapter.link_health.state == "disconnected",
            15,
        )
        check = await check_feishu_connection(settings, bot.url)
        assert check.status == "fail", check
        assert "reconnect(s) after silence" in check.detail
        assert "AMUX_FEISHU_DOMAIN" in check.fix

        await bot.feishu.come_back()
        await until(lambda: bot.feishu.ws_connections == 2, 15)
        check = await until_ok(settings, bot.url)
        assert check.status == "ok"


async def until_ok(settings: FeishuSettings, url: str, heard: bool = False) -> Check:
    deadline = time.monotonic() + 10
    while True:
        check = await check_feishu_connection(settings, url)
        done = check.status == "ok" and (not heard or "nothing heard yet" not in check.detail)
        if done or time.monotonic() > deadline:
            return check
        await asyncio.sleep(0.1)
