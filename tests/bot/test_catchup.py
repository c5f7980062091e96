"""Catch-up: in a group, a message listed after an outage meets the rules a delivered one meets;
and how far catch-up looks is bounded."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.catchup import CatchUp, CatchUpStore
from bot.feishu.client import FeishuClient
from bot.feishu.dedup import SqliteEventDedup
from bot.feishu.dispatcher import EventDispatcher
from tests.bot.test_bot_flows import ALICE, BOT_OPEN_ID, GROUP, running_bot, signer
from tests.conftest import until
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import RecordingSink

pytestmark = pytest.mark.timeout(60)


async def test_group_messages_caught_up_are_answered_only_when_they_mention_the_bot(
    tmp_path: Path,
) -> None:
    # Feishu's client config: a 1 s ping interval, and no reconnects of the SDK's own.
    config = {"ping_interval": 1, "reconnect_count": 0}
    async with running_bot(tmp_path, mode="long_connection", long_connection_config=config) as bot:
        feishu = bot.feishu
        alice = ALICE["sender_open_id"]
        to_bot = [{"key": "@_user_1", "id": BOT_OPEN_ID, "id_type": "open_id", "name": "amux"}]
        # Heard live: a topic's first message in the group.
        live = feishu.add_message(GROUP, "@_user_1 /amux", sender_open_id=alice, thread_id="omt_1")
        await feishu.push(
            signer.message(
                "@_user_1 /amux",
                **ALICE,
                chat_id=GROUP,
                chat_type="group",
                message_id=live.message_id,
                thread_id="omt_1",
                mentions=[signer.mention("@_user_1", BOT_OPEN_ID, "amux")],
            )
        )
        await bot.reply_to(live.message_id)

        feishu.go_silent()
        await feishu.go_down()
        health = bot.adapter.link_health
        assert health is not None
        await until(lambda: health.state == "disconnected", 15)
        mentioned = feishu.add_message(GROUP, "@_user_1 /amux", sender_open_id=alice)
        mentioned.mentions = to_bot
        chatter = feishu.add_message(GROUP, "/amux", sender_open_id=alice)
        # A reply inside the topic: the chat's list leaves it out, the topic's has it.
        in_topic = feishu.add_message(
            GROUP, "@_user_1 /amux", sender_open_id=alice, thread_id="omt_1"
        )
        in_topic.root_id = live.message_id
        in_topic.mentions = to_bot
        await feishu.come_back()

        await bot.reply_to(mentioned.message_id)
        await bot.reply_to(in_topic.message_id)
        await until(lambda: bot.adapter.catch_up.caught_up == 3, 15)
        await bot.adapter.catch_up.idle()
        await bot.idle()
        assert bot.replies_to(chatter.message_id) == []
        assert len(bot.replies_to(mentioned.message_id)) == 1
        listed = {
            (c.query["container_id_type"], c.query["container_id"])
            for c in feishu.calls("GET", "/im/v1/messages")
        }
        assert listed == {("chat", GROUP), ("thread", "omt_1")}


async def test_catch_up_reads_only_the_most_recent_chats_a_bounded_number_of_pages_back(
    tmp_path: Path,
) -> None:
    sink = RecordingSink()
    dedup = SqliteEventDedup(tmp_path / "events.sqlite3")
    dispatcher = EventDispatcher(sink, dedup, bot_open_id="ou_bot")
    async with FakeFeishu(app_id="cli_bounds") as fake:
        settings = FeishuSettings(
            app_id=fake.app_id,
            app_secret=SecretStr(fake.app_secret),
            domain=fake.url,
            mode="long_connection",
            catch_up_chats=1,
            catch_up_pages=1,
            catch_up_max_age_seconds=60,
        )
        client = FeishuClient(settings)
        ready = asyncio.Event()
        ready.set()
        store = CatchUpStore(tmp_path / "catchup.sqlite3")
        CatchUp(settings, store, client, dispatcher, ready)
        try:
            # Heard live: an older chat, then a newer one.
            for chat in ("oc_older", "oc_newer"):
                heard = fake.add_message(chat, "hello")
                payload = signer.message("hello", chat_id=chat, message_id=heard.message_id)
                payload["event"]["message"]["create_time"] = str(heard.create_time_ms)
                await dispatcher.dispatch(payload)
            store.close()
            missed_older = fake.add_message("oc_older", "missed", sender_open_id="ou_user1")
            missed = [
                fake.add_message("oc_newer", f"missed {n}", sender_open_id="ou_user1")
                for n in range(60)
            ]

            # The next process: it had heard both chats, the newer one last.
            store = CatchUpStore(tmp_path / "catchup.sqlite3")
            catch_up = CatchUp(settings, store, client, dispatcher, ready)
            catch_up.start()
            await catch_up.idle()
            await dispatcher.drain()
        finally:
            store.close()
            await client.close()
            dedup.close()
        handled = [m.message_id for m in sink.messages]
        # One page of 50, oldest first, from the newer chat alone; it starts a minute before the
        # newest message heard there, which it lists again and de-duplication drops.
        assert handled[2:] == [m.message_id for m in missed[:49]]
        assert missed_older.message_id not in handled
        assert catch_up.caught_up == 49
        (listed,) = fake.calls("GET", "/im/v1/messages")
        assert listed.query["container_id"] == "oc_newer"
        assert int(listed.query["start_time"]) >= int(time.time()) - 61


async def test_an_app_that_may_not_list_messages_is_told_once_and_the_bot_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = RecordingSink()
    dedup = SqliteEventDedup(tmp_path / "events.sqlite3")
    dispatcher = EventDispatcher(sink, dedup, bot_open_id="ou_bot")
    async with FakeFeishu(app_id="cli_scope") as fake:
        settings = FeishuSettings(
            app_id=fake.app_id, app_secret=SecretStr(fake.app_secret), domain=fake.url
        )
        client = FeishuClient(settings)
        ready = asyncio.Event()
        ready.set()
        store = CatchUpStore(tmp_path / "catchup.sqlite3")
        CatchUp(settings, store, client, dispatcher, ready)
        try:
            for chat in ("oc_one", "oc_two"):
                await dispatcher.dispatch(signer.message("hello", chat_id=chat))
            store.close()
            fake.add_message("oc_one", "missed")
            fake.message_list_refused = True
            store = CatchUpStore(tmp_path / "catchup.sqlite3")
            catch_up = CatchUp(settings, store, client, dispatcher, ready)
            catch_up.start()
            await catch_up.idle()
            await dispatcher.drain()
        finally:
            store.close()
            await client.close()
            dedup.close()
    assert len(fake.calls("GET", "/im/v1/messages")) == 2
    assert catch_up.caught_up == 0 and len(sink.messages) == 2
    (told,) = [r.getMessage() for r in caplog.records if "could not list" in r.getMessage()]
    assert "2 chat(s)" in told and "im:message:readonly" in told
    assert [r for r in caplog.records if r.exc_info] == []
