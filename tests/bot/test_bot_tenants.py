"""Whose events the bot acts on: only its own app's and tenant's, and only ids that agree.

A user_id is unique only inside one tenant, and its admins choose it: a signed event from another
tenant naming the owner's user_id must not be the owner. The bot of ``test_bot_flows`` (real
lark-oapi against the fake Feishu, real Hub); the aliases are read back with ``amux principal
show``, as an operator would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_bot_card_settings import save_button
from tests.bot.test_bot_flows import (
    ALICE,
    APP_ID,
    BOB,
    Bot,
    Who,
    as_operator,
    card_text,
    private_chat,
    running_bot,
    signer,
)
from tests.conftest import until
from tests.fakes.feishu_events import FeishuSigner
from tests.hub.test_admin_cli import admin

pytestmark = pytest.mark.timeout(120)

# Feishu signs for this app whichever tenant an event comes from; the tenant is in the event.
elsewhere = FeishuSigner(
    encrypt_key=signer.encrypt_key,
    verification_token=signer.verification_token,
    app_id=APP_ID,
    tenant_key="tenant_elsewhere",
)
other_app = FeishuSigner(
    encrypt_key=signer.encrypt_key,
    verification_token=signer.verification_token,
    app_id="cli_someone_else",
)
# Someone whose admins gave them the owner's user_id.
NAMESAKE: Who = {
    "sender_open_id": "ou_namesake",
    "sender_union_id": "on_namesake",
    "sender_user_id": ALICE["sender_user_id"],
}


def aliases_of(tmp_path: Path, name: str) -> list[dict[str, str]]:
    shown = admin(tmp_path / "amux-home", "principal", "show", "--json", name)
    assert shown.returncode == 0, shown.stderr
    aliases: list[dict[str, str]] = json.loads(shown.stdout)["aliases"]
    return aliases


async def post_signed(bot: Bot, by: FeishuSigner, payload: dict[str, Any]) -> dict[str, Any]:
    body, headers = by.sign(payload)
    response = await bot.client.post("/feishu/events", data=body, headers=headers)
    assert response.status == 200
    answer: dict[str, Any] = await response.json(content_type=None)
    return answer


async def say_as(bot: Bot, by: FeishuSigner, text: str, who: Who) -> str:
    stored = bot.feishu.add_message(private_chat(who), text)
    payload = by.message(
        text, **who, chat_id=stored.chat_id, chat_type="p2p", message_id=stored.message_id
    )
    await post_signed(bot, by, payload)
    return stored.message_id


async def click_as(bot: Bot, by: FeishuSigner, value: dict[str, Any], who: Who) -> dict[str, Any]:
    payload = by.card_action(value, **as_operator(who), open_chat_id=private_chat(who))
    return await post_signed(bot, by, payload)


async def owner_card(bot: Bot) -> dict[str, Any]:
    """Alice opens her `/amux` card, which also records her Feishu ids."""
    asked = await bot.say("/amux")
    card: dict[str, Any] = (await bot.reply_to(asked)).card
    assert "Save" in card_text(card)
    return card


def executions(bot: Bot) -> int:
    return int(bot.hub.executions.db.execute("SELECT count(*) FROM executions").fetchone()[0])


async def test_another_tenants_event_with_the_owners_user_id_is_refused_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path) as bot:
        card = await owner_card(bot)
        before = aliases_of(tmp_path, "alice")
        assert {"kind": "feishu:tenant_1:user_id", "value": "u_a"} in before
        principals = bot.principal_names()
        turn_on_memory = dict(save_button(card), memory_enabled=True)

        asked = await say_as(bot, elsewhere, "/amux", NAMESAKE)
        prompted = await say_as(bot, elsewhere, "delete the repository", NAMESAKE)
        clicked = await click_as(bot, elsewhere, turn_on_memory, NAMESAKE)
        await bot.idle()

        assert clicked == {}, "no card, no toast"
        assert bot.feishu.calls("POST", f"{asked}/reply") == []
        assert bot.feishu.calls("POST", f"{prompted}/reply") == []
        assert executions(bot) == 0
        assert bot.hub.config.saved()["memory.enabled"] is False
        assert aliases_of(tmp_path, "alice") == before
        assert bot.principal_names() == principals
        refusals = [r.getMessage() for r in caplog.records if "tenant_elsewhere" in r.getMessage()]
        assert len(refusals) == 3
        assert all("refused a Feishu event from tenant" in line for line in refusals)

        # The same click from the owner's own tenant saves.
        saved = await bot.card_after(turn_on_memory)
        assert "Restart now" in card_text(saved)
        assert bot.hub.config.saved()["memory.enabled"] is True


async def test_an_event_for_another_app_is_refused(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        await owner_card(bot)
        before = aliases_of(tmp_path, "alice")
        asked = await say_as(bot, other_app, "/amux", ALICE)
        await bot.idle()
        assert bot.feishu.calls("POST", f"{asked}/reply") == []
        assert aliases_of(tmp_path, "alice") == before


async def test_ids_that_name_two_people_or_differ_from_the_known_ones_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path) as bot:
        await owner_card(bot)
        opened = await bot.say("/amux", BOB)
        await bot.reply_to(opened)
        alice, bob = aliases_of(tmp_path, "alice"), aliases_of(tmp_path, "bob")
        principals = bot.principal_names()

        # Bob's union_id with Alice's user_id: two Principals in one event.
        mixed = dict(BOB, sender_user_id=ALICE["sender_user_id"])
        asked = await bot.say("/amux", mixed)
        refusal = card_text((await bot.reply_to(asked)).card)
        assert "cannot tell who you are" in refusal
        (line,) = [
            r.getMessage() for r in caplog.records if "belong to principals" in r.getMessage()
        ]
        assert bot.ids["alice"] in line and bot.ids["bob"] in line

        # The owner's user_id, given by an admin to someone new (their own open_id and union_id).
        asked = await bot.say("take over the owner's memory", NAMESAKE)
        assert "cannot tell who you are" in card_text((await bot.reply_to(asked)).card)
        (line,) = [r.getMessage() for r in caplog.records if "differ from those" in r.getMessage()]
        assert bot.ids["alice"] in line and "union_id, open_id" in line
        clicked = await bot.click({"action": "manage.open"}, who=NAMESAKE)
        assert clicked["toast"]["type"] == "error" and "card" not in clicked

        await bot.idle()
        assert executions(bot) == 0
        assert (aliases_of(tmp_path, "alice"), aliases_of(tmp_path, "bob")) == (alice, bob)
        assert bot.principal_names() == principals

        # Alice herself is still Alice.
        again = await bot.say("/amux")
        await until(lambda: bot.replies_to(again))
        assert "alice" in card_text((await bot.reply_to(again)).card)
