"""Event-id and message-id de-duplication in SQLite, so Feishu's retries (up to ~7 h later) run
once, and a message run from a live event is not run again when catch-up lists it (or the other
way round: catch-up copies carry no event id of Feishu's).

Entries are kept for ``retention`` (24 h by default) and pruned lazily on insert, at most once
per ``prune_every``. The check runs inline: without a per-event fsync (``synchronous=NORMAL``) it
takes microseconds, less than a hop to a worker thread would. A power cut can at worst forget the
last few ids, so a retry of one of those events could run twice; a crash of the process loses none.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hub import sqlite
from hub.sqlite import Step

# Version 1: the table as the first version of this file created it, before versions were kept,
# so a file it left at version 0 holds it already.
_V1_EVENTS = """
CREATE TABLE IF NOT EXISTS feishu_events (
    event_id TEXT PRIMARY KEY,
    seen_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS feishu_events_seen_at ON feishu_events (seen_at);
"""
# Version 2: message ids, since a message reaches the bot as an event or from catch-up's listing.
_V2_MESSAGES = """
CREATE TABLE feishu_messages (
    message_id TEXT PRIMARY KEY,
    seen_at REAL NOT NULL
);
CREATE INDEX feishu_messages_seen_at ON feishu_messages (seen_at);
"""
_EVENTS = ("feishu_events", "event_id")
_MESSAGES = ("feishu_messages", "message_id")
MIGRATIONS: tuple[tuple[int, Step], ...] = ((1, _V1_EVENTS), (2, _V2_MESSAGES))


class SqliteEventDedup:
    """The :class:`~bot.feishu.events.EventDedup` the bot uses; safe across restarts."""

    def __init__(
        self,
        path: Path | str,
        *,
        retention_seconds: float = 24 * 3600,
        prune_every_seconds: float = 600,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._retention = retention_seconds
        self._prune_every = prune_every_seconds
        self._clock = clock
        self._last_prune = float("-inf")
        self._lock = threading.Lock()
        # Not durable: losing the last ids to a power cut is what the module's docstring accepts.
        self._db = sqlite.connect(path, durable=False)
        try:
            sqlite.migrate(self._db, path, MIGRATIONS, name="the Feishu event de-duplication file")
        except BaseException:
            self._db.close()
            raise

    async def first_time(self, event_id: str) -> bool:
        """Record ``event_id``; true only the first time within the retention window."""
        return self._first(_EVENTS, event_id)

    async def first_message(self, message_id: str) -> bool:
        """Record ``message_id``; true only the first time within the retention window."""
        return self._first(_MESSAGES, message_id)

    def _first(self, table: tuple[str, str], key: str) -> bool:
        name, column = table
        now = self._clock()
        with self._lock:
            if now - self._last_prune >= self._prune_every:
                for pruned, _ in (_EVENTS, _MESSAGES):
                    self._db.execute(
                        f"DELETE FROM {pruned} WHERE seen_at < ?", (now - self._retention,)
                    )
                self._last_prune = now
            cursor = self._db.execute(
                f"INSERT INTO {name} ({column}, seen_at) VALUES (?, ?) "
                # An id older than the window counts as new again (it was due for pruning).
                f"ON CONFLICT({column}) DO UPDATE SET seen_at = excluded.seen_at "
                f"WHERE {name}.seen_at < ?",
                (key, now, now - self._retention),
            )
            return cursor.rowcount == 1

    async def count(self) -> int:
        """How many ids are remembered (for tests and diagnostics)."""

        def _count() -> int:
            with self._lock:
                row = self._db.execute("SELECT COUNT(*) FROM feishu_events").fetchone()
                return int(row[0])

        return await asyncio.to_thread(_count)

    def close(self) -> None:
        with self._lock:
            self._db.close()
