"""The whole bot over Feishu's long connection: events and card clicks arrive as WebSocket frames.

The fake's WebSocket speaks the SDK's protobuf frames; the bot answers a card click inside the
frame's acknowledgement (there is no HTTP response to carry it) and messages through the API.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bot.test_bot_flows import (
    ALICE,
    BOB,
    as_operator,
    card_text,
    private_chat,
    running_bot,
    signer,
)

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
