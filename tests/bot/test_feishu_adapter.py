import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.adapter import FeishuAdapter
from bot.feishu.events import CardAction, CardResponse, CommentEvent, MessageEvent, OtherEvent
from bot.feishu.ingress import EVENTS_PATH
from cards.models import ProgressView
from cards.progress import progress_card, result_cards
from hub.errors import InvalidArgument
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import FeishuSigner

AiohttpClient = Callable[[web.Application], Awaitable[TestClient]]
signer = FeishuSigner(encrypt_key="ek_a", verification_token="vt_a")


class EchoBot:
    """A tiny sink that answers in the message's topic, the way the real bot will."""

    def __init__(self) -> None:
        self.adapter: FeishuAdapter | None = None
        self.done = asyncio.Event()

    async def on_message(self, event: MessageEvent) -> None:
        assert self.adapter is not None
        progress = ProgressView(title=event.text, status="running", lines=("thinking",))
        sent = await self.adapter.client.reply(
            event.message_id, card=progress_card(progress, "en_us")
        )
        for n in range(20):
            lines = ("thinking", f"step {n}")
            self.adapter.cards.update(
                sent.message_id, progress_card(ProgressView(event.text, "running", lines), "en_us")
            )
        done = ProgressView(event.text, "done", ("finished",))
        await self.adapter.cards.finish(sent.message_id, progress_card(done, "en_us"))
        for card in result_cards(f"You said: {event.text}", "en_us"):
            await self.adapter.client.reply(event.message_id, card=card)
        self.done.set()

    async def on_card_action(self, action: CardAction) -> CardResponse | None:
        return CardResponse(toast=action.action)

    async def on_comment(self, event: CommentEvent) -> None:
        return None

    async def on_event(self, event: OtherEvent) -> None:
        return None


def _settings(fake: FakeFeishu, **kw: object) -> FeishuSettings:
    return FeishuSettings(
        app_id=fake.app_id,
        app_secret=SecretStr(fake.app_secret),
        encrypt_key=SecretStr("ek_a"),
        verification_token=SecretStr("vt_a"),
        domain=fake.url,
        card_update_interval_seconds=60,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu(app_id=f"cli_{uuid.uuid4().hex[:12]}", bot_open_id="ou_amux") as server:
        yield server


async def test_a_group_mention_is_answered_in_its_topic_with_throttled_progress(
    fake: FakeFeishu, tmp_path: Path, aiohttp_client: AiohttpClient
) -> None:
    bot = EchoBot()
    adapter = FeishuAdapter(_settings(fake), bot, tmp_path)
    bot.adapter = adapter
    app = web.Application()
    app.add_routes(adapter.routes())
    app.cleanup_ctx.append(adapter.context)
    client = await aiohttp_client(app)
    async with asyncio.timeout(5):
        await adapter.identity_known.wait()
    assert adapter.bot_open_id == "ou_amux"

    root = fake.add_message("oc_group", "@amux build it")
    payload = signer.message(
        "@_user_1 build it",
        chat_type="group",
        chat_id="oc_group",
        message_id=root.message_id,
        mentions=[signer.mention("@_user_1", "ou_amux", "amux")],
    )
    body, headers = signer.sign(payload)
    response = await client.post(EVENTS_PATH, data=body, headers=headers)
    assert response.status == 200
    async with asyncio.timeout(10):
        await bot.done.wait()

    replies = fake.calls("POST", "/reply")
    assert len(replies) == 2 and all(r.body["reply_in_thread"] for r in replies)
    progress_id = next(m for m in fake.messages.values() if m.updates).message_id
    patches = fake.calls("PATCH", progress_id)
    assert 1 <= len(patches) <= 2  # 20 streamed states coalesced
    final = fake.messages[progress_id].card
    assert final["header"]["title"]["content"] == "Done"
    assert final["header"]["subtitle"]["content"] == "build it"


async def test_long_connection_mode_connects_and_stops_cleanly(
    fake: FakeFeishu, tmp_path: Path
) -> None:
    adapter = FeishuAdapter(_settings(fake, mode="long_connection"), EchoBot(), tmp_path)
    assert adapter.routes() == []
    await adapter.start()
    try:
        async with asyncio.timeout(5):
            await fake.ws_connected.wait()
        ack = await fake.push(signer.card_action({"action": "manage.open"}), kind="card")
        assert ack["data"] == {"toast": {"type": "info", "content": "manage.open"}}
    finally:
        await adapter.stop()


def test_an_unconfigured_bot_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        FeishuAdapter(FeishuSettings(), EchoBot(), tmp_path)


def test_webhook_mode_without_secrets_is_refused(tmp_path: Path) -> None:
    settings = FeishuSettings(app_id="cli_x", app_secret=SecretStr("s"))
    with pytest.raises(InvalidArgument):
        FeishuAdapter(settings, EchoBot(), tmp_path)


async def test_a_webhook_with_a_token_but_no_encrypt_key_needs_an_explicit_choice(
    tmp_path: Path,
) -> None:
    token_only = {"app_id": "cli_x", "app_secret": SecretStr("s"), "verification_token": "vt"}
    with pytest.raises(InvalidArgument, match="AMUX_FEISHU_ALLOW_UNENCRYPTED"):
        FeishuAdapter(FeishuSettings(**token_only), EchoBot(), tmp_path)  # type: ignore[arg-type]
    allowed = FeishuSettings(**token_only, allow_unencrypted=True)  # type: ignore[arg-type]
    adapter = FeishuAdapter(allowed, EchoBot(), tmp_path)
    try:
        assert [route.path for route in adapter.routes()] == [EVENTS_PATH]
    finally:
        await adapter.stop()
