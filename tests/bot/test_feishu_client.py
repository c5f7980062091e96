import json
import uuid
from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.client import FeishuClient, classify, default_backoff
from bot.feishu.errors import FeishuApiError
from hub.errors import Unavailable
from tests.fakes.feishu import FakeFeishu


@pytest.fixture
async def fake() -> AsyncIterator[FakeFeishu]:
    # lark-oapi caches tenant tokens process-wide by app id: a fresh id per test keeps them apart.
    async with FakeFeishu(app_id=f"cli_{uuid.uuid4().hex[:12]}", app_secret="s3cret") as server:
        yield server


_made: list[FeishuClient] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _made:
        await _made.pop().close()


def _client(fake: FakeFeishu, secret: str = "s3cret", attempts: int = 4) -> FeishuClient:
    settings = FeishuSettings(app_id=fake.app_id, app_secret=SecretStr(secret), domain=fake.url)
    client = FeishuClient(settings, attempts=attempts, backoff=lambda _state: 0.0)
    _made.append(client)
    return client


async def test_send_card_posts_an_interactive_message_with_a_tenant_token(
    fake: FakeFeishu,
) -> None:
    card = {"schema": "2.0", "body": {"elements": []}}
    sent = await _client(fake).send_card("oc_chat1", card)
    assert sent.message_id in fake.messages
    assert sent.chat_id == "oc_chat1"
    (call,) = fake.calls("POST", "/im/v1/messages")
    assert call.query == {"receive_id_type": "chat_id"}
    assert call.body["msg_type"] == "interactive"
    assert json.loads(call.body["content"]) == card
    assert call.body["uuid"]
    assert call.headers["Authorization"].removeprefix("Bearer ") in fake.issued_tokens


async def test_send_text_to_a_user_by_open_id(fake: FakeFeishu) -> None:
    await _client(fake).send_text("ou_user1", "hello", receive_id_type="open_id")
    (call,) = fake.calls("POST", "/im/v1/messages")
    assert call.query == {"receive_id_type": "open_id"}
    assert json.loads(call.body["content"]) == {"text": "hello"}


async def test_reply_in_thread_returns_the_topic(fake: FakeFeishu) -> None:
    client = _client(fake)
    root = await client.send_text("oc_group", "question")
    first = await client.reply(root.message_id, text="answer")
    second = await client.reply(root.message_id, card={"schema": "2.0"})
    assert first.thread_id and first.thread_id == second.thread_id
    assert first.root_id == root.message_id
    calls = fake.calls("POST", "/reply")
    assert [c.body["reply_in_thread"] for c in calls] == [True, True]
    assert calls[1].body["msg_type"] == "interactive"


async def test_update_card_patches_the_message(fake: FakeFeishu) -> None:
    client = _client(fake)
    sent = await client.send_card("oc_chat1", {"v": 1})
    await client.update_card(sent.message_id, {"v": 2})
    assert fake.messages[sent.message_id].card == {"v": 2}


async def test_delayed_update_sends_the_callback_token_and_card(fake: FakeFeishu) -> None:
    await _client(fake).delayed_update("c-token", {"v": 3})
    assert fake.card_updates == [{"token": "c-token", "card": {"v": 3}}]


async def test_bot_info_returns_the_bot_open_id(fake: FakeFeishu) -> None:
    info = await _client(fake).bot_info()
    assert info.open_id == "ou_bot"


async def test_token_is_fetched_once_and_reused(fake: FakeFeishu) -> None:
    client = _client(fake)
    await client.bot_info()
    await client.bot_info()
    assert len(fake.calls("POST", "tenant_access_token")) == 1


async def test_rate_limited_send_is_retried_then_succeeds_once(fake: FakeFeishu) -> None:
    client = _client(fake)
    await client.bot_info()  # token cached, so only the send is rate limited
    fake.fail_next(2, status=429, code=99991400, path_contains="/im/v1/messages")
    sent = await client.send_text("oc_chat1", "hi")
    calls = fake.calls("POST", "/im/v1/messages")
    assert len(calls) == 3
    # One logical message: every attempt carries the same idempotency uuid.
    assert len({c.body["uuid"] for c in calls}) == 1
    assert list(fake.messages) == [sent.message_id]


async def test_the_servers_rate_limit_reset_hint_is_honoured(fake: FakeFeishu) -> None:
    client = _client(fake)
    await client.bot_info()
    fake.fail_next(1, path_contains="/im/v1/messages", headers={"x-ogw-ratelimit-reset": "0.3"})
    await client.send_text("oc_chat1", "hi")
    first, second = fake.calls("POST", "/im/v1/messages")
    assert second.at - first.at >= 0.3


async def test_rate_limit_code_with_http_200_is_retried(fake: FakeFeishu) -> None:
    fake.fail_next(1, status=200, code=230020, path_contains="/reply")
    client = _client(fake)
    root = await client.send_text("oc_chat1", "q")
    await client.reply(root.message_id, text="a")
    assert len(fake.calls("POST", "/reply")) == 2


async def test_the_tenants_create_message_limit_is_waited_out(fake: FakeFeishu) -> None:
    client = _client(fake)
    await client.bot_info()
    # Feishu answers HTTP 400 with 11232 when the tenant creates messages too fast.
    fake.fail_next(1, status=400, code=11232, path_contains="/im/v1/messages")
    sent = await client.send_text("oc_chat1", "hi")
    assert len(fake.calls("POST", "/im/v1/messages")) == 2
    assert list(fake.messages) == [sent.message_id]


async def test_server_errors_are_retried(fake: FakeFeishu) -> None:
    fake.fail_next(1, status=503, code=0, path_contains="/bot/v3/info")
    assert (await _client(fake).bot_info()).open_id == "ou_bot"


async def test_a_server_error_on_the_tenant_token_is_retried(fake: FakeFeishu) -> None:
    fake.fail_next(1, status=502, code=1, path_contains="tenant_access_token")
    assert (await _client(fake).bot_info()).open_id == "ou_bot"
    assert len(fake.calls("POST", "tenant_access_token")) == 2


async def test_an_unreadable_tenant_token_answer_is_a_typed_error(fake: FakeFeishu) -> None:
    fake.token_answer = b"<html>not the token</html>"
    with pytest.raises(FeishuApiError) as caught:
        await _client(fake).bot_info()
    assert caught.value.operation == "tenant_token"
    assert fake.calls("GET", "/bot/v3/info") == []


async def test_persistent_rate_limit_gives_up_with_unavailable(fake: FakeFeishu) -> None:
    fake.fail_next(10, status=429, code=99991400, path_contains="/bot/v3/info")
    with pytest.raises(Unavailable) as caught:
        await _client(fake, attempts=3).bot_info()
    assert caught.value.code == "unavailable"
    assert len(fake.calls("GET", "/bot/v3/info")) == 3


async def test_wrong_app_secret_fails_at_once_without_leaking_it(fake: FakeFeishu) -> None:
    with pytest.raises(FeishuApiError) as caught:
        await _client(fake, secret="wrong-secret").send_text("oc_chat1", "hi")
    assert len(fake.calls("POST", "tenant_access_token")) == 1
    assert fake.calls("POST", "/im/v1/messages") == []
    assert caught.value.feishu_code == 10014
    assert "wrong-secret" not in str(caught.value) and "wrong-secret" not in repr(
        caught.value.to_wire()
    )


async def test_validation_error_is_not_retried(fake: FakeFeishu) -> None:
    fake.fail_next(1, status=400, code=230001, path_contains="/im/v1/messages")
    with pytest.raises(FeishuApiError) as caught:
        await _client(fake).send_text("oc_chat1", "hi")
    assert caught.value.feishu_code == 230001
    assert len(fake.calls("POST", "/im/v1/messages")) == 1


async def test_a_rejected_cached_token_is_refreshed_once(fake: FakeFeishu) -> None:
    client = _client(fake)
    await client.bot_info()
    fake.issued_tokens.clear()  # the server forgot every token it issued
    assert (await client.bot_info()).open_id == "ou_bot"
    assert len(fake.calls("POST", "tenant_access_token")) == 2


async def test_unreachable_feishu_is_unavailable() -> None:
    async with FakeFeishu() as gone:
        url = gone.url
    settings = FeishuSettings(
        app_id=f"cli_{uuid.uuid4().hex[:12]}", app_secret=SecretStr("x"), domain=url
    )
    client = FeishuClient(settings, attempts=2, backoff=lambda _state: 0.0)
    with pytest.raises(Unavailable):
        await client.bot_info()
    await client.close()


@pytest.mark.parametrize(
    ("status", "code", "verdict"),
    [
        (200, 0, "ok"),
        (429, None, "retry"),
        (200, 99991400, "retry"),
        (400, 99991402, "retry"),
        (200, 11020, "retry"),
        (200, 11021, "retry"),
        (500, None, "retry"),
        (502, 0, "retry"),
        (400, 99991663, "refresh_token"),
        (403, 99991672, "fail"),
        (400, 230001, "fail"),
        (200, 10014, "fail"),
    ],
)
def test_only_rate_limits_and_transient_errors_are_retried(
    status: int, code: int | None, verdict: str
) -> None:
    assert classify(status, code) == verdict


def test_default_backoff_grows_and_is_capped() -> None:
    assert 0.5 <= default_backoff(1) <= 1.0
    assert 1.0 <= default_backoff(2) <= 1.5
    assert 8.0 <= default_backoff(50) <= 8.5
