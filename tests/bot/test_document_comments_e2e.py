"""Talking to the Agent in a Feishu document's comments, through a real `amux serve`.

Enrollment is closed; Dave is the owner (he claims the Hub in his private chat), Erin is nobody.
The Agent is a stand-in that answers with its prompt (``tests/fakes/echo_agent.sh``), so a reply
in the thread shows what reached it. Signed ``drive.notice.comment_add_v1`` events go to the
webhook; the fake Feishu keeps the comment threads and the bot's replies in them.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.comments import MAX_REPLY_CHARS
from tests.bot.test_linked_documents_e2e import said_anywhere
from tests.bot.test_message_kinds_e2e import APP, CHAT, Bot, signer
from tests.bot.test_topic_context import fenced
from tests.conftest import HubProcess, free_port, stand_in, until
from tests.fakes.feishu import FakeComment, FakeDocument, FakeFeishu, FakeReply

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

DOC = "DocPlan0001"
DAVE_IDS = {"author_open_id": "ou_dave", "author_union_id": "on_dave", "author_user_id": "u_dave"}


@contextlib.asynccontextmanager
async def closed_bot(tmp_path: Path, claimed: bool = True) -> AsyncIterator[Bot]:
    """The bot with enrollment closed and Dave as its owner, claimed in his private chat
    (unless not ``claimed``)."""
    async with FakeFeishu(app_id=APP) as feishu:
        hub = HubProcess(
            tmp_path / "amux-home",
            free_port(),
            extra_env={
                "AMUX_FEISHU_APP_ID": APP,
                "AMUX_FEISHU_APP_SECRET": "secret",
                "AMUX_FEISHU_ENCRYPT_KEY": signer.encrypt_key,
                "AMUX_FEISHU_VERIFICATION_TOKEN": signer.verification_token,
                "AMUX_FEISHU_DOMAIN": feishu.url,
                "AMUX_FEISHU_LANGUAGE": "en_us",
                "AMUX_FEISHU_PROVIDER": "echo",
                "AMUX_FEISHU_ENROLL": "closed",
                "AMUX_RUNTIME_PROVIDERS": json.dumps({"echo": str(stand_in("echo_agent.sh"))}),
                "AMUX_RUNTIME_SANDBOX": "off",
            },
        )
        await asyncio.to_thread(hub.start)
        try:
            async with aiohttp.ClientSession() as http:
                await until(lambda: feishu.calls("GET", "/bot/v3/info"))
                bot = Bot(hub, feishu, http)
                if not claimed:
                    yield bot
                    return
                code = await until(lambda: re.search(r"/amux claim ([0-9a-f]+)", hub.log()))
                words = f"/amux claim {code.group(1)}"
                claim = feishu.add_message(CHAT, words, sender_open_id="ou_dave")
                await bot.send(claim, "text", {"text": words})
                await until(lambda: bot.answered(claim.message_id, "owner"))
                yield bot
        finally:
            await asyncio.to_thread(hub.stop)


async def deliver(bot: Bot, comment: FakeComment, reply: FakeReply, **author: str) -> None:
    payload = signer.comment(comment.file_token, comment.comment_id, reply.reply_id, **author)
    body, headers = signer.sign(payload)
    url = f"{bot.hub.url}/feishu/events"
    async with bot.http.post(url, data=io.BytesIO(body), headers=headers) as response:
        assert response.status == 200


def bot_replies(bot: Bot, comment: FakeComment) -> list[str]:
    return [r.text for r in comment.replies if r.user_id == bot.feishu.bot_open_id]


def turns(bot: Bot) -> list[dict[str, Any]]:
    """Every turn, oldest first: its Session, whom it runs as and who asked, and its prompt."""
    db = sqlite3.connect(f"file:{bot.hub.home / 'state.sqlite3'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        rows = db.execute(
            "SELECT e.session_id, e.runs_as, e.submitted_by, e.prompt, s.principal_id, s.origin "
            "FROM executions e JOIN sessions s ON s.id = e.session_id ORDER BY e.created_at"
        )
        return [dict(row) for row in rows]
    finally:
        db.close()


def principal_of(bot: Bot, union_id: str) -> str:
    db = sqlite3.connect(f"file:{bot.hub.home / 'state.sqlite3'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT principal_id FROM aliases WHERE value = ?", (union_id,)).fetchone()
        return str(row[0])
    finally:
        db.close()


async def test_a_comment_mention_runs_as_its_author_and_is_answered_in_its_thread(
    tmp_path: Path,
) -> None:
    async with closed_bot(tmp_path) as bot:
        feishu = bot.feishu
        feishu.user_names.update({"ou_carol": "Carol Chen", "ou_dave": "Dave"})
        feishu.documents[DOC] = FakeDocument(
            "docx",
            "Release plan",
            "We ship on Friday.\nFreeze on Thursday.",
            readers={"ou_dave"},
            app_may_read=True,
        )
        comment = feishu.add_comment(
            DOC,
            "We ship on Friday.",
            "Friday is too early",
            author_open_id="ou_carol",
            mention_bot=False,
        )
        asked = feishu.add_comment_reply(
            comment, "is the date in this passage realistic?", author_open_id="ou_dave"
        )
        await deliver(bot, comment, asked, **DAVE_IDS)

        (answer,) = await until(lambda: bot_replies(bot, comment) or None)
        dave = principal_of(bot, "on_dave")
        (turn,) = turns(bot)
        # Dave's turn, in a conversation of its own for this thread.
        assert turn["runs_as"] == turn["submitted_by"] == turn["principal_id"] == dave
        assert turn["origin"] == f"feishu-comment:{DOC}:{comment.comment_id}"
        shown = fenced(turn["prompt"])
        # The commented passage and Carol's earlier reply are data inside the fence; Dave's
        # words, without the bot's mention, are the request after it.
        assert shown.records == [
            {"quote": "We ship on Friday."},
            {"from": "Carol Chen", "open_id": "ou_carol", "text": "Friday is too early"},
        ]
        assert "comment thread" in shown.preamble
        assert shown.after.endswith("is the date in this passage realistic?")
        assert "Friday is too early" not in shown.after
        # The stand-in answered with its prompt: the answer is the bot's reply in the thread.
        assert "is the date in this passage realistic?" in answer
        assert "We ship on Friday." in answer
        # Dave has not connected his account: the document itself is read by nobody, though
        # the bot's app could.
        assert feishu.document_reads == []

        # Once he has, it is read as him, and only as him.
        connect = feishu.add_message(CHAT, "/amux connect", sender_open_id="ou_dave")
        await bot.send(connect, "text", {"text": "/amux connect"})
        code = await until(lambda: said_anywhere(bot, r"code (UC-\d+)"))
        feishu.grant_device(code.group(1), "ou_dave")
        await until(lambda: said_anywhere(bot, "account is connected"))
        (dave_token,) = feishu.user_tokens_of("ou_dave")

        # A reply in the thread that mentions the bot continues the same conversation, with
        # only what the Agent has not seen yet.
        feishu.add_comment_reply(
            comment, "Thursday then", author_open_id="ou_carol", mention_bot=False
        )
        again = feishu.add_comment_reply(
            comment, "and with a Thursday freeze?", author_open_id="ou_dave"
        )
        await deliver(bot, comment, again, **DAVE_IDS)
        await until(lambda: len(bot_replies(bot, comment)) == 2 or None)
        first, second = turns(bot)
        assert second["session_id"] == first["session_id"]
        assert second["submitted_by"] == dave
        shown = fenced(second["prompt"])
        document = shown.records.pop()
        assert shown.records == [
            {"quote": "We ship on Friday."},
            {"from": "Carol Chen", "open_id": "ou_carol", "text": "Thursday then"},
        ]
        assert document["title"] == "Release plan"
        assert "Freeze on Thursday." in str(document["text"])
        assert {bearer for _, bearer in feishu.document_reads} == {dave_token}
        assert shown.after.endswith("and with a Thursday freeze?")
        # Every reply of the thread was posted with the bot's own token.
        posts = feishu.calls("POST", f"/comments/{comment.comment_id}/replies")
        assert len(posts) == 2
        assert all(
            p.headers["Authorization"].removeprefix("Bearer ") in feishu.issued_tokens
            for p in posts
        )
        assert all(p.query == {"file_type": "docx"} for p in posts)


async def test_a_long_answer_goes_to_the_private_chat_and_a_stranger_runs_nothing(
    tmp_path: Path,
) -> None:
    async with closed_bot(tmp_path) as bot:
        feishu = bot.feishu
        long = "Explain each step. " + "step " * (MAX_REPLY_CHARS // 5) + "THE-END"
        comment = feishu.add_comment(DOC, "Rollout plan", long, author_open_id="ou_dave")
        await deliver(bot, comment, comment.replies[0], **DAVE_IDS)

        (note,) = await until(lambda: bot_replies(bot, comment) or None)
        assert note.startswith("The answer is longer than a comment reply takes")

        def in_private_chat(words: str) -> str | None:
            for message in list(feishu.messages.values()):
                if message.chat_id == CHAT and not message.sender_open_id:
                    shown = json.dumps(message.card, ensure_ascii=False)
                    if words in shown:
                        return shown
            return None

        card = await until(lambda: in_private_chat("THE-END"))
        assert "Answer to your comment" in card

        # A whole-document comment takes no reply: its answer goes to the private chat alone.
        whole = feishu.add_comment(DOC, "", "summarise WHOLE-DOC please", author_open_id="ou_dave")
        whole.is_whole = True
        await deliver(bot, whole, whole.replies[0], **DAVE_IDS)
        await until(lambda: in_private_chat("WHOLE-DOC"))
        assert bot_replies(bot, whole) == []

        # Erin is no member and enrollment is closed: a short reply, and nothing runs.
        stranger = feishu.add_comment(DOC, "Budget", "run rm -rf for me", author_open_id="ou_erin")
        await deliver(
            bot,
            stranger,
            stranger.replies[0],
            author_open_id="ou_erin",
            author_union_id="on_erin",
            author_user_id="u_erin",
        )
        (refusal,) = await until(lambda: bot_replies(bot, stranger) or None)
        assert refusal.startswith("This Hub does not accept new members")
        assert len(turns(bot)) == 2


async def test_a_claim_code_in_a_comment_is_burnt_and_runs_nothing(tmp_path: Path) -> None:
    async with closed_bot(tmp_path, claimed=False) as bot:
        code = await until(lambda: re.search(r"/amux claim ([0-9a-f]+)", bot.hub.log()))
        comment = bot.feishu.add_comment(
            DOC, "Budget", f"/amux claim {code.group(1)}", author_open_id="ou_erin"
        )
        ids = {"author_open_id": "ou_erin", "author_union_id": "on_erin", "author_user_id": ""}
        await deliver(bot, comment, comment.replies[0], **ids)
        (said,) = await until(lambda: bot_replies(bot, comment) or None)
        assert said.startswith("A claim code was posted here, where others can read it")
        # A new code is offered in the log; the one the document's readers saw no longer works.
        await until(lambda: len(re.findall(r"/amux claim ([0-9a-f]+)", bot.hub.log())) == 2)
        assert turns(bot) == []
