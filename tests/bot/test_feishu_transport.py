"""Every Feishu call of the bot goes out on one pooled session of kept-alive connections.

Against the real Feishu each new connection costs a TCP and a TLS handshake, so a card update
that connects anew takes several round trips instead of one. The fake Feishu counts the
connections its API calls arrive on.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.client import FeishuClient
from bot.feishu.ratelimit import Pacer, SlidingWindow
from bot.feishu_accounts import App, FeishuAccounts
from bot.linked_docs import LinkedDocs
from hub.errors import Unavailable
from hub.sealing import Sealer
from hub.state import State
from hub.user_tokens import UserTokens
from tests.conftest import until
from tests.fakes.feishu import FakeDocument, FakeFeishu

CONNECTIONS = 4
ROUNDS = 10
PNG = b"\x89PNG\r\n\x1a\n" + bytes(2048)


def unpaced() -> Pacer:
    # Pacing is not what is measured here: a hundred calls go as fast as the pool lets them.
    return Pacer(per_receiver=SlidingWindow(10_000, 1.0), app_wide=SlidingWindow(10_000, 1.0))


def client_of(fake: FakeFeishu) -> FeishuClient:
    settings = FeishuSettings(
        app_id=fake.app_id, app_secret=SecretStr(fake.app_secret), domain=fake.url
    )
    return FeishuClient(
        settings, backoff=lambda _state: 0.0, connections=CONNECTIONS, pacer=unpaced()
    )


async def test_a_hundred_mixed_calls_share_a_few_kept_alive_connections() -> None:
    async with FakeFeishu(app_id=f"cli_{uuid.uuid4().hex[:12]}") as fake:
        picture = fake.add_message("oc_pool", "look")
        fake.resources[(picture.message_id, "img_1")] = PNG
        client = client_of(fake)
        try:
            card = await client.send_card("oc_pool", {"n": 0})
            for round_ in range(ROUNDS):
                if round_ % 3 == 2:
                    # Feishu forgot every token: the calls fetch a new one, on the same pool.
                    fake.issued_tokens.clear()
                calls = [
                    *(client.send_card(f"oc_pool_{round_}_{n}", {"n": n}) for n in range(3)),
                    *(client.update_card(card.message_id, {"n": round_, "m": m}) for m in range(3)),
                    *(
                        client.message_resource(picture.message_id, "img_1", "image", limit=4096)
                        for _ in range(2)
                    ),
                    client.upload(f"notes-{round_}.txt", b"notes", image=False),
                    client.bot_info(),
                ]
                await asyncio.gather(*calls)
        finally:
            await client.close()
        assert len(fake.requests) >= 100
        assert len(fake.calls("POST", "tenant_access_token")) >= 4
        assert fake.messages[card.message_id].card["n"] == ROUNDS - 1
        assert 1 <= fake.connections <= CONNECTIONS


async def test_document_reads_and_the_device_flow_use_the_clients_pool(tmp_path: Path) -> None:
    async with FakeFeishu(app_id=f"cli_{uuid.uuid4().hex[:12]}") as fake:
        fake.documents["DocPlan0001"] = FakeDocument(
            "docx", "Release plan", "Ship on Friday.", readers={"ou_dave"}
        )
        client = client_of(fake)
        state = State(tmp_path / "state.sqlite3")
        try:
            dave = state.add_principal("dave")
            app = App(fake.app_id, fake.app_secret, fake.url)
            accounts = FeishuAccounts(
                UserTokens(state, Sealer(tmp_path)), app, "en_us", http=client.http
            )
            told: list[str] = []
            shown = await accounts.begin(dave, told.append)
            (code,) = [grant.user_code for grant in fake.device_grants.values()]
            assert code in shown
            fake.grant_device(code, "ou_dave")
            await until(lambda: told, seconds=20)
            documents = LinkedDocs(
                accounts.access_token,
                fake.url,
                "en_us",
                link_bytes=10_000,
                turn_bytes=20_000,
                http=client.http,
            )
            for _ in range(10):
                linked = await documents.read(
                    "see https://acme.feishu.cn/docx/DocPlan0001", dave.id
                )
                assert [d.markdown for d in linked.documents] == ["Ship on Friday."]
            await client.bot_info()
            await accounts.close()
        finally:
            await client.close()
            state.close()
        assert len(fake.document_reads) == 20
        assert 1 <= fake.connections <= CONNECTIONS


async def test_closing_the_client_closes_its_own_session_only() -> None:
    async with FakeFeishu(app_id=f"cli_{uuid.uuid4().hex[:12]}") as fake:
        own = client_of(fake)
        await own.bot_info()
        await own.close()
        assert own.http.is_closed

        settings = FeishuSettings(
            app_id=fake.app_id, app_secret=SecretStr(fake.app_secret), domain=fake.url
        )
        async with httpx.AsyncClient() as shared:
            lent = FeishuClient(settings, http=shared)
            await lent.bot_info()
            await lent.close()
            assert not shared.is_closed


async def test_calls_go_through_the_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with FakeFeishu(app_id=f"cli_{uuid.uuid4().hex[:12]}") as fake:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        async with FakeFeishu() as gone:
            dead_proxy = gone.url
        monkeypatch.setenv("HTTP_PROXY", dead_proxy)
        settings = FeishuSettings(
            app_id=fake.app_id, app_secret=SecretStr(fake.app_secret), domain=fake.url
        )
        proxied = FeishuClient(settings, attempts=2, backoff=lambda _state: 0.0)
        try:
            with pytest.raises(Unavailable):
                await proxied.bot_info()
        finally:
            await proxied.close()
        assert fake.requests == []

        monkeypatch.delenv("HTTP_PROXY")
        direct = FeishuClient(settings, attempts=2, backoff=lambda _state: 0.0)
        try:
            await direct.bot_info()
        finally:
            await direct.close()
        assert fake.requests
