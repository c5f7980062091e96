"""The Open pull request button on a project turn's result card, through the whole service: the
fake Feishu, the Hub's in-process worker running the stand-in ``project_agent.sh`` in the real
sandbox, real git, and a fake GitHub or GitLab on loopback."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from cards import actions
from runtime_bridge.checkouts import branch_of
from tests.bot.test_bot_flows import ALICE, BOB, Bot, buttons, card_text, running_bot
from tests.bot.test_project_results import bound_to_project, cards_sent, edit_runtime
from tests.conftest import until
from tests.fakes.forge import FakeForge
from tests.runtime_bridge.test_projects_e2e import operator_repo

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
]

TOKEN = "ghp_forgeTokenThatMustNeverShow0123456789"
WRONG = "ghp_aWrongTokenTheForgeEchoesBack987654321"


def pull_request_button(card: dict[str, Any]) -> dict[str, Any] | None:
    found = [value for value in buttons(card) if value.get("action") == actions.PULL_REQUEST]
    return found[0] if found else None


def everything_shown(bot: Bot, answers: list[dict[str, Any]]) -> str:
    return "\n".join([*cards_sent(bot), *(str(answer) for answer in answers)])


async def finished_turn(bot: Bot, text: str, root_id: str = "") -> tuple[str, str, dict[str, Any]]:
    """Send ``text`` (in the topic of ``root_id``) and wait for its result card's button; the
    message sent, the card's message and the card."""
    asked = await bot.say(text, root_id=root_id) if root_id else await bot.say(text)
    card = await bot.reply_to(asked)
    await until(lambda: pull_request_button(card.card) is not None, 120)
    return asked, card.message_id, card.card


@pytest.mark.parametrize("kind", ["github", "gitlab"])
async def test_the_button_opens_one_pull_request_and_later_turns_update_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    caplog.set_level(logging.DEBUG)
    answers: list[dict[str, Any]] = []
    async with (
        FakeForge(token=TOKEN) as forge,
        running_bot(tmp_path, runtime=edit_runtime(tmp_path)) as bot,
    ):
        await bound_to_project(bot, operator_repo(tmp_path / "web"))
        alice = bot.hub.people.principal(bot.ids["alice"])
        assert alice is not None
        await bot.hub.forges.set(
            "web", kind=kind, token=WRONG, by=alice.id, base_url=forge.url, repo="acme/web"
        )
        first, card_id, card = await finished_turn(bot, "write notes/plan.txt ship on Tuesday")
        button = pull_request_button(card)
        assert button is not None and "Open pull request" in card_text(card)

        # Someone who took no part in the conversation: refused, and the forge hears nothing.
        refused = await bot.click(button, BOB, message_id=card_id)
        answers.append(refused)
        assert refused["toast"]["type"] == "error"
        assert forge.calls == []

        # A token the forge refuses: the refusal is told, without the token it echoed.
        failed = await bot.click(button, ALICE, message_id=card_id)
        answers.append(failed)
        assert failed["toast"]["type"] == "error" and "401" in failed["toast"]["content"]

        await bot.hub.forges.set(
            "web", kind=kind, token=TOKEN, by=alice.id, base_url=forge.url, repo="acme/web"
        )
        opened = await bot.click(button, ALICE, message_id=card_id)
        answers.append(opened)
        assert opened["toast"]["type"] == "success", opened
        assert len(forge.pulls) == 1
        pull = next(iter(forge.pulls.values()))
        session = bot.session_of(first)
        assert session is not None
        branch = branch_of(session.id)
        if kind == "github":
            assert (pull["head"], pull["base"]) == (branch, "main")
            assert "the chat" in pull["body"]
        else:
            assert (pull["source_branch"], pull["target_branch"]) == (branch, "main")
            assert "the chat" in pull["description"]
        url = pull["html_url" if kind == "github" else "web_url"]
        # The topic is told where the pull request is.
        await until(lambda: any(url in sent for sent in cards_sent(bot)), 30)

        _, second_id, second = await finished_turn(
            bot, "write notes/plan.txt ship on Wednesday", root_id=first
        )
        # The next turn's card shows the pull request and offers to update it.
        assert url in card_text(second) and "Update pull request" in card_text(second)
        again = pull_request_button(second)
        assert again is not None
        updated = await bot.click(again, ALICE, message_id=second_id)
        answers.append(updated)
        assert updated["toast"]["type"] == "success", updated
        assert len(forge.pulls) == 1
        # Updated in place: the same one, its body now the later turn's answer.
        assert [c.method for c in forge.writes()][-1] == ("PATCH" if kind == "github" else "PUT")
        assert (
            next(iter(forge.pulls.values()))["title"] != ""
            and url
            == next(iter(forge.pulls.values()))["html_url" if kind == "github" else "web_url"]
        )

    shown = everything_shown(bot, answers)
    for token in (TOKEN, WRONG):
        assert token not in shown
        assert token not in caplog.text
