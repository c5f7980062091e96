import io
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from bot.feishu.dedup import SqliteEventDedup
from bot.feishu.dispatcher import EventDispatcher
from bot.feishu.events import CardResponse
from bot.feishu.ingress import EVENTS_PATH, WebhookIngress
from bot.feishu.verifier import WebhookVerifier
from tests.fakes.feishu_events import FeishuSigner, RecordingSink, signature

AiohttpClient = Callable[[web.Application], Awaitable[TestClient]]
signer = FeishuSigner(encrypt_key="ek_webhook", verification_token="vt_webhook")


@dataclass
class Webhook:
    client: TestClient
    sink: RecordingSink
    dispatcher: EventDispatcher

    async def post(self, payload: dict[str, object], **sign_kw: object) -> tuple[int, dict]:
        body, headers = signer.sign(payload, **sign_kw)  # type: ignore[arg-type]
        return await self.post_raw(body, headers)

    async def post_raw(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
        # A stream, as aiohttp warns about (large) raw bytes bodies.
        response = await self.client.post(EVENTS_PATH, data=io.BytesIO(body), headers=headers)
        return response.status, await response.json()


def _make(
    tmp_path: Path, sink: RecordingSink, card_timeout: float = 2.5
) -> tuple[web.Application, EventDispatcher, SqliteEventDedup]:
    dedup = SqliteEventDedup(tmp_path / "state.sqlite3")
    dispatcher = EventDispatcher(sink, dedup, bot_open_id="ou_bot", card_timeout=card_timeout)
    verifier = WebhookVerifier(encrypt_key="ek_webhook", verification_token="vt_webhook")
    app = web.Application()
    app.add_routes(WebhookIngress(verifier, dispatcher).routes())
    return app, dispatcher, dedup


@pytest.fixture
async def webhook(tmp_path: Path, aiohttp_client: AiohttpClient) -> AsyncIterator[Webhook]:
    sink = RecordingSink(
        card_response=CardResponse(
            card={"schema": "2.0", "n": 1}, toast="Saved", toast_type="success"
        )
    )
    app, dispatcher, dedup = _make(tmp_path, sink)
    client = await aiohttp_client(app)
    yield Webhook(client, sink, dispatcher)
    await dispatcher.drain()
    dedup.close()


async def test_url_verification_answers_the_challenge(webhook: Webhook) -> None:
    status, body = await webhook.post(signer.url_verification("chal-123"))
    assert (status, body) == (200, {"challenge": "chal-123"})


async def test_a_message_is_acked_and_delivered_once_even_when_posted_twice(
    webhook: Webhook,
) -> None:
    payload = signer.message(
        "@_user_1 hello",
        chat_type="group",
        event_id="ev_dup",
        mentions=[signer.mention("@_user_1", "ou_bot", "amux")],
    )
    assert await webhook.post(payload) == (200, {"msg": "success"})
    # Feishu's retry: same event, new timestamp, nonce and ciphertext.
    assert await webhook.post(payload) == (200, {"msg": "success"})
    await webhook.sink.wait_for(lambda s: len(s.messages) >= 1)
    await webhook.dispatcher.drain()
    assert len(webhook.sink.messages) == 1
    event = webhook.sink.messages[0]
    assert event.text == "hello" and event.mentions_bot


async def test_a_comment_reply_is_delivered_once_even_under_two_event_ids(
    webhook: Webhook,
) -> None:
    first = signer.comment("DocPlan0001", "cm_1", "rp_1", event_id="ev_c1")
    again = signer.comment("DocPlan0001", "cm_1", "rp_1", event_id="ev_c2")
    later = signer.comment("DocPlan0001", "cm_1", "rp_2", event_id="ev_c3")
    for payload in (first, first, again, later):
        assert await webhook.post(payload) == (200, {"msg": "success"})
    await webhook.sink.wait_for(lambda s: len(s.comments) >= 2)
    await webhook.dispatcher.drain()
    assert [c.reply_id for c in webhook.sink.comments] == ["rp_1", "rp_2"]
    assert webhook.sink.messages == [] and webhook.sink.others == []


async def test_forged_signature_is_401_and_nothing_is_delivered(webhook: Webhook) -> None:
    body, headers = signer.sign(signer.message("hi"))
    headers["X-Lark-Signature"] = headers["X-Lark-Signature"][::-1]
    status, answer = await webhook.post_raw(body, headers)
    assert status == 401
    assert answer["error"]["code"] == "unauthenticated"
    assert webhook.sink.messages == [] and webhook.dispatcher.pending == 0


async def test_wrong_verification_token_is_403(webhook: Webhook) -> None:
    status, answer = await webhook.post(signer.message("hi", token="wrong"))
    assert status == 403
    assert answer["error"]["code"] == "forbidden"


async def test_stale_timestamp_is_401(webhook: Webhook) -> None:
    status, _ = await webhook.post(signer.message("hi"), timestamp=int(time.time()) - 3600)
    assert status == 401


@pytest.mark.parametrize("timestamp", ["nan", "inf", "1e3", "", "9" * 40])
async def test_a_signed_non_integer_timestamp_is_401_and_nothing_is_delivered(
    webhook: Webhook, timestamp: str
) -> None:
    body, headers = signer.sign(signer.message("hi"))
    nonce = headers["X-Lark-Request-Nonce"]
    headers["X-Lark-Request-Timestamp"] = timestamp
    headers["X-Lark-Signature"] = signature(timestamp, nonce, signer.encrypt_key, body)
    status, answer = await webhook.post_raw(body, headers)
    assert status == 401
    assert answer["error"]["code"] == "unauthenticated"
    assert webhook.sink.messages == [] and webhook.dispatcher.pending == 0


async def test_garbage_body_is_400_not_500(webhook: Webhook) -> None:
    status, answer = await webhook.post_raw(b"\x00not json", {})
    assert status == 400
    assert answer["error"]["code"] == "invalid_argument"


async def test_card_action_gets_the_in_place_card_and_toast(webhook: Webhook) -> None:
    payload = signer.card_action({"action": "settings.save", "memory_enabled": True})
    status, answer = await webhook.post(payload)
    assert status == 200
    assert answer == {
        "toast": {"type": "success", "content": "Saved"},
        "card": {"type": "raw", "data": {"schema": "2.0", "n": 1}},
    }
    assert webhook.sink.card_actions[0].value["memory_enabled"] is True


async def test_a_slow_card_handler_still_lets_feishu_have_its_answer_in_time(
    tmp_path: Path, aiohttp_client: AiohttpClient
) -> None:
    sink = RecordingSink(card_response=CardResponse(toast="late"), hold_cards=True)
    app, dispatcher, dedup = _make(tmp_path, sink, card_timeout=0.2)
    client = await aiohttp_client(app)
    hook = Webhook(client, sink, dispatcher)
    started = time.monotonic()
    status, answer = await hook.post(signer.card_action({"action": "restart.now"}))
    assert (status, answer) == (200, {})
    assert time.monotonic() - started < 3
    assert sink.cards_finished == 0 and dispatcher.pending == 1
    sink.release_cards.set()
    await sink.wait_for(lambda s: s.cards_finished == 1)
    await dispatcher.drain()
    dedup.close()


async def test_other_subscribed_events_are_acked_and_delivered(webhook: Webhook) -> None:
    payload = {
        "schema": "2.0",
        "header": {
            "event_id": "ev_added",
            "event_type": "im.chat.member.bot.added_v1",
            "token": "vt_webhook",
        },
        "event": {"chat_id": "oc_new"},
    }
    assert await webhook.post(payload) == (200, {"msg": "success"})
    await webhook.sink.wait_for(lambda s: len(s.others) == 1)
    assert webhook.sink.others[0].event["chat_id"] == "oc_new"


async def test_duplicates_are_remembered_across_a_restart(
    tmp_path: Path, aiohttp_client: AiohttpClient
) -> None:
    payload = signer.message("once", event_id="ev_restart")
    for _ in range(2):
        sink = RecordingSink()
        app, dispatcher, dedup = _make(tmp_path, sink)
        client = await aiohttp_client(app)
        body, headers = signer.sign(payload)
        response = await client.post(EVENTS_PATH, data=body, headers=headers)
        assert response.status == 200
        await dispatcher.drain()
        dedup.close()
        await client.close()
    assert json.loads(body)  # the last request was well-formed
    assert sink.messages == []  # the second "process" saw it as a duplicate


async def test_a_large_event_is_read_whole_and_an_oversized_one_is_413(
    webhook: Webhook,
) -> None:
    big = "x" * 200_000
    status, _ = await webhook.post(signer.message(big, event_id="ev_big"))
    assert status == 200
    await webhook.sink.wait_for(lambda s: len(s.messages) == 1)
    assert webhook.sink.messages[0].text == big
    huge = signer.message("y" * 2_000_000)
    status, answer = await webhook.post(huge)
    assert status == 413
    assert answer["error"]["code"] == "payload_too_large"
