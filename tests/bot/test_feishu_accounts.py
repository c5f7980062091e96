"""A person connects their own Feishu account from their private chat (`/amux connect`), so
documents they link can be read as them; `/amux disconnect` revokes it at Feishu and erases
what the Hub kept.

The whole service in-process with signed events to its webhook, as ``test_bot_flows`` runs it,
and the fake Feishu's device flow standing in for Feishu's."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from bot.feishu.app_manifest import USER_SCOPES
from bot.feishu_accounts import App, FeishuAccounts
from cards import actions
from hub.user_tokens import UserToken
from tests.bot.test_bot_flows import (
    ALICE,
    APP_ID,
    BOB,
    GROUP,
    Bot,
    buttons,
    card_text,
    private_chat,
    running_bot,
)
from tests.conftest import until

pytestmark = pytest.mark.timeout(120)


def text_of(bot: Bot, message_id: str) -> str:
    return str(json.loads(bot.feishu.messages[message_id].content)["text"])


def sent_to(bot: Bot, chat_id: str) -> list[str]:
    """The texts the bot sent (not replied) into ``chat_id``, oldest first."""
    return [
        json.loads(call.body["content"])["text"]
        for call in bot.feishu.calls("POST", "/open-apis/im/v1/messages")
        if call.body and call.body.get("receive_id") == chat_id and call.body["msg_type"] == "text"
    ]


async def connect(bot: Bot) -> str:
    """Bob sends `/amux connect` and grants the code it shows; the text that says so."""
    asked = await bot.say("/amux connect", BOB)
    shown = text_of(bot, (await bot.reply_to(asked)).message_id)
    found = re.search(r"code (UC-\d+)", shown)
    assert found is not None, shown
    assert f"{bot.feishu.url}/verify" in shown
    bot.feishu.grant_device(found.group(1), BOB["sender_open_id"])
    told: list[str] = await until(lambda: sent_to(bot, private_chat(BOB)))
    return told[-1]


async def test_a_member_connects_their_account_and_the_hub_keeps_only_their_token(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        told = await connect(bot)
        assert "connected" in told and "docx:document:readonly" in told

        (issued,) = bot.feishu.user_tokens_of(BOB["sender_open_id"])
        token = bot.hub.user_tokens.token(bot.ids["bob"])
        assert token is not None and token.access_token == issued
        # Feishu was asked for reading documents and nothing more.
        (started,) = bot.feishu.calls("POST", "/oauth/device_authorization")
        assert started.body["scope"].split() == list(USER_SCOPES)
        # The token shows nowhere in the chat.
        assert all(issued not in m.content for m in bot.feishu.messages.values())
        assert bot.hub.user_tokens.token(bot.ids["alice"]) is None


async def test_disconnect_revokes_the_token_at_feishu_and_erases_it(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        await connect(bot)
        held = bot.hub.user_tokens.token(bot.ids["bob"])
        assert held is not None and held.refresh_token is not None
        asked = await bot.say("/amux disconnect", BOB)
        answer = text_of(bot, (await bot.reply_to(asked)).message_id)
        assert "disconnected" in answer and "revoked" in answer
        # Feishu no longer honours either token: not to read with, not to refresh with.
        assert set(bot.feishu.revoked_tokens) == {held.access_token, held.refresh_token}
        assert bot.feishu.user_tokens_of(BOB["sender_open_id"]) == []
        assert held.refresh_token not in bot.feishu.user_refresh_tokens
        assert bot.hub.user_tokens.token(bot.ids["bob"]) is None
        assert bot.hub.user_tokens.connection(bot.ids["bob"]) is None
        # The app asked as itself: its own id and secret, never the person's token alone.
        (first, _) = bot.feishu.calls("POST", "/oauth/v1/revoke")
        assert b"client_secret=" in first.body and APP_ID.encode() in first.body


async def test_a_revoke_feishu_refuses_still_erases_the_token_and_the_card_says_so(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        await connect(bot)
        bot.feishu.revoke_refused = True
        gone = await bot.card_after({"action": actions.FEISHU_DISCONNECT}, who=BOB)
        shown = card_text(gone)
        assert "did not confirm revoking" in shown and "HTTP 500" in shown
        assert "not connected" in shown
        assert bot.hub.user_tokens.token(bot.ids["bob"]) is None
        assert bot.feishu.revoked_tokens == []


async def test_a_kept_token_that_no_longer_opens_is_erased_and_said_unrevoked(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        await connect(bot)
        # Bob's sealed row copied onto Alice's Principal: bound to Bob's id, it never opens.
        await bot.hub.state.write(
            lambda db: db.execute(
                "INSERT INTO user_tokens (principal_id, sealed, scopes, connected_at, updated_at)"
                " SELECT ?, sealed, scopes, connected_at, updated_at FROM user_tokens"
                " WHERE principal_id = ?",
                (bot.ids["alice"], bot.ids["bob"]),
            )
        )
        assert bot.hub.user_tokens.connection(bot.ids["alice"]) is not None
        gone = await bot.card_after({"action": actions.FEISHU_DISCONNECT}, who=ALICE)
        assert "did not confirm revoking it (amux could not open it)" in card_text(gone)
        assert bot.hub.user_tokens.connection(bot.ids["alice"]) is None
        assert bot.feishu.revoked_tokens == []


async def test_connecting_is_refused_in_a_group(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        asked = await bot.say("/amux connect", BOB, group=True, mention=True)
        assert "private chat" in text_of(bot, (await bot.reply_to(asked)).message_id)
        assert bot.feishu.calls("POST", "/oauth/device_authorization") == []


async def test_the_amux_card_connects_shows_the_scopes_and_disconnects(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        asked = await bot.say("/amux", BOB)
        shown = (await bot.reply_to(asked)).card
        assert "not connected" in card_text(shown)
        assert {"action": actions.FEISHU_CONNECT} in buttons(shown)

        # A card clicked in a group never starts a connect: whoever reads the code would own it.
        refused = await bot.card_after({"action": actions.FEISHU_CONNECT}, who=BOB, chat_id=GROUP)
        assert "private chat" in card_text(refused)
        assert bot.feishu.calls("POST", "/oauth/device_authorization") == []

        started = await bot.card_after({"action": actions.FEISHU_CONNECT}, who=BOB)
        found = re.search(r"code (UC-\d+)", card_text(started))
        assert found is not None
        bot.feishu.grant_device(found.group(1), BOB["sender_open_id"])
        await until(lambda: sent_to(bot, private_chat(BOB)))
        again = await bot.card_after({"action": actions.MANAGE_OPEN}, who=BOB)
        assert "docx:document:readonly" in card_text(again)
        assert {"action": actions.FEISHU_DISCONNECT} in buttons(again)
        (issued,) = bot.feishu.user_tokens_of(BOB["sender_open_id"])
        assert issued not in card_text(again)

        gone = await bot.card_after({"action": actions.FEISHU_DISCONNECT}, who=BOB)
        assert "not connected" in card_text(gone)
        assert bot.hub.user_tokens.token(bot.ids["bob"]) is None


async def test_an_expired_token_is_refreshed_as_its_owner_and_a_refused_refresh_reads_nothing(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        # Feishu's tokens last two hours; these are inside the refresh margin from the start.
        bot.feishu.user_token_expire = 30
        await connect(bot)
        granted = bot.hub.user_tokens.token(bot.ids["bob"])
        assert granted is not None
        accounts = FeishuAccounts(
            bot.hub.user_tokens, App(APP_ID, bot.feishu.app_secret, bot.feishu.url), "en_us"
        )

        bot.feishu.user_token_expire = 7200
        # Two links read at once refresh once, and both read.
        fresh, same = await asyncio.gather(
            accounts.access_token(bot.ids["bob"]), accounts.access_token(bot.ids["bob"])
        )
        assert fresh is not None and fresh != granted.access_token
        assert same == fresh
        assert bot.feishu.user_access_tokens[fresh] == BOB["sender_open_id"]
        (refresh,) = bot.feishu.calls("POST", "/oauth/token")[-1:]
        assert refresh.body["refresh_token"] == granted.refresh_token
        kept = bot.hub.user_tokens.token(bot.ids["bob"])
        assert kept is not None and kept.access_token == fresh
        assert kept.scopes == granted.scopes

        # Feishu no longer honours the grant (revoked in Feishu): nothing to read with.
        bot.feishu.user_refresh_tokens.clear()
        expired = UserToken(fresh, kept.refresh_token, time.time() - 1, None, kept.scopes)
        await bot.hub.user_tokens.store(bot.ids["bob"], expired)
        assert await accounts.access_token(bot.ids["bob"]) is None


def test_tokens_are_revoked_at_the_accounts_site_of_the_apps_own_platform() -> None:
    assert App("a", "s", "https://open.feishu.cn").accounts == "https://accounts.feishu.cn"
    assert App("a", "s", "https://open.larksuite.com/").accounts == "https://accounts.larksuite.com"
    # A proxy or stand-in in front of both sites is asked itself.
    assert App("a", "s", "http://127.0.0.1:8123").accounts == "http://127.0.0.1:8123"
