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
from tests.conftest import git, stand_in, until
from tests.fakes.feishu import CARD_LIMIT_BYTES
from tests.runtime_bridge.test_projects_e2e import AGENT, operator_repo

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
]


def edit_runtime(tmp_path: Path, workspace_max: str | None = None) -> RuntimeSettings:
    return RuntimeSettings(
        providers={"edit": str(stand_in(AGENT))},
        sandbox="bwrap",
        work_dir=tmp_path / "runtime",
        workspace_max=workspace_max,
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


async def test_a_sparse_file_of_gigabytes_is_named_not_committed_and_a_large_one_not_diffed(
    tmp_path: Path,
) -> None:
    # Under the default workspace bound (2G) no file may grow to 3 GiB at all.
    async with running_bot(tmp_path, runtime=edit_runtime(tmp_path, "4G")) as bot:
        await bound_to_project(bot, operator_repo(tmp_path / "web"))
        asked = await bot.say("sparse sparse.bin 3G\nfill table.csv 2M\nwrite notes.txt hello")
        progress = await bot.reply_to(asked)
        await until(lambda: "follows as a file" in card_text(progress.card), 120)
        await until(lambda: "sparse.bin" in shown_text(bot), 60)

        card = card_text(progress.card)
        assert "2 file(s) changed" in card
        assert "`notes.txt` +1 −0" in card and "`table.csv` over 1 MiB, not diffed" in card
        assert "`sparse.bin`" not in card
        # The file left off the branch is named, with its size, beside the answer.
        assert "too large (over 50 MiB each): sparse.bin (3 GiB)" in shown_text(bot)


def cards_sent(bot: Bot) -> list[str]:
    """Every card the bot sent Feishu, as the JSON each request carried."""
    sent: list[str] = []
    for call in bot.feishu.requests:
        body = call.body if isinstance(call.body, dict) else {}
        if body.get("msg_type") == "interactive":
            sent.append(str(body.get("content")))
        elif call.method == "PATCH" and "/im/v1/messages/" in call.path:
            sent.append(str(body.get("content")))
        elif call.path.endswith("/cardkit/v1/cards") or (
            call.method == "PUT" and call.path.count("/") == 5 and "/cardkit/" in call.path
        ):
            data = body.get("data") if "data" in body else (body.get("card") or {}).get("data")
            sent.append(str(data))
    return sent


async def test_a_turn_touching_many_long_paths_delivers_its_whole_answer_in_cards_that_fit(
    tmp_path: Path,
) -> None:
    repo = operator_repo(tmp_path / "web")
    readme = "".join(f"Line {n:04}: the release notes say {'word ' * 12}\n" for n in range(400))
    (repo / "README.md").write_text(readme)
    git("add", ".", cwd=repo)
    git(
        "-c",
        "user.name=op",
        "-c",
        "user.email=op@example.invalid",
        "commit",
        "-qm",
        "docs",
        cwd=repo,
    )
    long_dir = "/".join(letter * 150 for letter in "abcd")
    paths = [f"src/{long_dir}/module_{n:02}.py" for n in range(22)]
    prompt = "".join(f"write {path} x = {n}\n" for n, path in enumerate(paths)) + "show README.md"

    async with running_bot(tmp_path, runtime=edit_runtime(tmp_path)) as bot:
        await bound_to_project(bot, repo)
        asked = await bot.say(prompt)
        progress = await bot.reply_to(asked)
        await until(lambda: "Working" not in card_text(progress.card), 120)
        await until(lambda: "after: docs" in shown_text(bot), 60)

        delivered = shown_text(bot)
        missing = [line for line in readme.splitlines() if line not in delivered]
        assert missing == []
        # The first card lists the branch's files as far as its budget goes, and counts the rest.
        assert "22 file(s) changed" in card_text(progress.card)
        assert "more" in card_text(progress.card)
        # Nothing the bot sent was over Feishu's limit, so nothing was refused.
        assert max(len(card.encode()) for card in cards_sent(bot)) <= CARD_LIMIT_BYTES


def shown_text(bot: Bot) -> str:
    """What the bot's messages show now, their Markdown joined."""
    shown: list[str] = []
    for message in bot.feishu.messages.values():
        if message.sender_open_id or message.msg_type != "interactive":
            continue
        shown.extend(
            element.get("content", "")
            for element in message.card.get("body", {}).get("elements", [])
            if element.get("tag") == "markdown"
        )
    return "\n".join(shown)
