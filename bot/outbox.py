"""What the bot owes Feishu, kept durably: the turns it follows and the answers it must post.

Rules:

- A turn the bot follows is recorded (execution id, progress card, message replied to, title,
  start time) once its progress card is sent, so a restarted bot re-attaches to every unfinished
  turn and keeps its card updated to the end.
- A turn's final card(s) are recorded in the same transaction that forgets the follow, before the
  first attempt to post them (``synchronous=FULL``: the commit is fsynced), and are delivered
  in the order they were owed.
- A final card Feishu will not show in place (its message deleted, a card the bot may no longer
  update) is posted as a reply instead, so the answer is not lost with it.
- Delivery retries across Feishu outages and Hub restarts until Feishu accepts it. The client
  already retries rate limits (honouring their reset time), 5xx answers and connection errors; an
  item still failing waits (growing back-off, at most ``max_wait``) and is tried again. An item
  Feishu refuses for good, or one older than ``max_age`` (24 h), is logged and dropped, and
  ``dropped`` counts it. A card refused for good (too large, or a card Feishu will not take) is
  never dropped unseen: it is replaced, in the same entry, by a short plain-text notice in the
  topic (``refused_notice``) saying that a message of the turn could not be shown and how to
  get the answer; only when the notice too is refused is it dropped.
- Each reply carries a ``uuid`` fixed when it was owed, so a retry of a post that did land is
  not shown twice; replacing a card is idempotent by itself, and finishing a streaming card
  (CardKit) reuses the sequence and idempotency key fixed when it was owed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bot.feishu.errors import FeishuApiError
from cards.elements import Card
from hub import sqlite
from hub.errors import AmuxError, Unavailable
from hub.sqlite import Step

logger = logging.getLogger("amux.bot")

OUTBOX_FILE = "feishu-outbox.sqlite3"
MAX_AGE_SECONDS = 24 * 3600.0

# Version 1: the tables as the first version of this file created them. It created them with
# IF NOT EXISTS and never wrote user_version, so a file it left at version 0 holds them already.
_V1_TABLES = """
CREATE TABLE IF NOT EXISTS follows (
    execution_id TEXT PRIMARY KEY,
    progress_message_id TEXT NOT NULL,
    reply_to TEXT NOT NULL,
    title TEXT NOT NULL,
    started_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS owed (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    reply_to TEXT NOT NULL,
    card TEXT NOT NULL,
    uuid TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""
# The columns later versions added while the file was still unnumbered (each added when missing).
_V2_COLUMNS = (
    ("follows", "card_id", "TEXT NOT NULL DEFAULT ''"),
    ("owed", "card_id", "TEXT NOT NULL DEFAULT ''"),
    ("owed", "sequence", "INTEGER NOT NULL DEFAULT 0"),
    ("follows", "note", "TEXT NOT NULL DEFAULT ''"),
    ("follows", "topic", "TEXT NOT NULL DEFAULT ''"),
)


def _columns_added_before_versions(db: sqlite3.Connection) -> None:
    """Version 2: a file left at version 0 may have none, some or all of ``_V2_COLUMNS``."""
    for table, column, declaration in _V2_COLUMNS:
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")


MIGRATIONS: tuple[tuple[int, Step], ...] = (
    (1, _V1_TABLES),
    (2, _columns_added_before_versions),
)

# "card": show the card on the streaming card entity, else on ``target`` (the progress card),
# else post it as a reply to ``reply_to``; "reply": post it as a reply in the topic; "file":
# upload the file at ``path`` and post it in the topic; "text": post a plain-text reply in the
# topic. On disk a file's path is kept as ``{"path": …}`` in the ``card`` column, as every
# version of this file has kept it, and a text as ``{"text": …}``.
Kind = Literal["card", "reply", "file", "text"]
FinishCard = Callable[[str, Card], Awaitable[None]]
Reply = Callable[[str, Card, str], Awaitable[object]]
# (card_id, card, sequence, idempotency key): close streaming and replace the entity's card.
FinishEntity = Callable[[str, Card, int, str], Awaitable[None]]
# (reply_to, path, idempotency key): upload a file and post it in the topic.
PostFile = Callable[[str, str, str], Awaitable[None]]
# (reply_to, text, idempotency key): post a plain-text reply in the topic.
ReplyText = Callable[[str, str, str], Awaitable[object]]


@dataclass(frozen=True)
class Followed:
    execution_id: str
    progress_message_id: str
    reply_to: str
    title: str
    started_at: float
    card_id: str = ""
    # Something the card must say about this turn (e.g. that the topic's context was unavailable).
    note: str = ""
    # The topic (its first conversation's origin) the turn belongs to, for the card's controls.
    topic: str = ""


@dataclass(frozen=True)
class Owed:
    kind: Kind
    # What a "card" or "reply" shows; empty for a "file".
    card: Card = field(default_factory=dict)
    # For the "card" of a streaming card: the sequence its end is sent under.
    sequence: int = 0
    # For a "file": the file in the turn's workspace to upload and post.
    path: str = ""

    @classmethod
    def file(cls, path: str) -> Owed:
        return cls("file", path=path)

    def stored(self) -> Card:
        """What the ``card`` column holds for this entry."""
        return {"path": self.path} if self.kind == "file" else self.card


@dataclass(frozen=True)
class _Item:
    id: int
    kind: str
    target: str
    reply_to: str
    card: Card
    uuid: str
    created_at: float
    card_id: str
    sequence: int

    @property
    def path(self) -> str:
        """A "file" entry's path (see ``Owed.stored``)."""
        return str(self.card.get("path"))

    @property
    def text(self) -> str:
        """A "text" entry's text."""
        return str(self.card.get("text"))


class _StillFailing(Exception):
    """An owed item could not be delivered yet; the whole queue waits and tries again."""


class Outbox:
    """The durable follow list and reply queue, delivered by one background task."""

    def __init__(
        self,
        path: Path,
        finish_card: FinishCard,
        reply: Reply,
        finish_entity: FinishEntity,
        *,
        max_age: float = MAX_AGE_SECONDS,
        post_file: PostFile | None = None,
        max_wait: float = 30.0,
        clock: Callable[[], float] = time.time,
        dropped: Callable[[str], None] = lambda reason: None,
        reply_text: ReplyText | None = None,
        refused_notice: Callable[[str], str] | None = None,
    ) -> None:
        self._finish_card = finish_card
        self._reply_text = reply_text
        self._refused_notice = refused_notice
        self._reply = reply
        self._finish_entity = finish_entity
        self._post_file = post_file
        self._max_age = max_age
        self._max_wait = max_wait
        self._clock = clock
        self._dropped = dropped
        self._lock = threading.Lock()
        # An owed answer must survive a power cut once recorded: fsync every commit.
        self._db = sqlite.connect(path, durable=True)
        try:
            sqlite.migrate(self._db, path, MIGRATIONS, name="the Feishu outbox")
        except BaseException:
            self._db.close()
            raise
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- recording -------------------------------------------------------------------------

    def follow(self, followed: Followed) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO follows (execution_id, progress_message_id, reply_to, "
                "title, started_at, card_id, note, topic) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    followed.execution_id,
                    followed.progress_message_id,
                    followed.reply_to,
                    followed.title,
                    followed.started_at,
                    followed.card_id,
                    followed.note,
                    followed.topic,
                ),
            )

    def followed(self) -> list[Followed]:
        with self._lock:
            rows = self._db.execute(
                "SELECT execution_id, progress_message_id, reply_to, title, started_at, card_id, "
                "note, topic FROM follows ORDER BY started_at"
            ).fetchall()
        return [Followed(*row) for row in rows]

    def owe(self, followed: Followed, items: list[Owed]) -> None:
        """Record a finished turn's cards and forget its follow, in one fsynced transaction."""
        now = self._clock()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for item in items:
                    self._db.execute(
                        "INSERT INTO owed (kind, target, reply_to, card, uuid, created_at, "
                        "card_id, sequence) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            item.kind,
                            followed.progress_message_id,
                            followed.reply_to,
                            json.dumps(item.stored(), ensure_ascii=False),
                            str(uuid.uuid4()),
                            now,
                            followed.card_id,
                            item.sequence,
                        ),
                    )
                self._db.execute(
                    "DELETE FROM follows WHERE execution_id = ?", (followed.execution_id,)
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        self._idle.clear()
        self._wake.set()

    def pending(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM owed").fetchone()[0])

    # -- delivering ------------------------------------------------------------------------

    def start(self) -> None:
        self._wake.set()  # What an earlier process left owed goes out first.
        self._task = asyncio.get_running_loop().create_task(self._run(), name="feishu-outbox")

    async def stop(self, grace_seconds: float) -> None:
        """Give delivery ``grace_seconds`` to empty the queue; what is left stays owed on disk."""
        if self._task is None:
            return
        if self.pending():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace_seconds)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            # Until everything owed is delivered or given up: 1, 2, 4 s… apart, at most
            # ``max_wait``. A plain loop: the first try is every final card's path.
            failures = 0
            while True:
                try:
                    await self._deliver_owed()
                    break
                except _StillFailing:
                    failures += 1
                    await asyncio.sleep(min(self._max_wait, 2.0 ** min(failures - 1, 16)))
            if not self.pending():
                self._idle.set()

    def _items(self) -> list[_Item]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, kind, target, reply_to, card, uuid, created_at, card_id, sequence "
                "FROM owed ORDER BY id"
            ).fetchall()
        return [_Item(row[0], row[1], row[2], row[3], json.loads(row[4]), *row[5:]) for row in rows]

    def _done(self, item_id: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM owed WHERE id = ?", (item_id,))

    async def _deliver_owed(self) -> None:
        for item in self._items():
            if self._clock() - item.created_at > self._max_age:
                logger.error(
                    "giving up a Feishu reply owed since %.0f s ago (to message %s): too old",
                    self._clock() - item.created_at,
                    item.reply_to,
                )
                self._dropped("too_old")
                self._done(item.id)
                continue
            try:
                if item.kind == "file":
                    if self._post_file is None:
                        raise FeishuApiError("this bot posts no files", operation="file")
                    await self._post_file(item.reply_to, item.path, item.uuid)
                elif item.kind == "text":
                    if self._reply_text is None:
                        raise FeishuApiError("this bot posts no text", operation="reply")
                    await self._reply_text(item.reply_to, item.text, item.uuid)
                elif item.kind == "card" and item.card_id:
                    await self._finish_entity(item.card_id, item.card, item.sequence, item.uuid)
                elif item.kind == "card" and item.target:
                    await self._finish_card(item.target, item.card)
                else:
                    await self._reply(item.reply_to, item.card, item.uuid)
            except Unavailable as error:
                logger.warning("a Feishu reply stays owed and is retried: %s", error.message)
                raise _StillFailing() from None
            except AmuxError as error:
                if item.kind == "card" and (item.card_id or item.target):
                    # The card cannot be shown where it was (deleted, not the bot's any more):
                    # the answer still goes out, as a reply in the topic.
                    logger.warning("final card not shown in place (%s); replying", error.message)
                    self._as_reply(item.id)
                    await self._deliver_owed()
                    return
                notice = self._refused_notice
                if item.kind in ("card", "reply") and notice and self._reply_text is not None:
                    # The topic is told, rather than left waiting for an answer that never comes.
                    logger.error("Feishu refused an owed card (%s); telling why", error.message)
                    self._as_text(item.id, notice(error.message))
                    await self._deliver_owed()
                    return
                logger.error("Feishu refused an owed reply; dropping it: %s", error.message)
                self._dropped("refused")
            self._done(item.id)

    def _as_reply(self, item_id: int) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE owed SET kind = 'reply', target = '', card_id = '' WHERE id = ?", (item_id,)
            )

    def _as_text(self, item_id: int, text: str) -> None:
        # A fresh idempotency key: the refused card's never made a message.
        with self._lock:
            self._db.execute(
                "UPDATE owed SET kind = 'text', target = '', card_id = '', card = ?, uuid = ? "
                "WHERE id = ?",
                (json.dumps({"text": text}, ensure_ascii=False), str(uuid.uuid4()), item_id),
            )
