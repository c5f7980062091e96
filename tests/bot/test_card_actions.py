"""The card action table: who may click what, unknown and malformed clicks, and that every action
of the wire vocabulary is routed. Clicks go through the fake Feishu and lark-oapi, as users make
them; the table's own rules are also checked directly."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest

from bot.actions import ActionTable, Draft, no_value
from bot.feishu.events import CardResponse
from cards import actions
from hub.errors import InvalidArgument
from tests.bot.test_bot_flows import BOB, card_text, running_bot

pytestmark = pytest.mark.timeout(120)

# What a card of each owner-only action carries, so the refusal is not for want of fields.
DRAFT = {
    "memory_enabled": True,
    "isolation": True,
    "history_days": 7,
    "max_queued": 2,
    "messages_per_minute": 3,
    "permissions": "auto",
    "approval_timeout": 60,
}


def logged(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


@pytest.mark.parametrize("action", sorted(actions.OWNER_ONLY))
async def test_a_member_clicking_an_owner_only_action_gets_owner_only_and_nothing_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, action: str
) -> None:
    async with running_bot(tmp_path) as bot:
        before = bot.hub.config.saved()
        refused = await bot.card_after(dict(DRAFT, action=action), who=BOB)
        assert "Owner only" in card_text(refused)
        # Refused before the value is read: a forged value gets the same answer.
        forged = await bot.card_after({"action": action, "history_days": "abc"}, who=BOB)
        assert "Owner only" in card_text(forged)
        assert bot.hub.config.saved() == before
        assert not bot.hub.restart_requested.is_set()
    assert len(logged(caplog, f"refused owner-only card action {action} from bob")) == 2


async def test_an_action_this_version_does_not_know_is_logged_and_leaves_the_card(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path) as bot:
        assert await bot.click({"action": "memory.teleport", "path": "a.md"}) == {}
        assert await bot.click({"action": "memory.teleport"}, BOB) == {}
    assert len(logged(caplog, "unknown card action 'memory.teleport'")) == 2


async def test_a_malformed_value_is_refused_with_the_readable_error_card(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path) as bot:
        before = bot.hub.config.saved()
        for action in (actions.QUEUED_MAX, actions.SETTINGS_SAVE, actions.PERMISSIONS_SET):
            value = {"action": action, "max_queued": "lots", "permissions": "auto"}
            shown = card_text(await bot.card_after(value))
            assert "Something went wrong" in shown, action
            assert "turns.max_queued_per_principal:" in html.unescape(shown), action
        # Nothing of those clicks was saved, the live permission setting included.
        assert bot.hub.config.saved() == before
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


async def test_a_refused_toast_action_answers_with_an_error_toast(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        answer = await bot.click({"action": actions.RUN_CANCEL, "run_id": "exe_gone"})
        assert answer["toast"]["type"] == "error"
        assert answer["toast"]["content"]
        assert "card" not in answer


async def test_every_action_of_the_vocabulary_reaches_a_handler(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path) as bot:
        for action in sorted(actions.ALL):
            answer = await bot.click({"action": action})
            assert answer.get("card") or answer.get("toast"), action
    assert logged(caplog, "unknown card action") == []
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


async def test_the_table_routes_each_name_of_the_vocabulary_once() -> None:
    async def handler(click: Any, value: None) -> CardResponse:
        return CardResponse(toast="done")

    table = ActionTable("en_us")
    table.toast(actions.RUN_CANCEL, no_value, handler)
    with pytest.raises(ValueError, match="routed twice"):
        table.card(actions.RUN_CANCEL, no_value, handler)
    with pytest.raises(ValueError, match="unknown card action"):
        table.toast("run.teleport", no_value, handler)
    assert table.names == {actions.RUN_CANCEL}


def test_a_draft_keeps_what_an_older_card_lacks_and_refuses_a_forged_number() -> None:
    assert Draft.parse({"memory_enabled": "yes", "history_days": 7}) == Draft(
        None, None, 7, None, None
    )
    with pytest.raises(InvalidArgument, match="feishu.messages_per_minute"):
        Draft.parse({"messages_per_minute": -1})
