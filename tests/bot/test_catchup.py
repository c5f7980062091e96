"""Catch-up in a group: a message listed after an outage meets the rules a delivered one meets,
so only one that mentions the bot is answered."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bot.test_bot_flows import ALICE, BOT_OPEN_ID, GROUP, running_bot, signer
from tests.conftest import until

pytestmark = pytest.mark.timeout(60)


async def test_a_group_message_caught_up_is_answered_only_when_it_mentions_the_bot(
    tmp_path: Path,
) -> None:
    # Feishu's client config: a 1 s ping interval, and no reconnects of the SDK's own.
    config = {"ping_interval": 1, "reconnect_count": 0}
    async with running_bot(tmp_path, mode="long_connection", long_connection_config=config) as bot:
        feishu = bot.feishu
        live = feishu.add_message(GROUP, "@_user_1 /amux", sender_open_id=ALICE["sender_open_id"])
        await feishu.push(
            signer.message(
                "@_user_1 /amux",
                **ALICE,
                chat_id=GROUP,
                chat_type="group",
                message_id=live.message_id,
                mentions=[signer.mention("@_user_1", BOT_OPEN_ID, "amux")],
            )
        )
        await bot.reply_to(live.message_id)

        feishu.go_silent()
        await feishu.go_down()
        health = bot.adapter.link_health
        assert health is not None
        await until(lambda: health.state == "disconnected", 15)
        mentioned = feishu.add_message(
            GROUP, "@_user_1 /amux", sender_open_id=ALICE["sender_open_id"]
        )
        mentioned.mentions = [
            {"key": "@_user_1", "id": BOT_OPEN_ID, "id_type": "open_id", "name": "amux"}
        ]
        chatter = feishu.add_message(GROUP, "/amux", sender_open_id=ALICE["sender_open_id"])
        await feishu.come_back()

        await bot.reply_to(mentioned.message_id)
        await until(lambda: bot.adapter.catch_up.caught_up == 2, 15)
        await bot.adapter.catch_up.idle()
        await bot.idle()
        assert bot.replies_to(chatter.message_id) == []
        assert len(bot.replies_to(mentioned.message_id)) == 1
        assert len(bot.replies_to(live.message_id)) == 1
