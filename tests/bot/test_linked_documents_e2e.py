"""Feishu documents linked in a message, read as its sender, through a real `amux serve`.

The Agent is a stand-in that answers with its prompt (``tests/fakes/echo_agent.sh``). A member
who connected their account (`/amux connect`, the fake's device flow) has their links read with
their own user token, and the Markdown reaches the prompt inside the fence; a link they may not
open is refused even though the bot's app could read it; a member who has not connected (or
disconnected) gets one line saying how to fix it, and nothing is read at all.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.bot.test_message_kinds_e2e import CHAT, Bot, running_bot
from tests.bot.test_topic_context import fenced
from tests.conftest import until
from tests.fakes.feishu import FakeDocument, docx_blocks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PLAN = "https://acme.feishu.cn/docx/DocPlan0001"
WIKI = "https://acme.feishu.cn/wiki/WikiNode0001"
SECRET = "https://acme.feishu.cn/docx/DocSecret001"
DESIGN = "https://acme.feishu.cn/docx/DocDesign001"
NOTES = "https://acme.feishu.cn/docx/DocNotes0001"
HANDBOOK = "https://acme.feishu.cn/docx/DocHandbook1"
BASE = "https://acme.feishu.cn/base/BaseTasks001"


async def say(bot: Bot, words: str) -> str:
    stored = bot.feishu.add_message(CHAT, words, sender_open_id="ou_dave")
    return await bot.send(stored, "text", {"text": words})


def said_anywhere(bot: Bot, pattern: str) -> re.Match[str] | None:
    for message in list(bot.feishu.messages.values()):
        if message.sender_open_id:
            continue
        found = re.search(pattern, message.content or "")
        if found is not None:
            return found
    return None


async def connect_dave(bot: Bot) -> None:
    await say(bot, "/amux connect")
    code = await until(lambda: said_anywhere(bot, r"code (UC-\d+)"))
    bot.feishu.grant_device(code.group(1), "ou_dave")
    await until(lambda: said_anywhere(bot, "account is connected"))


async def test_links_are_read_as_their_sender_and_only_as_them(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        feishu = bot.feishu
        feishu.documents["DocPlan0001"] = FakeDocument(
            "docx", "Release plan", "Ship on Friday.\nFreeze on Thursday.", readers={"ou_dave"}
        )
        feishu.documents["ShtBudget01"] = FakeDocument(
            "sheet", "Budget", [["item", "cost"], ["servers", 120]], readers={"ou_dave"}
        )
        feishu.wiki_nodes["WikiNode0001"] = ("sheet", "ShtBudget01")
        feishu.documents["BaseTasks001"] = FakeDocument(
            "bitable",
            "Tasks",
            [{"Task": [{"type": "text", "text": "Write notes"}], "Owner": "Dave", "Done": False}],
            readers={"ou_dave"},
        )
        # Alice's, which the bot's app could read too: Dave may not.
        feishu.documents["DocSecret001"] = FakeDocument(
            "docx", "Salaries", "alice-only-figures", readers={"ou_alice"}, app_may_read=True
        )

        # Not connected: one line says how to fix it, and nothing is read, as anyone.
        asked = await say(bot, f"Summarise {PLAN}")
        shown = await until(lambda: bot.answered(asked, "/amux connect"))
        assert PLAN in shown
        assert feishu.document_reads == []
        assert "Ship on Friday" not in bot.prompts()[0]

        asked = await say(bot, "/amux connect")
        code = await until(lambda: said_anywhere(bot, r"code (UC-\d+)"))
        feishu.grant_device(code.group(1), "ou_dave")
        await until(lambda: said_anywhere(bot, "account is connected"))
        (dave_token,) = feishu.user_tokens_of("ou_dave")

        asked = await say(bot, f"Compare {PLAN} with {WIKI}, {BASE} and {SECRET}")
        await until(lambda: bot.answered(asked, "Freeze on Thursday"))
        refused = await until(lambda: bot.answered(asked, "Not read: "))
        assert f"Not read: {SECRET} (Feishu code 1770032" in refused
        fence = fenced(bot.prompts()[-1])
        documents = {r["title"]: r for r in fence.records if "document" in r}
        assert documents["Release plan"]["text"] == "Ship on Friday.\nFreeze on Thursday."
        assert documents["Release plan"]["url"] == PLAN
        assert documents["Release plan"]["revision"] == "7"
        assert documents["Budget"]["text"].splitlines()[2] == "| servers | 120 |"
        assert documents["Tasks"]["text"].splitlines() == [
            "| Task | Owner | Done |",
            "| --- | --- | --- |",
            "| Write notes | Dave | False |",
        ]
        assert "Salaries" not in documents
        assert "alice-only-figures" not in bot.prompts()[-1]
        assert "Request:" in bot.prompts()[-1].split(fence.marker)[-1]
        # Every document call carried Dave's own token, never the app's.
        assert feishu.document_reads
        assert {bearer for _, bearer in feishu.document_reads} == {dave_token}

        # The state database holds it sealed.
        state = bot.hub.home / "state.sqlite3"
        for path in state.parent.glob("state.sqlite3*"):
            assert dave_token.encode() not in path.read_bytes(), path

        asked = await say(bot, "/amux disconnect")
        await until(lambda: said_anywhere(bot, "account is disconnected"))
        reads = len(feishu.document_reads)
        asked = await say(bot, f"Again {PLAN}")
        shown = await until(lambda: bot.answered(asked, "/amux connect"))
        assert len(feishu.document_reads) == reads
        assert json.dumps(PLAN)[1:-1] in shown


async def test_a_docx_reaches_the_prompt_as_markdown_from_its_blocks(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        feishu = bot.feishu
        feishu.documents["DocDesign001"] = FakeDocument(
            "docx",
            "Design",
            "flattened text the blocks improve on",
            readers={"ou_dave"},
            blocks=docx_blocks(
                "DocDesign001",
                ("h1", "Storage"),
                ("text", "Keep `state.sqlite3` small."),
                ("bullet", "Tables", [("bullet", "sessions"), ("bullet", "turns")]),
                ("ordered", "Migrate"),
                ("ordered", "Vacuum"),
                ("code", 49, "db.execute('VACUUM')\n"),
                ("table", [["Table", "Rows"], ["sessions", "120"]]),
            ),
        )
        # Its blocks cannot be listed (Feishu errs): its plain text is read instead.
        feishu.documents["DocNotes0001"] = FakeDocument(
            "docx", "Notes", "plain notes", readers={"ou_dave"}
        )
        await connect_dave(bot)
        feishu.fail_next(1, status=500, code=1770001, path_contains="DocNotes0001/blocks")

        asked = await say(bot, f"Review {DESIGN} and {NOTES}")
        await until(lambda: bot.answered(asked, "Vacuum"))
        fence = fenced(bot.prompts()[-1])
        documents = {r["title"]: r for r in fence.records if "document" in r}
        assert documents["Design"]["text"] == (
            "# Storage\n\n"
            "Keep `state.sqlite3` small.\n\n"
            "- Tables\n  - sessions\n  - turns\n1. Migrate\n2. Vacuum\n\n"
            "```python\ndb.execute('VACUUM')\n```\n\n"
            "| Table | Rows |\n| --- | --- |\n| sessions | 120 |"
        )
        # The blocks came in pages, every page read.
        pages = feishu.calls("GET", "DocDesign001/blocks")
        assert len(pages) > 1 and pages[1].query["page_token"]
        assert documents["Notes"]["text"] == "plain notes"
        assert feishu.calls("GET", "DocNotes0001/raw_content")


async def test_a_document_longer_than_its_bound_is_saved_for_the_agent_to_read(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        # Longer than the 32 KiB a link may put in the prompt.
        lines = [f"Rule {n}: keep the build green." for n in range(1, 1501)]
        bot.feishu.documents["DocHandbook1"] = FakeDocument(
            "docx", "Team handbook", "\n".join([*lines, "THE LAST RULE"]), readers={"ou_dave"}
        )
        await connect_dave(bot)

        asked = await say(bot, f"Follow {HANDBOOK}")
        shown = await until(lambda: bot.answered(asked, "THE LAST RULE"))
        prompt = bot.prompts()[-1]
        (document,) = [r for r in fenced(prompt).records if "document" in r]
        path = document["file"]
        assert re.fullmatch(r"inbox/[A-Za-z0-9_-]+/feishu/Team-handbook-DocHandbook1\.md", path)
        # The prompt holds the beginning; the Agent read the end from the file it names.
        assert document["truncated"] is True
        assert document["text"].startswith("Rule 1: keep the build green.\nRule 2:")
        assert len(document["text"].encode()) <= 2048
        assert "THE LAST RULE" not in prompt
        assert f"Read {path}, ending: THE LAST RULE" in shown
