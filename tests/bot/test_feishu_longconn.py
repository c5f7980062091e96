import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.dedup import SqliteEventDedup
from bot.feishu.dispatcher import EventDispatcher
from bot.feishu.errors import FeishuApiError
from bot.feishu.events import CardResponse
from bot.feishu.longconn import LongConnection
from tests.conftest import until
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import FeishuSigner, RecordingSink

signer = FeishuSigner()
CARD = {"schema": "2.0", "body": {"elements": []}}


@dataclass
class Connected:
    fake: FakeFeishu
    sink: RecordingSink
    dispatcher: EventDispatcher


@pytest.fixture
async def connected(tmp_path: Path) -> AsyncIterator[Connected]:
    sink = RecordingSink(card_response=CardResponse(card=CARD, toast="ok", toast_type="success"))
    dedup = SqliteEventDedup(tmp_path / "state.sqlite3")
    dispatcher = EventDispatcher(sink, dedup, bot_open_id="ou_bot")
    async with FakeFeishu(app_id=f"cli_{uuid.uuid4().hex[:12]}") as fake:
        settings = FeishuSettings(
            app_id=fake.app_id,
            app_secret=SecretStr(fake.app_secret),
            domain=fake.url,
            mode="long_connection",
        )
        connection = LongConnection(settings, dispatcher)
        connection.start()
        try:
            await connection.wait_connected()
            yield Connected(fake, sink, dispatcher)
        finally:
            await connection.stop()
            await dispatcher.drain()
            dedup.close()


async def test_events_arrive_on_the_main_loop_once(connected: Connected) -> None:
    payload = signer.message("hello", event_id="ev_ws_1")
    first = await connected.fake.push(payload)
    again = await connected.fake.push(payload)
    assert first == {"code": 200} and again == {"code": 200}
    await connected.sink.wait_for(lambda s: len(s.messages) == 1)
    await connected.dispatcher.drain()
    assert [m.text for m in connected.sink.messages] == ["hello"]
    (endpoint_call,) = connected.fake.calls("POST", "/callback/ws/endpoint")
    assert endpoint_call.body["AppID"] == connected.fake.app_id


async def test_a_document_comment_arrives_over_the_long_connection(connected: Connected) -> None:
    payload = signer.comment("DocPlan0001", "cm_1", "rp_1", event_id="ev_ws_comment")
    assert await connected.fake.push(payload) == {"code": 200}
    await connected.sink.wait_for(lambda s: len(s.comments) == 1)
    (comment,) = connected.sink.comments
    assert (comment.file_token, comment.comment_id, comment.reply_id) == (
        "DocPlan0001",
        "cm_1",
        "rp_1",
    )
    assert comment.mentions_bot and connected.sink.others == []


@pytest.mark.parametrize("frame_type", ["card", "event"])
async def test_card_clicks_are_answered_with_the_in_place_card(
    connected: Connected, frame_type: str
) -> None:
    payload = signer.card_action({"action": "memory.list"}, event_id=f"ev_card_{frame_type}")
    ack = await connected.fake.push(payload, kind=frame_type)
    assert ack["code"] == 200
    assert ack["data"] == {
        "toast": {"type": "success", "content": "ok"},
        "card": {"type": "raw", "data": CARD},
    }
    assert connected.sink.card_actions[0].action == "memory.list"


async def test_legacy_card_callbacks_are_understood(connected: Connected) -> None:
    legacy = {
        "open_id": "ou_user1",
        "union_id": "on_user1",
        "open_message_id": "om_old",
        "open_chat_id": "oc_1",
        "token": "c-legacy",
        "action": {"tag": "button", "value": {"action": "manage.open"}},
    }
    ack = await connected.fake.push(legacy, kind="card")
    assert ack["data"]["toast"]["content"] == "ok"
    action = connected.sink.card_actions[0]
    assert action.open_message_id == "om_old" and action.operator.union_id == "on_user1"


async def test_a_connection_gone_silent_is_replaced_and_events_flow_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = RecordingSink()
    dedup = SqliteEventDedup(tmp_path / "state.sqlite3")
    dispatcher = EventDispatcher(sink, dedup, bot_open_id="ou_bot")
    # Feishu's client config sets the SDK's ping interval: 1 s, so 3 s of silence is too long.
    async with FakeFeishu(
        app_id=f"cli_{uuid.uuid4().hex[:12]}", ping_interval=1, reconnect_count=-1
    ) as fake:
        settings = FeishuSettings(
            app_id=fake.app_id, app_secret=SecretStr(fake.app_secret), domain=fake.url
        )
        connection = LongConnection(settings, dispatcher)
        connection.start()
        try:
            await connection.wait_connected()
            assert connection.health.state == "connected"
            assert connection.health.silence_bound == 3.0
            await until(lambda: fake.ws_pings >= 1 and connection.health.last_frame is not None, 15)
            fake.go_silent()
            silenced = time.monotonic()
            await until(lambda: fake.ws_connections == 2, 15)
            # Three ping intervals and one look of the watchdog, plus the reconnect (with room
            # for a busy machine; without the watchdog it never comes).
            assert time.monotonic() - silenced < 3.0 + 0.5 + 4.0
            await until(lambda: connection.health.state == "connected", 15)
            assert connection.health.silent_reconnects == 1
            assert any(
                "long connection silent for" in record.getMessage() for record in caplog.records
            )
            ack = await fake.push(signer.message("still there?", event_id="ev_after_silence"))
            assert ack == {"code": 200}
            await sink.wait_for(lambda s: len(s.messages) == 1)
            assert connection.health.snapshot().event_age_seconds is not None
        finally:
            await connection.stop()
            await dispatcher.drain()
            dedup.close()
    assert connection.health.state == "disconnected"


async def test_wrong_credentials_fail_clearly(tmp_path: Path) -> None:
    dedup = SqliteEventDedup(tmp_path / "state.sqlite3")
    dispatcher = EventDispatcher(RecordingSink(), dedup)
    async with FakeFeishu(app_id=f"cli_{uuid.uuid4().hex[:12]}") as fake:
        settings = FeishuSettings(
            app_id=fake.app_id, app_secret=SecretStr("wrong"), domain=fake.url
        )
        connection = LongConnection(settings, dispatcher)
        connection.start()
        with pytest.raises(FeishuApiError) as caught:
            await connection.wait_connected()
        assert "wrong" not in str(caught.value)
        await connection.stop()
    dedup.close()
