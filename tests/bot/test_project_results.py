"""What a project conversation's results look like in the chat, through the whole service: the
real lark-oapi client against the fake Feishu (which refuses a card over Feishu's size limit, as
Feishu does), the Hub's in-process worker running the stand-in ``project_agent.sh`` in the real
sandbox, and real git."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runtime_bridge.config import RuntimeSettings
from tests.bot.test_bot_flows import ALICE, Bot, card_text, private_chat, running_bot
from tests.conftest import until
from tests.runtime_bridge.test_projects_e2e import AGENT, operator_repo

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
]


def edit_runtime(tmp_path: Path) -> RuntimeSettings:
    return RuntimeSettings(
        providers={"edit": str(AGENT)}, sandbox="bwrap", work_dir=tmp_path / "runtime"
    )


async def bound_to_project(bot: Bot, repo: Path) -> None:
    """Alice's private chat bound to the project ``web`` on ``repo``, run by the stand-in."""
    await bot.hub.projects.add("web", by=bot.ids["alice"], path=str(repo), provider="edit")
    bound = await bot.say("/amux project bind web", ALICE)
    await bot.reply_to(bound)
    assert bot.hub.projects.binding_of(private_chat(ALICE)) is not None


def files_posted(bot: Bot, message_id: str) -> list[str]:
    """The file messages the bot posted in reply to ``message_id``."""
    return [
        str(call.body.get("content"))
        for call in bot.feishu.calls("POST", f"/messages/{message_id}/reply")
        if call.body.get("msg_type") == "file"
    ]


async def test_a_project_turn_that_changed_nothing_posts_no_diff_file_again(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, runtime=edit_runtime(tmp_path)) as bot:
        await bound_to_project(bot, operator_repo(tmp_path / "web"))
        first = await bot.say("write notes/plan.txt ship on Tuesday")
        progress = await bot.reply_to(first)
        await until(lambda: "follows as a file" in card_text(progress.card), 120)
        await until(lambda: files_posted(bot, first), 60)

        again = await bot.say("just look around", root_id=first)
        answer = await bot.reply_to(again)
        await until(lambda: "after: " in card_text(answer.card), 120)
        # The branch is as the first turn left it: the card says so, and no copy of the same
        # diff follows.
        assert "the same as the last one posted" in card_text(answer.card)
        assert "follows as a file" not in card_text(answer.card)

        changed = await bot.say("write notes/plan.txt ship on Wednesday", root_id=first)
        await until(lambda: files_posted(bot, changed), 120)
        # The outbox delivers in the order things were owed: the second turn owed no file.
        assert files_posted(bot, again) == []
        assert len(files_posted(bot, first)) == 1
