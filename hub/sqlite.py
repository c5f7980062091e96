"""How every amux SQLite database is opened and how its schema evolves.

The Hub's state (``hub.state``, its steps in ``hub.migrations``), the bot's outbox, topics and
event de-duplication, and the Runtime's Agent users each open their file with ``connect`` and
bring it up to date with ``migrate``. This module imports nothing of ours but ``hub.errors``, so
the Runtime bridge may use it without reaching the rest of the Hub.

Schemas evolve by numbered steps: ``PRAGMA user_version`` holds the number of the last step
applied, and opening a database applies the ones after it in order, each in its own transaction
together with its new number, so a crash leaves the database at one version or the next, never in
between. A database written by a newer amux is refused: running against a schema this code does
not know could corrupt it silently. To change a schema, append a step with the next number; never
edit one that shipped, since databases already past it will not run it again.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hub.errors import Unavailable

Step = str | Callable[[sqlite3.Connection], None]
Steps = Sequence[tuple[int, Step]]


def connect(path: Path | str, *, durable: bool, timeout: float = 5.0) -> sqlite3.Connection:
    """Open ``path`` (created if absent) as every amux database is opened.

    - ``isolation_level=None`` (autocommit): the only transactions are the ones the code opens
      (``BEGIN IMMEDIATE``, ``migrate``'s); the driver never opens one behind a write and keeps
      its lock until some later commit.
    - ``check_same_thread=False``: an owner uses its connection from the event loop and from
      worker threads, and serialises those uses itself.
    - ``journal_mode=WAL``: readers and the one writer do not block each other, so the Hub, the
      bot and a local command can share a file.
    - ``synchronous=FULL`` when ``durable``: every commit is synced to disk before it returns, so
      what was committed survives a power cut. Otherwise ``NORMAL``: a commit survives the
      process crashing and the file is never corrupted, but a power cut may lose the last few
      commits, for data whose loss costs less than a sync per write.
    - ``foreign_keys=ON``: SQLite enforces a schema's ``REFERENCES`` only when each connection
      asks it to.
    - ``busy_timeout`` (``timeout`` seconds): a write that finds another process holding the lock
      waits for it that long instead of failing at once.
    """
    db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    try:
        _enter_wal(db, timeout)
        db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        db.execute("PRAGMA foreign_keys=ON")
    except BaseException:
        db.close()
        raise
    return db


def _enter_wal(db: sqlite3.Connection, timeout: float) -> None:
    # Switching a new file to WAL needs a moment's exclusive lock, and SQLite reports a rival
    # switching at the same time as "locked" at once, without its busy wait: processes that
    # create one file together would fail where they should have waited their turn.
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def run_script(db: sqlite3.Connection, script: str) -> None:
    """Execute each statement of ``script`` inside the caller's open transaction.

    ``executescript`` would commit that transaction first, so statements run one at a time.
    """
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        # A ';' inside a string literal or a trigger body does not end the statement.
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\r\n;"):
                db.execute(pending)
            pending = ""
    if pending.strip(" \t\r\n;"):
        raise ValueError(f"incomplete SQL statement in a migration: {pending.strip()!r}")


def schema_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def latest(steps: Steps) -> int:
    """The version ``steps`` bring a database to; they must be numbered one by one from one."""
    versions = [version for version, _ in steps]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migration steps must be numbered 1, 2, 3, …; got {versions}")
    return len(versions)


def _refuse_newer(found: int, supported: int, path: Path | str, name: str) -> None:
    if found > supported:
        raise Unavailable(
            f"{name} {path} has schema version {found}, but this amux knows versions up to "
            f"{supported}: a newer amux wrote it; run that version, or restore the backup taken "
            "before the upgrade",
            found_version=found,
            supported_version=supported,
        )


def migrate(db: sqlite3.Connection, path: Path | str, steps: Steps, *, name: str) -> int:
    """Bring the database to the last of ``steps``; returns the version it had before.

    ``db`` must be in autocommit mode (as ``connect`` opens it), so each step's transaction is
    exactly the one opened here. ``path`` and ``name`` (e.g. "the state database") only name the
    database in errors. A step is an SQL script or a function given the connection.

    Raises:
        Unavailable: a newer amux wrote the database.
    """
    supported = latest(steps)
    found = schema_version(db)
    _refuse_newer(found, supported, path, name)
    for version, step in steps:
        if version <= found:
            continue
        db.execute("BEGIN IMMEDIATE")
        try:
            # Another process (the Hub and a local admin command, the worker and the bot) may have
            # applied this step while we waited for the write lock; the version read under the
            # lock decides.
            current = schema_version(db)
            _refuse_newer(current, supported, path, name)
            if current < version:
                if isinstance(step, str):
                    run_script(db, step)
                else:
                    step(db)
                db.execute(f"PRAGMA user_version = {version}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    if found < supported:
        # Each step's commit appended its pages to the write-ahead log, which keeps its size
        # until checkpointed: a new database's log would otherwise hold half a megabyte of its
        # own creation until the automatic checkpoint, far later. Best effort: a reader holding
        # the log open only leaves it for the next checkpoint.
        with contextlib.suppress(sqlite3.OperationalError):
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return found
