"""Catch-up: messages sent while the bot could not hear them, listed and handled once.

Feishu does not redeliver what was sent while the long connection was down or reconnecting, or
while the Hub was stopped. So the bot keeps, per chat and topic it serves, the creation time of
the newest message it saw (``feishu-catchup.sqlite3``). When the connection is back, and when the
Hub starts, it lists the messages of the most recently active chats and topics from where each
had got to when the bot stopped hearing (``im.v1.message.list``, oldest first), and hands each to
the dispatcher as an event parsed like a live one: the message-id de-duplication decides whether
it ran already (a live delivery, even a late one, and its listed copy run once), and the sink
applies every rule it applies to a live message.

Bounded: the ``catch_up_chats`` most recently active chats and topics, ``catch_up_pages`` pages
of each, and never further back than ``catch_up_max_age_seconds`` nor the de-duplication's
retention (what says a listed message already ran), nor before the bot started following the
chat (messages from before were handled, or not, by a version without this record).

A listed message older than ``catch_up_window_seconds`` is not run: the sink answers it with a
note whose button its sender (or the owner) may press once to run it (:meth:`CatchUp.take`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from bot.config import FeishuSettings
from bot.feishu.client import FeishuClient
from bot.feishu.dispatcher import EventDispatcher
from bot.feishu.errors import FeishuApiError
from bot.feishu.events import MESSAGE_RECEIVE, MalformedEvent, MessageEvent, parse_event
from bot.feishu.liveness import LinkHealth, LinkState
from hub import sqlite
from hub.errors import AmuxError
from hub.sqlite import Step

logger = logging.getLogger(__name__)

CATCH_UP_FILE = "feishu-catchup.sqlite3"
# The event ids catch-up gives listed messages, and a late message run from its note.
CAUGHT_UP = "catchup:"
RUN_LATE = "late:"
PAGE_SIZE = 50
# Looks this far before the newest message seen, for one delivered out of order around a drop.
SLACK_MS = 60_000
# Notes of late messages are kept this long; a button older than that does nothing.
LATE_KEPT_SECONDS = 7 * 24 * 3600

_V1 = """
CREATE TABLE containers (
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    chat_type TEXT NOT NULL,
    tenant_key TEXT NOT NULL,
    app_id TEXT NOT NULL,
    since_ms INTEGER NOT NULL,
    last_ms INTEGER NOT NULL,
    PRIMARY KEY (kind, id)
);
CREATE INDEX containers_last_ms ON containers (last_ms);
CREATE TABLE late (
    message_id TEXT PRIMARY KEY,
    payload TEXT NOT NULL,
    note_id TEXT NOT NULL DEFAULT '',
    principal_id TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX late_note_id ON late (note_id);
"""
MIGRATIONS: tuple[tuple[int, Step], ...] = ((1, _V1),)

Kind = Literal["chat", "thread"]
Refusal = Literal["unknown", "not_yours", "done"]


@dataclass(frozen=True)
class Container:
    """A chat or topic the bot serves, and how far it had heard it."""

    kind: Kind
    id: str
    chat_id: str
    chat_type: str
    tenant_key: str
    app_id: str
    since_ms: int
    last_ms: int


class CatchUpStore:
    """Where each chat and topic had got to, and the late messages' notes; SQLite, durable."""

    def __init__(self, path: Path | str, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # Durable: a note's button must not run its message twice after a power cut.
        self._db = sqlite.connect(path, durable=True)
        try:
            sqlite.migrate(self._db, path, MIGRATIONS, name="the Feishu catch-up file")
            self._db.execute("DELETE FROM late WHERE at < ?", (self._clock() - LATE_KEPT_SECONDS,))
        except BaseException:
            self._db.close()
            raise

    def saw(self, event: MessageEvent) -> None:
        """Note ``event``'s chat (and topic) as heard up to its creation time."""
        heard = event.create_time_ms or int(self._clock() * 1000)
        places: list[tuple[Kind, str]] = [("chat", event.chat_id)]
        if event.thread_id:
            places.append(("thread", event.thread_id))
        with self._lock:
            for kind, place in places:
                self._db.execute(
                    "INSERT INTO containers VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT(kind, id) DO UPDATE SET last_ms = max(last_ms, excluded.last_ms), "
                    "chat_type = excluded.chat_type, tenant_key = excluded.tenant_key, "
                    "app_id = excluded.app_id",
                    (
                        kind,
                        place,
                        event.chat_id,
                        event.chat_type,
                        event.tenant_key,
                        event.app_id,
                        # Followed from this message on: one older than the first seen may have
                        # been handled by a version that kept no such record.
                        heard,
                        heard,
                    ),
                )

    def recent(self, count: int) -> list[Container]:
        """The ``count`` chats and topics heard most recently, most recent first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT kind, id, chat_id, chat_type, tenant_key, app_id, since_ms, last_ms "
                "FROM containers ORDER BY last_ms DESC LIMIT ?",
                (count,),
            ).fetchall()
        return [Container(*row) for row in rows]

    def listed_late(self, message_id: str, payload: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO late (message_id, payload, state, at) "
                "VALUES (?, ?, 'listed', ?)",
                (message_id, json.dumps(payload), self._clock()),
            )

    def hold(self, message_id: str, note_id: str, principal_id: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE late SET state = 'held', note_id = ?, principal_id = ? "
                "WHERE message_id = ? AND state = 'listed'",
                (note_id, principal_id, message_id),
            )

    def take(self, note_id: str, clicker_id: str, is_owner: bool) -> dict[str, Any] | Refusal:
        """The payload of the message ``note_id`` answers, marked as run; or why not."""
        with self._lock:
            row = self._db.execute(
                "SELECT message_id, payload, principal_id, state FROM late WHERE note_id = ?",
                (note_id,),
            ).fetchone()
            if row is None or not note_id:
                return "unknown"
            message_id, payload, principal_id, state = row
            if state != "held":
                return "done"
            if principal_id != clicker_id and not is_owner:
                return "not_yours"
            cursor = self._db.execute(
                "UPDATE late SET state = 'run' WHERE message_id = ? AND state = 'held'",
                (message_id,),
            )
            if cursor.rowcount != 1:
                return "done"
        loaded: dict[str, Any] = json.loads(payload)
        return loaded

    def close(self) -> None:
        with self._lock:
            self._db.close()


def listed_payload(
    item: dict[str, Any], place: Container, app_id: str, bot_open_id: str
) -> dict[str, Any] | None:
    """A listed message as the ``im.message.receive_v1`` event Feishu would have pushed, or None
    for one not to handle (the bot's or another app's, recalled, malformed)."""
    message_id = item.get("message_id")
    sender = item.get("sender")
    if not isinstance(message_id, str) or not message_id or not isinstance(sender, dict):
        return None
    if sender.get("sender_type") != "user" or item.get("deleted"):
        return None
    body = item.get("body")
    content = body.get("content") if isinstance(body, dict) else ""
    mentions = []
    for mention in item.get("mentions") or []:
        if not isinstance(mention, dict):
            continue
        ids = _ids(mention.get("id"), mention.get("id_type"))
        if mention.get("id_type") == "app_id" and mention.get("id") == app_id:
            ids = {"open_id": bot_open_id}  # The bot itself, named by its app.
        mentions.append(
            {
                "key": mention.get("key", ""),
                "name": mention.get("name", ""),
                "id": ids,
                "tenant_key": mention.get("tenant_key", ""),
            }
        )
    return {
        "schema": "2.0",
        "header": {
            "event_id": CAUGHT_UP + message_id,
            "event_type": MESSAGE_RECEIVE,
            "create_time": str(item.get("create_time") or ""),
            "tenant_key": place.tenant_key,
            "app_id": place.app_id,
        },
        "event": {
            "sender": {
                "sender_id": _ids(sender.get("id"), sender.get("id_type")),
                "sender_type": "user",
                "tenant_key": sender.get("tenant_key") or place.tenant_key,
            },
            "message": {
                "message_id": message_id,
                "root_id": item.get("root_id") or "",
                "parent_id": item.get("parent_id") or "",
                "thread_id": item.get("thread_id") or "",
                "create_time": str(item.get("create_time") or ""),
                "chat_id": item.get("chat_id") or place.chat_id,
                "chat_type": place.chat_type,
                "message_type": item.get("msg_type") or "",
                "content": content or "",
                "mentions": mentions,
            },
        },
    }


def _ids(value: Any, id_type: Any) -> dict[str, str]:
    if not isinstance(value, str) or id_type not in ("open_id", "union_id", "user_id"):
        return {}
    return {str(id_type): value}


class CatchUp:
    """Lists and hands on what was missed, when the link comes back and when the Hub starts."""

    def __init__(
        self,
        settings: FeishuSettings,
        store: CatchUpStore,
        client: FeishuClient,
        dispatcher: EventDispatcher,
        ready: asyncio.Event,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._store = store
        self._client = client
        self._dispatcher = dispatcher
        # The bot's own identity: without it a group message's mention of it cannot be read.
        self._ready = ready
        self._clock = clock
        self._window_ms = settings.catch_up_window_seconds * 1000
        self._max_age_ms = (
            min(settings.catch_up_max_age_seconds, settings.dedup_hours * 3600) * 1000
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        # Where each chat had got to when the bot stopped hearing; None while it hears. At start
        # the bot has heard nothing since the last process.
        self._frozen: list[Container] | None = store.recent(settings.catch_up_chats)
        self._tasks: set[asyncio.Task[None]] = set()
        # How many listed messages were handed on (tests, the log).
        self.caught_up = 0
        # Every message handled, delivered or listed, moves its chat's (and topic's) mark.
        dispatcher.seen = store.saw

    def listen(self, health: LinkHealth) -> None:
        """Catch up whenever the long connection is (re)connected; call on the main loop."""
        self._loop = asyncio.get_running_loop()
        health.on_change = self._link_changed

    def _link_changed(self, state: LinkState) -> None:
        # Called on the connection's thread.
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._on_link, state)
        except RuntimeError:
            pass  # The loop closed meanwhile: the process is stopping.

    def _on_link(self, state: LinkState) -> None:
        if state == "connected":
            self.start()
        elif self._frozen is None:
            self._frozen = self._store.recent(self._settings.catch_up_chats)

    def start(self) -> None:
        """Catch up from where the bot stopped hearing (nothing when it never stopped)."""
        frozen, self._frozen = self._frozen, None
        if not frozen:
            return
        task = asyncio.get_running_loop().create_task(self._run(frozen), name="feishu-catch-up")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def idle(self) -> None:
        """Wait for the catch-ups under way (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self, places: list[Container]) -> None:
        await self._ready.wait()
        before = self.caught_up
        refused = 0
        for place in places:
            try:
                await self._catch_up(place)
            except AmuxError as error:
                if isinstance(error, FeishuApiError) and error.missing_scope:
                    refused += 1  # Said once below, for all of them.
                    continue
                logger.warning(
                    "could not list what was missed in %s %s: %s",
                    place.kind,
                    place.id,
                    error.message,
                )
        if refused:
            logger.warning(
                "could not list what was missed in %d chat(s) and topic(s): the app lacks "
                "im:message:readonly (in groups also im:message.group_msg)",
                refused,
            )
        found = self.caught_up - before
        logger.info(
            "caught up %d message(s) sent while the bot was not hearing (%d chat(s) and "
            "topic(s) looked at)",
            found,
            len(places),
        )

    async def _catch_up(self, place: Container) -> None:
        now_ms = self._clock() * 1000
        start_ms = max(place.last_ms - SLACK_MS, place.since_ms, now_ms - self._max_age_ms)
        token = ""
        for _ in range(self._settings.catch_up_pages):
            items, token = await self._client.messages_since(
                place.kind, place.id, int(start_ms // 1000), page_token=token, page_size=PAGE_SIZE
            )
            for item in items:
                await self._hand_on(item, place)
            if not token:
                return
        logger.warning(
            "stopped listing %s %s after %d pages: older missed messages stay unanswered",
            place.kind,
            place.id,
            self._settings.catch_up_pages,
        )

    async def _hand_on(self, item: dict[str, Any], place: Container) -> None:
        payload = listed_payload(item, place, self._settings.app_id, self._dispatcher.bot_open_id)
        if payload is None:
            return
        try:
            event = parse_event(payload, self._dispatcher.bot_open_id)
        except MalformedEvent:
            return
        if not isinstance(event, MessageEvent):
            return
        if self.is_late(event):
            self._store.listed_late(event.message_id, payload)
        try:
            accepted = await self._dispatcher.accept(payload)
        except AmuxError as error:
            logger.warning("listed message %s not handled: %s", event.message_id, error.message)
            return
        accepted.answered()
        if accepted.handled:
            self.caught_up += 1
            self._dispatcher.observer.feishu_event("caught_up")
            logger.info("caught up message %s in chat %s", event.message_id, event.chat_id)

    # -- late messages ----------------------------------------------------------------------

    def is_late(self, event: MessageEvent) -> bool:
        """Whether ``event`` was found by catch-up longer than the window after it was sent."""
        if not event.event_id.startswith(CAUGHT_UP) or not event.create_time_ms:
            return False
        return self._clock() * 1000 - event.create_time_ms > self._window_ms

    def late_minutes(self, event: MessageEvent) -> int:
        return max(1, int((self._clock() * 1000 - event.create_time_ms) // 60_000))

    def hold(self, event: MessageEvent, note_id: str, principal_id: str) -> None:
        """The note ``note_id`` answers ``event``, whose sender is ``principal_id``."""
        self._store.hold(event.message_id, note_id, principal_id)

    def take(self, note_id: str, clicker_id: str, is_owner: bool) -> MessageEvent | Refusal:
        """The message a note's button runs, once, for its sender or the owner; or why not.

        Which message and whose it is come from the bot's record of the note, never the card."""
        taken = self._store.take(note_id, clicker_id, is_owner)
        if isinstance(taken, str):
            return taken
        event = parse_event(taken, self._dispatcher.bot_open_id)
        if not isinstance(event, MessageEvent):
            return "unknown"
        return replace(event, event_id=RUN_LATE + event.message_id)
