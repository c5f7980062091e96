"""Every amux SQLite database opens through ``hub.sqlite``: the same pragmas (durable or not, as
each needs), numbered migrations, a file an older amux left is upgraded in place with its rows, and
one a newer amux wrote is refused and left alone. Real files, opened by the real classes."""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pytest

from bot import comments, outbox, topic_context
from bot.feishu import catchup, dedup
from bot.outbox import Followed, Outbox
from bot.topic_context import SeenTopics
from hub import migrations, sqlite
from hub.errors import Unavailable
from hub.sqlite import Steps
from hub.state import State
from runtime_bridge import agent_users
from runtime_bridge.agent_users import AgentUsers


async def _nothing(*args: object) -> None:
    return None


def an_outbox(path: Path) -> Outbox:
    return Outbox(path, _nothing, _nothing, _nothing)


class Owner(Protocol):
    def close(self) -> None: ...


@contextlib.contextmanager
def holding(owner: Owner, db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """The connection ``owner`` itself uses, to read the pragmas it was given; closed after."""
    try:
        yield db
    finally:
        owner.close()


def opened_state(path: Path) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    state = State(path)
    return holding(state, state.db)


def opened_outbox(path: Path) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    box = an_outbox(path)
    return holding(box, box._db)


def opened_topics(path: Path) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    topics = SeenTopics(path)
    return holding(topics, topics._db)


def opened_dedup(path: Path) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    events = dedup.SqliteEventDedup(path)
    return holding(events, events._db)


def opened_catch_up(path: Path) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    store = catchup.CatchUpStore(path)
    return holding(store, store._db)


def opened_comment_turns(path: Path) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    turns = comments.CommentTurns(path)
    return holding(turns, turns._db)


def opened_agent_users(path: Path) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    return AgentUsers(path.parent, host_registry=path.parent / "host" / "uids.sqlite3")._db()


def opened_agent_uids(path: Path) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    return AgentUsers(path.parent / "work", host_registry=path)._host_db()


Opener = Callable[[Path], contextlib.AbstractContextManager[sqlite3.Connection]]

# Each database: its file name, how it opens, its steps, whether every commit must survive a
# power cut (the event de-duplication accepts losing the last few ids) and its lock wait.
DATABASES: dict[str, tuple[str, Opener, Steps, bool, int]] = {
    "state": ("state.sqlite3", opened_state, migrations.MIGRATIONS, True, 5000),
    "outbox": (outbox.OUTBOX_FILE, opened_outbox, outbox.MIGRATIONS, True, 5000),
    "topics": (topic_context.TOPICS_FILE, opened_topics, topic_context.MIGRATIONS, True, 5000),
    "dedup": ("feishu-events.sqlite3", opened_dedup, dedup.MIGRATIONS, False, 5000),
    "catch_up": (catchup.CATCH_UP_FILE, opened_catch_up, catchup.MIGRATIONS, True, 5000),
    "comment_turns": (
        comments.COMMENTS_FILE,
        opened_comment_turns,
        comments.MIGRATIONS,
        True,
        5000,
    ),
    "agent_users": (
        agent_users.REGISTRY,
        opened_agent_users,
        agent_users.MIGRATIONS,
        True,
        30000,
    ),
    "agent_uids": (
        agent_users.HOST_REGISTRY.name,
        opened_agent_uids,
        agent_users.HOST_MIGRATIONS,
        True,
        30000,
    ),
}


def raw(path: Path) -> contextlib.closing[sqlite3.Connection]:
    return contextlib.closing(sqlite3.connect(path, isolation_level=None))


def user_version(path: Path) -> int:
    with raw(path) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def schema(path: Path) -> list[tuple[str, str]]:
    with raw(path) as db:
        return db.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()


def columns(path: Path, table: str) -> list[str]:
    with raw(path) as db:
        return [row[1] for row in db.execute(f"PRAGMA table_info({table})")]


@pytest.mark.parametrize("kind", DATABASES)
def test_each_database_gets_the_helpers_pragmas_and_its_latest_version(
    tmp_path: Path, kind: str
) -> None:
    name, opened, steps, durable, wait_ms = DATABASES[kind]
    path = tmp_path / name
    with opened(path) as db:
        assert db.isolation_level is None
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        # 2 is FULL, 1 NORMAL.
        assert db.execute("PRAGMA synchronous").fetchone()[0] == (2 if durable else 1)
        assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert db.execute("PRAGMA busy_timeout").fetchone()[0] == wait_ms
    assert user_version(path) == sqlite.latest(steps) == len(steps)


@pytest.mark.parametrize("kind", DATABASES)
def test_a_database_from_a_newer_amux_is_refused_by_name_and_left_alone(
    tmp_path: Path, kind: str
) -> None:
    name, opened, steps, _, _ = DATABASES[kind]
    path = tmp_path / name
    with opened(path):
        pass
    newer = sqlite.latest(steps) + 1
    with raw(path) as db:
        db.execute(f"PRAGMA user_version={newer}")
    before = schema(path)

    with pytest.raises(Unavailable) as refused, opened(path):
        pass
    message = refused.value.message
    assert f" {path} has schema version {newer}, but this amux knows versions up to " in message
    assert "a newer amux wrote it" in message
    assert refused.value.details == {"found_version": newer, "supported_version": newer - 1}
    assert user_version(path) == newer
    assert schema(path) == before


def test_reopening_each_database_changes_nothing(tmp_path: Path) -> None:
    for name, opened, _, _, _ in DATABASES.values():
        path = tmp_path / name
        with opened(path):
            pass
        first = schema(path)
        with opened(path):
            pass
        assert schema(path) == first, name


# The outbox as each unnumbered version of bot/outbox.py left it (user_version 0): the first one,
# one that had streaming cards (card_id, sequence), and the last one (note, topic too).
OUTBOX_V0_FOLLOWS = (
    "CREATE TABLE follows (execution_id TEXT PRIMARY KEY, progress_message_id TEXT NOT NULL, "
    "reply_to TEXT NOT NULL, title TEXT NOT NULL, started_at REAL NOT NULL{extra})"
)
OUTBOX_V0_OWED = (
    "CREATE TABLE owed (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, "
    "target TEXT NOT NULL, reply_to TEXT NOT NULL, card TEXT NOT NULL, uuid TEXT NOT NULL, "
    "created_at REAL NOT NULL{extra})"
)
OUTBOX_V0 = {
    "first": ("", ""),
    "streaming": (
        ", card_id TEXT NOT NULL DEFAULT ''",
        ", card_id TEXT NOT NULL DEFAULT '', sequence INTEGER NOT NULL DEFAULT 0",
    ),
    "last": (
        ", card_id TEXT NOT NULL DEFAULT '', note TEXT NOT NULL DEFAULT '', "
        "topic TEXT NOT NULL DEFAULT ''",
        ", card_id TEXT NOT NULL DEFAULT '', sequence INTEGER NOT NULL DEFAULT 0",
    ),
}


@pytest.mark.parametrize("version", OUTBOX_V0)
def test_an_outbox_from_before_versions_upgrades_and_keeps_what_it_owed(
    tmp_path: Path, version: str
) -> None:
    fresh = tmp_path / "fresh.sqlite3"
    an_outbox(fresh).close()
    path = tmp_path / outbox.OUTBOX_FILE
    follows, owed = OUTBOX_V0[version]
    with raw(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(OUTBOX_V0_FOLLOWS.format(extra=follows))
        db.execute(OUTBOX_V0_OWED.format(extra=owed))
        db.execute(
            "INSERT INTO follows (execution_id, progress_message_id, reply_to, title, started_at) "
            "VALUES ('run1', 'om_1', 'om_0', 'question', 1.0)"
        )
        db.execute(
            "INSERT INTO owed (kind, target, reply_to, card, uuid, created_at) "
            "VALUES ('reply', 'om_2', 'om_0', '{}', 'u-1', 1.0)"
        )

    box = an_outbox(path)
    try:
        assert box.followed() == [Followed("run1", "om_1", "om_0", "question", 1.0)]
        assert box.pending() == 1
    finally:
        box.close()
    assert user_version(path) == len(outbox.MIGRATIONS)
    for table in ("follows", "owed"):
        assert columns(path, table) == columns(fresh, table)


async def test_topics_events_and_agent_users_from_before_versions_keep_their_rows(
    tmp_path: Path,
) -> None:
    # Each as the code before numbered versions created it, with one row, at user_version 0.
    topics = tmp_path / topic_context.TOPICS_FILE
    with raw(topics) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE IF NOT EXISTS seen (origin TEXT PRIMARY KEY, until_ms INTEGER)")
        db.execute("CREATE TABLE IF NOT EXISTS generations (topic TEXT PRIMARY KEY, n INTEGER)")
        db.execute("INSERT INTO seen VALUES ('feishu:topic', 42)")
        db.execute("INSERT INTO generations VALUES ('topic', 3)")
    events = tmp_path / "feishu-events.sqlite3"
    with raw(events) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(
            "CREATE TABLE IF NOT EXISTS feishu_events (event_id TEXT PRIMARY KEY, "
            "seen_at REAL NOT NULL);"
            "CREATE INDEX IF NOT EXISTS feishu_events_seen_at ON feishu_events (seen_at);"
        )
        db.execute("INSERT INTO feishu_events VALUES ('ev_1', 1000.0)")
    users = tmp_path / agent_users.REGISTRY
    owner = hashlib.sha256(b"alice-id").hexdigest()
    with raw(users) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS agent_users ("
            " owner TEXT PRIMARY KEY, uid INTEGER NOT NULL UNIQUE)"
        )
        db.execute("INSERT INTO agent_users VALUES (?, 61200)", (owner,))

    seen = SeenTopics(topics)
    try:
        assert seen.seen_until("feishu:topic") == 42
        assert seen.generation("topic") == 3
    finally:
        seen.close()
    remembered = dedup.SqliteEventDedup(events, clock=lambda: 1001.0)
    try:
        assert not await remembered.first_time("ev_1")
        assert await remembered.first_time("ev_2")
    finally:
        remembered.close()
    # A registry of its own: another installation on this host may hold 61200.
    registry = tmp_path / "host-registry"
    assert AgentUsers(tmp_path, host_registry=registry).of("alice-id") == (61200, 61200)
    for path, steps in [
        (topics, topic_context.MIGRATIONS),
        (events, dedup.MIGRATIONS),
        (users, agent_users.MIGRATIONS),
    ]:
        assert user_version(path) == len(steps)


def test_steps_run_in_order_each_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "any.sqlite3"

    def add_column(db: sqlite3.Connection) -> None:
        db.execute("ALTER TABLE t ADD COLUMN b TEXT")

    steps: Steps = [
        (1, "CREATE TABLE t (a TEXT); INSERT INTO t VALUES ('x;y');"),
        (2, add_column),
        (3, "CREATE TABLE u (c TEXT); CREATE TABLE t (again TEXT);"),
    ]
    with contextlib.closing(sqlite.connect(path, durable=True)) as db:
        with pytest.raises(sqlite3.OperationalError):
            sqlite.migrate(db, path, steps, name="the test database")
        # Step 3 failed after creating u: its transaction took u with it.
        assert sqlite.schema_version(db) == 2
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        assert tables == {"t"}
        assert db.execute("SELECT a, b FROM t").fetchall() == [("x;y", None)]
        # Run again with the broken step fixed: only the steps after version 2 run.
        fixed: Steps = [*steps[:2], (3, "CREATE TABLE u (c TEXT);")]
        assert sqlite.migrate(db, path, fixed, name="the test database") == 2
        assert sqlite.schema_version(db) == 3


def test_steps_must_be_numbered_one_by_one() -> None:
    with pytest.raises(ValueError, match="numbered"):
        sqlite.latest([(1, "SELECT 1"), (3, "SELECT 1")])
    with pytest.raises(ValueError, match="numbered"):
        sqlite.latest([(2, "SELECT 1")])
    assert sqlite.latest([]) == 0
