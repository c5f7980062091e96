"""The state database schema: numbered migrations, upgraded in place, never downgraded."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hub.aliases import FeishuApp, alias_kind, bind_pending, recorded_app
from hub.errors import Unavailable
from hub.executions import Executions
from hub.migrations import MIGRATIONS, SCHEMA_VERSION, run_script
from hub.state import State

APP = FeishuApp("cli_1", "tenant_1")
# The migration that namespaced Feishu aliases by tenant.
TENANT_ALIASES_VERSION = 5

# What the first release wrote, verbatim: it stamped user_version 1 on every database it opened.
RELEASE_1_IDENTITY = """
CREATE TABLE IF NOT EXISTS principals (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL CHECK (kind IN ('user', 'service')),
    is_owner INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS aliases (
    kind TEXT NOT NULL,
    value TEXT NOT NULL,
    principal_id TEXT NOT NULL REFERENCES principals(id) ON DELETE CASCADE,
    created_at REAL NOT NULL,
    PRIMARY KEY (kind, value)
);
CREATE INDEX IF NOT EXISTS aliases_by_principal ON aliases(principal_id);
CREATE TABLE IF NOT EXISTS credentials (
    id TEXT PRIMARY KEY,
    principal_id TEXT NOT NULL REFERENCES principals(id) ON DELETE CASCADE,
    token_hash TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL CHECK (kind IN ('cli', 'delegated')),
    binding TEXT,
    label TEXT NOT NULL DEFAULT '',
    issued_by TEXT,
    expires_at REAL,
    revoked_at REAL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS credentials_by_principal ON credentials(principal_id);
CREATE TABLE IF NOT EXISTS settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL
);
"""
RELEASE_1_QUEUE = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    principal_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    cwd TEXT,
    origin TEXT UNIQUE,
    native_id TEXT,
    memory TEXT NOT NULL DEFAULT 'pending' CHECK (memory IN ('pending', 'bound', 'unbound')),
    binding TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS executions (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    prompt TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    worker_id TEXT,
    lease_expires_at REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    error TEXT,
    submitted_by TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS executions_by_state ON executions(state, created_at);
CREATE TABLE IF NOT EXISTS execution_events (
    execution_id TEXT NOT NULL REFERENCES executions(id),
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (execution_id, seq)
);
CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    last_seen REAL NOT NULL
);
"""
RELEASE_1_REQUEST_ID = "ALTER TABLE executions ADD COLUMN request_id TEXT;"

ALL_TABLES = {
    "principals",
    "aliases",
    "credentials",
    "user_tokens",
    "settings",
    "sessions",
    "executions",
    "execution_events",
    "workers",
    "memory_log",
    "credential_launches",
    "approvals",
    "session_rules",
    "usage",
    "budget_extensions",
    "budget_requests",
    "projects",
    "chat_projects",
    "schedules",
    "schedule_firings",
    "trigger_deliveries",
    "project_forges",
    "pull_requests",
}


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def user_version(path: Path) -> int:
    with raw(path) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def tables(path: Path) -> set[str]:
    with raw(path) as db:
        rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {row[0] for row in rows}


def columns(path: Path, table: str) -> list[str]:
    with raw(path) as db:
        return [row[1] for row in db.execute(f"PRAGMA table_info({table})")]


def schema(path: Path) -> list[tuple[str, str]]:
    with raw(path) as db:
        return db.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()


def release_1_database(path: Path, *, queue: bool, request_id: bool) -> None:
    """A database as the first release left it, with one row in every table it had."""
    db = raw(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(RELEASE_1_IDENTITY)
    db.execute("PRAGMA user_version=1")
    db.execute(
        "INSERT INTO principals (id, name, kind, is_owner, created_at) "
        "VALUES ('p1', 'alice', 'user', 1, 1.0)"
    )
    db.execute(
        "INSERT INTO aliases (kind, value, principal_id, created_at) "
        "VALUES ('feishu_open_id', 'ou_1', 'p1', 1.0)"
    )
    db.execute(
        "INSERT INTO credentials (id, principal_id, token_hash, kind, label, created_at) "
        "VALUES ('c1', 'p1', 'hash-1', 'cli', 'laptop', 1.0)"
    )
    db.execute("INSERT INTO settings (key, value, updated_at) VALUES ('memory.enabled', 'true', 1)")
    if queue:
        db.executescript(RELEASE_1_QUEUE)
        if request_id:
            db.execute(RELEASE_1_REQUEST_ID)
        db.execute(
            "INSERT INTO sessions (id, principal_id, provider, created_at, updated_at) "
            "VALUES ('s1', 'p1', 'claude', 1.0, 1.0)"
        )
        db.execute(
            "INSERT INTO executions (id, session_id, prompt, state, submitted_by, created_at, "
            "updated_at) VALUES ('e1', 's1', 'hello', 'succeeded', 'p1', 1.0, 1.0)"
        )
        db.execute(
            "INSERT INTO execution_events (execution_id, seq, kind, text, at) "
            "VALUES ('e1', 1, 'status', 'done', 1.0)"
        )
        db.execute(
            "INSERT INTO workers (id, name, principal_id, last_seen) "
            "VALUES ('w1', 'laptop', 'p1', 1.0)"
        )
    db.close()


def test_the_migrations_are_numbered_one_by_one_from_one() -> None:
    assert [version for version, _ in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert SCHEMA_VERSION == len(MIGRATIONS)


def test_a_fresh_database_gets_every_table_at_the_latest_version(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    State(path).close()
    assert user_version(path) == SCHEMA_VERSION
    assert tables(path) == ALL_TABLES
    assert "request_id" in columns(path, "executions")


@pytest.mark.parametrize(
    ("queue", "request_id"),
    [(True, True), (True, False), (False, False)],
    ids=["with-request-id", "without-request-id", "opened-only-by-admin-commands"],
)
async def test_a_database_the_first_release_left_upgrades_and_keeps_its_rows(
    tmp_path: Path, queue: bool, request_id: bool
) -> None:
    path = tmp_path / "state.sqlite3"
    release_1_database(path, queue=queue, request_id=request_id)

    state = State(path)
    try:
        assert user_version(path) == SCHEMA_VERSION
        assert tables(path) == ALL_TABLES
        assert columns(path, "executions").count("request_id") == 1
        alice = state.principal_by_name("alice")
        assert alice.is_owner
        # Waiting for the bot to learn its app's tenant (see hub.aliases).
        assert state.aliases(alice.id) == [("feishu:*:open_id", "ou_1")]
        assert [c.label for c in state.credentials(alice.id)] == ["laptop"]
        assert state.saved_settings() == {"memory.enabled": True}
        executions = Executions(state, providers=("claude",))
        if queue:
            assert executions.describe("e1").state == "succeeded"
            assert [e.text for e in executions.events("e1")] == ["done"]
            assert executions.session("s1").provider == "claude"
        # The upgraded queue takes new turns, which need the request_id column.
        submitted, _ = await executions.submit(
            principal_id=alice.id, submitted_by=alice.id, provider="claude", prompt="again"
        )
        assert executions.describe(submitted.id).state == "queued"
    finally:
        state.close()


def test_reopening_an_up_to_date_database_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    release_1_database(path, queue=True, request_id=False)
    first = State(path)
    first.add_principal("bob")
    first.close()
    upgraded = schema(path)

    for _ in range(2):
        again = State(path)
        assert [p.name for p in again.principals()] == ["alice", "bob"]
        again.close()
    assert schema(path) == upgraded
    assert user_version(path) == SCHEMA_VERSION


def test_a_database_from_a_newer_amux_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    State(path).close()
    newer = SCHEMA_VERSION + 1
    with raw(path) as db:
        db.execute(f"PRAGMA user_version={newer}")
    before = schema(path)

    with pytest.raises(Unavailable) as refused:
        State(path)
    assert f"schema version {newer}" in refused.value.message
    assert f"versions up to {SCHEMA_VERSION}" in refused.value.message
    assert refused.value.details == {"found_version": newer, "supported_version": SCHEMA_VERSION}
    assert user_version(path) == newer
    assert schema(path) == before


def test_a_migration_that_fails_leaves_the_database_at_the_version_before_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite3"
    release_1_database(path, queue=False, request_id=False)
    # Something no release made: a view where the queue table belongs, so adding its column fails
    # after the step has already created other tables.
    with raw(path) as db:
        db.execute("CREATE VIEW executions AS SELECT 'x' AS id")

    with pytest.raises(sqlite3.OperationalError):
        State(path)
    assert user_version(path) == 1
    assert tables(path) == {"principals", "aliases", "credentials", "settings"}


def test_feishu_user_and_open_id_aliases_wait_for_the_apps_tenant_and_are_bound_to_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite3"
    db = raw(path)
    for version, step in MIGRATIONS:
        if version >= TENANT_ALIASES_VERSION:
            break
        if isinstance(step, str):
            run_script(db, step)
        else:
            step(db)
    db.execute(f"PRAGMA user_version={TENANT_ALIASES_VERSION - 1}")
    # What the bot and `amux principal alias` wrote before: ids without their tenant.
    db.execute(
        "INSERT INTO principals (id, name, kind, is_owner, created_at) "
        "VALUES ('p1', 'alice', 'user', 1, 1.0)"
    )
    for kind, value in [
        ("feishu_open_id", "ou_1"),
        ("feishu_user_id", "u_1"),
        ("feishu_union_id", "on_1"),
    ]:
        db.execute(
            "INSERT INTO aliases (kind, value, principal_id, created_at) VALUES (?, ?, 'p1', 1.0)",
            (kind, value),
        )
    db.close()

    state = State(path)
    try:
        assert user_version(path) == SCHEMA_VERSION
        alice = state.principal_by_name("alice")
        assert state.aliases(alice.id) == [
            ("feishu:*:open_id", "ou_1"),
            ("feishu:*:user_id", "u_1"),
            ("feishu_union_id", "on_1"),
        ]
        # Nothing looks the waiting ones up: a user_id of any tenant finds nobody.
        assert state.principal_by_alias(alias_kind("user_id", APP), "u_1") is None

        assert bind_pending(state, APP) == []
        assert state.aliases(alice.id) == [
            ("feishu:tenant_1:cli_1:open_id", "ou_1"),
            ("feishu:tenant_1:user_id", "u_1"),
            ("feishu_union_id", "on_1"),
        ]
        assert recorded_app(state) == APP
        assert state.principal_by_alias(alias_kind("user_id", APP), "u_1") == alice
        elsewhere = FeishuApp("cli_1", "tenant_2")
        assert state.principal_by_alias(alias_kind("user_id", elsewhere), "u_1") is None
    finally:
        state.close()


def test_an_alias_waiting_for_the_tenant_that_another_principal_holds_there_stays_waiting(
    tmp_path: Path,
) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        alice = state.add_principal("alice")
        bob = state.add_principal("bob")
        state.add_alias(alice.id, "feishu:*:user_id", "u_1")
        state.add_alias(bob.id, alias_kind("user_id", APP), "u_1")
        assert bind_pending(state, APP) == [("feishu:*:user_id", alice.id)]
        assert state.aliases(alice.id) == [("feishu:*:user_id", "u_1")]
        assert state.principal_by_alias(alias_kind("user_id", APP), "u_1") == bob
    finally:
        state.close()


def test_a_new_state_database_leaves_no_log_of_its_own_creation(tmp_path: Path) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        # Its schema is in the database file, not half a megabyte of write-ahead log.
        assert (tmp_path / "state.sqlite3-wal").stat().st_size == 0
        assert state.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        state.close()
