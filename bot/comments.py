"""Feishu document comments as conversations: @mention the bot in a comment, get the answer as
a reply in the same thread.

A comment (or a reply in a comment thread) that @mentions the bot is a turn of its author, who
must be a member as any sender of a message must (``BotSink.on_comment``). One Session per
thread (``comment_origin``): a later reply in the thread that mentions the bot continues it.
The thread is shared like a group topic, with a workspace of its own (``topic_workspace``);
under memory isolation a thread stays its starter's.

What the Agent is given, inside the untrusted-data fence (``bot.topic_context.with_context``):
the passage the thread comments on (the comment's ``quote``), the thread's replies by people
since the bot's last answer in it, and, when the author connected their Feishu account, the
document itself read as them (``bot.linked_docs``), never as the bot. The thread is read with
the bot's token through the comment API, which shows only the thread; the reply is posted with
it too, since the bot is the one replying.

A reply holds at most ``MAX_REPLY_CHARS``: a longer answer goes to the author's private chat
with the bot as result cards, and the reply says so.

Each submitted turn is owed its answer in ``CommentTurns`` until it is posted: a restarted bot
follows every turn still owed (``resume``) and answers it in its thread then.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bot.conversations import topic_workspace, with_sender
from bot.feishu.client import FeishuClient
from bot.feishu.events import CommentEvent
from bot.linked_docs import Linked, LinkedDocs
from bot.topic_context import TopicContext, TopicMessage, select, with_context
from cards.catalogue import plain_text
from cards.models import Lang
from cards.progress import result_cards
from cards.times import DEFAULT_TIME_ZONE
from hub import sqlite
from hub.contract import CANCELLED, SUCCEEDED, Execution
from hub.errors import AmuxError
from hub.principals import Principal
from hub.services import Hub
from hub.sqlite import Step

logger = logging.getLogger("amux.bot")

# Feishu takes up to 10,000 characters in a reply; an answer past this bound reads better as a
# card in the private chat than as a wall of text beside the document.
MAX_REPLY_CHARS = 3000
# The replies of a thread read for one turn (a thread longer than this is rare).
MAX_THREAD_REPLIES = 200
WATCH_SECONDS = 20.0
# The commented passage given to the Agent: a comment may be on a whole section.
MAX_QUOTE_BYTES = 8 * 1024
# Where the document itself is read from as its author: the link a person would share.
_LINK_KINDS = {"docx": "docx", "sheet": "sheets", "bitable": "base"}
_DOCUMENT_HOST = "https://www.feishu.cn"

Reach = Callable[[str], tuple[Literal["chat_id", "open_id", "union_id"], str] | None]


def comment_origin(event: CommentEvent) -> str:
    """The conversation a comment thread is: one Session per document and thread."""
    return f"feishu-comment:{event.conversation_key}"


def reply_text(reply: dict[str, Any], bot_open_id: str, names: dict[str, str]) -> str:
    """What a comment reply says, as plain text: its text runs and links, other people's
    mentions as ``@name``, the bot's own mention left out."""
    content = reply.get("content")
    elements = content.get("elements") if isinstance(content, dict) else None
    parts: list[str] = []
    for element in elements if isinstance(elements, list) else []:
        if not isinstance(element, dict):
            continue
        kind = element.get("type")
        if kind == "text_run":
            parts.append(str((element.get("text_run") or {}).get("text") or ""))
        elif kind == "docs_link":
            parts.append(str((element.get("docs_link") or {}).get("url") or ""))
        elif kind == "person":
            who = str((element.get("person") or {}).get("user_id") or "")
            if who and who != bot_open_id:
                parts.append("@" + (names.get(who) or "user …" + who[-6:]))
    return "".join(parts).strip()


@dataclass(frozen=True)
class Thread:
    """What a turn reads of its comment thread: the commented passage, the request (the reply
    that mentions the bot) and the people's replies the Agent has not seen yet."""

    quote: str
    request: str
    earlier: tuple[TopicMessage, ...]
    names: tuple[tuple[str, str], ...]


def thread_of(
    comment: dict[str, Any],
    replies: list[dict[str, Any]],
    event: CommentEvent,
    bot_open_id: str,
    names: dict[str, str],
) -> Thread | None:
    """The thread as a turn sees it; None when the reply the event names is not in it.

    The replies since the bot's last answer, people's only, are the unseen ones: the Session
    remembers the rest. The reply that asks is ``event.reply_id``, else the author's latest.
    """
    author = event.author.open_id
    wanted = event.reply_id
    position = next(
        (i for i, r in enumerate(replies) if wanted and r.get("reply_id") == wanted), None
    )
    if position is None and not event.reply_id:
        position = next(
            (i for i in range(len(replies) - 1, -1, -1) if replies[i].get("user_id") == author),
            None,
        )
    if position is None:
        return None
    answered = max(
        (i for i in range(position) if bot_open_id and replies[i].get("user_id") == bot_open_id),
        default=-1,
    )
    # Positions stand for times: the listing is in the thread's order.
    listed = [
        TopicMessage(
            str(reply.get("reply_id") or ""),
            str(reply.get("user_id") or ""),
            reply_text(reply, bot_open_id, names),
            index + 1,
        )
        for index, reply in enumerate(replies)
        if reply.get("user_id") != bot_open_id
    ]
    earlier = select(
        [m for m in listed if m.text],
        after_ms=answered + 1,
        exclude=str(replies[position].get("reply_id") or ""),
        until_ms=position + 1,
    )
    senders = {m.sender_open_id for m in earlier}
    quote = str(comment.get("quote") or "").encode()
    return Thread(
        quote=quote[:MAX_QUOTE_BYTES].decode(errors="ignore"),
        request=reply_text(replies[position], bot_open_id, names),
        earlier=earlier,
        names=tuple(sorted((k, v) for k, v in names.items() if k in senders)),
    )


COMMENTS_FILE = "feishu-comments.sqlite3"
_V1_OWED = """
CREATE TABLE owed (
    execution_id TEXT PRIMARY KEY,
    file_token TEXT NOT NULL,
    file_type TEXT NOT NULL,
    comment_id TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    request TEXT NOT NULL,
    at REAL NOT NULL
);
"""
MIGRATIONS: tuple[tuple[int, Step], ...] = ((1, _V1_OWED),)


@dataclass(frozen=True)
class Owed:
    """A comment turn whose answer is not posted yet: where it goes and whose it is."""

    execution_id: str
    file_token: str
    file_type: str
    comment_id: str
    principal_id: str
    request: str


class CommentTurns:
    """The comment turns owed an answer, kept across restarts."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        # Durable: an answer forgotten to a power cut would never be posted.
        self._db = sqlite.connect(path, durable=True)
        try:
            sqlite.migrate(self._db, path, MIGRATIONS, name="the Feishu comment turns file")
        except BaseException:
            self._db.close()
            raise

    def owe(self, owed: Owed) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO owed VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    owed.execution_id,
                    owed.file_token,
                    owed.file_type,
                    owed.comment_id,
                    owed.principal_id,
                    owed.request,
                    time.time(),
                ),
            )

    def paid(self, execution_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM owed WHERE execution_id = ?", (execution_id,))

    def owed(self) -> list[Owed]:
        with self._lock:
            rows = self._db.execute(
                "SELECT execution_id, file_token, file_type, comment_id, principal_id, request "
                "FROM owed ORDER BY at"
            ).fetchall()
        return [Owed(*(str(value) for value in row)) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class DocumentComments:
    """Runs the turns document comments ask for and answers them in their threads."""

    def __init__(
        self,
        hub: Hub,
        client: FeishuClient,
        *,
        lang: Lang,
        bot_open_id: Callable[[], str],
        provider_of: Callable[[str], str],
        reach: Reach,
        turns: CommentTurns,
        documents: LinkedDocs | None = None,
        zone: str = DEFAULT_TIME_ZONE,
    ) -> None:
        self._turns = turns
        self._resumed: set[asyncio.Task[Execution | None]] = set()
        self._hub = hub
        self._client = client
        self._lang = lang
        self._bot_open_id = bot_open_id
        self._provider_of = provider_of
        self._reach = reach
        self._documents = documents
        self._zone = zone

    async def tell(self, event: CommentEvent | Owed, key: str, **fields: str) -> None:
        """A short reply of the bot's in the thread; one Feishu refuses is logged."""
        said = plain_text(self._lang, key, **fields)
        try:
            await self._client.reply_comment(
                event.file_token, event.file_type, event.comment_id, said
            )
        except AmuxError as error:
            logger.warning("comment %s got no reply: %s", event.comment_id, error.message)

    def resume(self) -> int:
        """Follow again every comment turn an earlier process left owed; returns how many."""
        owed = self._turns.owed()
        for turn in owed:
            task = asyncio.get_running_loop().create_task(
                self._settle(turn), name=f"feishu-comment-{turn.execution_id}"
            )
            self._resumed.add(task)
            task.add_done_callback(self._resumed.discard)
        if owed:
            logger.info("following %d comment turns again after a restart", len(owed))
        return len(owed)

    async def stop(self) -> None:
        """Stop following resumed turns; they stay owed for the next process."""
        for task in list(self._resumed):
            task.cancel()
        await asyncio.gather(*self._resumed, return_exceptions=True)

    async def handle(
        self,
        event: CommentEvent,
        sender: Principal | None,
        burnt: Callable[[str], bool] = lambda text: False,
    ) -> Execution | None:
        """Run the turn ``event`` asks for as ``sender`` and answer it in its thread; the
        finished turn, None when nothing ran. Without a ``sender`` (someone who is no member)
        nothing runs and the thread is told; ``burnt`` says whether what the reply says held
        the owner claim code, which a document's readers have now seen."""
        thread = await self._read(event)
        if thread is None:
            return None
        if burnt(thread.request):
            await self.tell(event, "claim.burnt")
            return None
        if sender is None:
            logger.info("a comment of someone who is no member ran nothing")
            await self.tell(event, "notice.enrollment_closed")
            return None
        if not thread.request:
            await self.tell(event, "comment.empty")
            return None
        origin = comment_origin(event)
        executions = self._hub.executions
        session = executions.session_by_origin(origin)
        if session is not None and session.principal_id != sender.id and self._hub.config.isolation:
            # As a group topic: under isolation a conversation runs with its starter's memory.
            await self.tell(event, "comment.own_thread")
            return None
        linked = await self._document(event, sender)
        prompt = with_context(
            with_sender(thread.request, sender),
            TopicContext(thread.earlier, thread.names),
            (),
            self._zone,
            [document.line() for document in linked.documents],
            quote=thread.quote,
        )
        try:
            submitted, session = await executions.submit(
                principal_id=session.principal_id if session is not None else sender.id,
                submitted_by=sender.id,
                provider=session.provider if session is not None else self._provider_of(""),
                prompt=prompt,
                origin=origin,
                workspace=topic_workspace(origin),
            )
        except AmuxError as error:
            logger.info("a comment turn of %s was refused: %s", sender.label, error.message)
            await self.tell(event, "comment.refused", reason=error.message)
            return None
        logger.info("comment %s runs turn %s for %s", event.comment_id, submitted.id, sender.label)
        owed = Owed(
            submitted.id,
            event.file_token,
            event.file_type,
            event.comment_id,
            sender.id,
            thread.request,
        )
        self._turns.owe(owed)
        return await self._settle(owed)

    async def _settle(self, owed: Owed) -> Execution | None:
        """Follow an owed turn to its end and post its answer; the finished turn."""
        finished = await self._finish(owed.execution_id)
        if finished is None and self._hub.executions.closing:
            # The Hub restarts: the next process follows the turn (``resume``).
            return None
        if finished is not None:
            await self._answer(owed, finished)
        # Answered, or gone from the Hub (a fresh state directory): owed no longer.
        self._turns.paid(owed.execution_id)
        return finished

    async def _read(self, event: CommentEvent) -> Thread | None:
        """The thread as the turn sees it; None (and the author told) when it cannot be read."""
        client = self._client
        try:
            comment = await client.comment(event.file_token, event.file_type, event.comment_id)
            replies = await client.comment_replies(
                event.file_token, event.file_type, event.comment_id, MAX_THREAD_REPLIES
            )
        except AmuxError as error:
            logger.warning("comment %s could not be read: %s", event.comment_id, error.message)
            await self.tell(event, "comment.unreadable", reason=error.message)
            return None
        bot = self._bot_open_id()
        people = sorted(
            {str(r.get("user_id")) for r in replies if r.get("user_id") and r.get("user_id") != bot}
        )
        try:
            names = await client.user_names(people)
        except AmuxError as error:
            # Names are a courtesy: without the contact scope the thread still goes out.
            logger.info("comment authors' names unavailable: %s", error.message)
            names = {}
        thread = thread_of(comment, replies, event, bot, names)
        if thread is None:
            # Deleted since, or not listed yet: nothing to answer.
            logger.info("reply %s is not in comment %s", event.reply_id, event.comment_id)
        return thread

    async def _document(self, event: CommentEvent, sender: Principal) -> Linked:
        """The commented document read as its author, when they connected their account."""
        kind = _LINK_KINDS.get(event.file_type)
        if self._documents is None or kind is None:
            return Linked()
        linked = await self._documents.read(
            f"{_DOCUMENT_HOST}/{kind}/{event.file_token}", sender.id
        )
        for unread in linked.unread:
            # The thread and its passage are enough to answer from.
            logger.info("a commented document was not read as its author: %s", unread)
        return linked

    async def _finish(self, execution_id: str) -> Execution | None:
        """The turn once it has finished; None when the Hub no longer knows it, or is
        closing for a restart."""
        after = 0
        while True:
            try:
                watched = await self._hub.executions.watch(execution_id, after, WATCH_SECONDS)
            except AmuxError as error:
                logger.warning("stopped following %s: %s", execution_id, error.message)
                return None
            after = max(after, watched.last_seq)
            if watched.execution.finished:
                return watched.execution
            if self._hub.executions.closing:
                return None

    async def _answer(self, event: Owed, execution: Execution) -> None:
        text = execution.result.text if execution.result is not None else None
        if execution.state == CANCELLED:
            await self.tell(event, "comment.stopped")
            return
        if execution.state != SUCCEEDED or text is None:
            reason = execution.error or "the Agent ended without an answer"
            await self.tell(event, "comment.failed", reason=reason)
            return
        answer = text.strip()
        if len(answer) <= MAX_REPLY_CHARS:
            try:
                await self._client.reply_comment(
                    event.file_token, event.file_type, event.comment_id, answer
                )
                return
            except AmuxError as error:
                # A whole-document or resolved comment takes no reply: the private chat does.
                logger.warning("comment %s took no answer: %s", event.comment_id, error.message)
                await self._privately(event, answer)
                return
        if await self._privately(event, answer):
            await self.tell(event, "comment.long")
            return
        cut = plain_text(self._lang, "comment.cut")
        kept = answer[: MAX_REPLY_CHARS - len(cut) - 2].rstrip()
        try:
            await self._client.reply_comment(
                event.file_token, event.file_type, event.comment_id, f"{kept}\n\n{cut}"
            )
        except AmuxError as error:
            logger.warning("comment %s took no answer: %s", event.comment_id, error.message)

    async def _privately(self, event: Owed, answer: str) -> bool:
        """Send the whole answer to its person's private chat with the bot as result cards;
        whether all of them went out."""
        target = self._reach(event.principal_id)
        if target is None:
            return False
        kind, receiver = target
        first = event.request.splitlines()[0][:60] if event.request else ""
        title = plain_text(self._lang, "comment.title") + ": " + first
        try:
            for card in result_cards(answer, self._lang, title=title):
                await self._client.send_card(receiver, card, kind)
        except AmuxError as error:
            logger.warning(
                "a comment's answer did not reach %s: %s", event.principal_id, error.message
            )
            return False
        return True
