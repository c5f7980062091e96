"""The schema of the Hub's state database (``<AMUX_HOME>/state.sqlite3``) and how it evolves.

Every table in that file is created or changed here and nowhere else, by the numbered steps in
``MIGRATIONS`` that ``hub.sqlite.migrate`` applies (it says how versions are kept, and refuses a
database a newer amux wrote). To change the schema, append a step with the next number; never
edit one that shipped, since databases already past it will not run it again.

Each table and the module that owns its rows (the one that writes them; others only read):

- ``principals``, ``aliases``, ``credentials``: ``hub.state`` (``hub.aliases`` decides the kinds;
  ``hub.people`` sets a Principal's display name)
- ``credential_launches``: ``hub.state``, which launch each delegated credential was issued for
- ``settings``: ``hub.state`` stores the rows; their keys belong to ``hub.sysconfig`` (the
  Hub-wide settings), ``hub.aliases`` (``feishu.app``) and ``hub.preferences`` (``bot.*``)
- ``sessions``, ``executions``, ``workers``: ``hub.executions``
- ``execution_events``: ``hub.executions``; ``hub.history`` rewrites erased paths in them
- ``memory_log``: ``hub.history``
- ``approvals``, ``session_rules``: ``hub.approvals``
- ``usage``: ``hub.usage``, written with the completion of each turn the model gateway counted
- ``budget_extensions``: ``hub.usage``, the tokens the owner added to a Principal's day
- ``budget_requests``: ``hub.usage``, the extensions asked for and whether the owner granted each
- ``schedules``, ``schedule_firings``, ``trigger_deliveries``: ``hub.schedules``;
  ``Executions.submit`` writes a firing's row through the callback the scheduler hands it, in
  the commit that queues the turn
- ``projects``, ``chat_projects``: ``hub.projects``; ``sessions.project`` and
  ``sessions.home_worker``, ``sessions.model``, ``sessions.fork_of``:
  ``hub.executions``
- ``project_forges``, ``pull_requests``: ``hub.forges``
- ``user_tokens``: ``hub.user_tokens``, each person's Feishu user access token, sealed

Readers outside the owners: ``hub.server`` (readiness and metrics counts), ``hub.rpc_executions``
(whom a turn runs as), ``hub.history`` (the Sessions and turns of a scope) and ``hub.usage`` (the
names of the Principals in a report).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hub import sqlite
from hub.sqlite import Step, run_script

# The first release's principals, aliases, credentials and settings. It created them with
# IF NOT EXISTS before writing user_version, so a database it left at version 0 may hold them.
_V1_IDENTITY_AND_SETTINGS = """
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

# The first release's queue tables, as it created them (without executions.request_id).
_V1_QUEUE = """
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


def _queue_with_request_ids(db: sqlite3.Connection) -> None:
    """Version 2: the queue tables, and ``executions.request_id``.

    The first release stamped version 1 on every database it opened, but created the queue
    tables only when the Hub itself (not a local admin command) opened it, and added
    ``request_id`` only from a later build on. A version-1 database may therefore have none, some
    or all of this, and this step is the one place that has to look.
    """
    run_script(db, _V1_QUEUE)
    columns = {row[1] for row in db.execute("PRAGMA table_info(executions)")}
    if "request_id" not in columns:
        # The id that follows a turn from Feishu to the worker and back.
        db.execute("ALTER TABLE executions ADD COLUMN request_id TEXT")


# Version 3: the memory change log (metadata only, never a body; see hub.history) and which
# launch each delegated Agent credential was issued for, so a change names its Session and turn.
_V3_MEMORY_LOG = """
CREATE TABLE memory_log (
    id INTEGER PRIMARY KEY,
    scope TEXT NOT NULL,
    path TEXT NOT NULL,
    action TEXT NOT NULL CHECK (action IN ('upsert', 'forget', 'restore', 'erase')),
    previous_revision TEXT,
    new_revision TEXT,
    size_bytes INTEGER NOT NULL DEFAULT 0,
    at REAL NOT NULL,
    principal_id TEXT NOT NULL,
    via TEXT NOT NULL CHECK (via IN ('cli', 'mcp', 'card', 'rpc')),
    session_id TEXT,
    execution_id TEXT,
    history_bytes INTEGER
);
CREATE INDEX memory_log_by_path ON memory_log(scope, path, id);
CREATE INDEX memory_log_kept ON memory_log(scope, at) WHERE history_bytes IS NOT NULL;
CREATE TABLE credential_launches (
    credential_id TEXT PRIMARY KEY REFERENCES credentials(id) ON DELETE CASCADE,
    session_id TEXT NOT NULL,
    execution_id TEXT
);
"""

# A shared conversation (a group topic) works in a workspace of its own, named by this key,
# never in the personal workspace of whoever started it.
_V4_SESSION_WORKSPACES = """
ALTER TABLE sessions ADD COLUMN workspace TEXT;
"""

# Version 5: Feishu user_id and open_id aliases are namespaced by tenant (and open_id by app;
# see hub.aliases). The tenant is not in this database yet, so the existing ones wait under the
# kinds that mean "the app's own tenant, once known"; the bot binds them when it learns it.
_V5_FEISHU_ALIASES_WAIT_FOR_THE_TENANT = """
UPDATE aliases SET kind = 'feishu:*:user_id' WHERE kind = 'feishu_user_id';
UPDATE aliases SET kind = 'feishu:*:open_id' WHERE kind = 'feishu_open_id';
"""

# Version 6: whom each turn runs as (its Session's Principal; in a shared conversation, its
# sender), indexed with its state, so a claim finds each Principal's oldest waiting turn and the
# queued-turns cap counts one Principal's without scanning the whole queue (see hub.executions).
_V6_EXECUTIONS_RUN_AS = """
ALTER TABLE executions ADD COLUMN runs_as TEXT;
UPDATE executions SET runs_as = (
    SELECT CASE WHEN s.workspace IS NULL THEN s.principal_id ELSE executions.submitted_by END
    FROM sessions s WHERE s.id = executions.session_id
);
CREATE INDEX executions_by_runs_as ON executions(state, runs_as, created_at);
"""

# Version 7: permission requests of running turns with their decisions, and the rules an
# "allow for this conversation" leaves for a Session's later turns of the same Principal (see
# hub.approvals).
_V7_APPROVALS = """
CREATE TABLE approvals (
    execution_id TEXT NOT NULL REFERENCES executions(id) ON DELETE CASCADE,
    request_id TEXT NOT NULL,
    runs_as TEXT NOT NULL,
    tool TEXT NOT NULL,
    action TEXT NOT NULL,
    subject TEXT NOT NULL,
    detail TEXT NOT NULL,
    asked_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    decision TEXT,
    via TEXT,
    decided_by TEXT,
    decided_by_name TEXT,
    decided_at REAL,
    reason TEXT,
    PRIMARY KEY (execution_id, request_id)
);
CREATE TABLE session_rules (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    runs_as TEXT NOT NULL,
    tool TEXT NOT NULL,
    action TEXT NOT NULL,
    pattern TEXT NOT NULL,
    granted_by TEXT NOT NULL,
    granted_at REAL NOT NULL,
    PRIMARY KEY (session_id, runs_as, tool, action, pattern)
);
"""

# Version 8: model usage as the Runtime's model gateway counted it, per Principal (whom each
# turn ran as), UTC day and provider; one row gathers every turn of that day (see hub.usage).
_V8_USAGE = """
CREATE TABLE usage (
    principal_id TEXT NOT NULL,
    day TEXT NOT NULL,
    provider TEXT NOT NULL,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    requests INTEGER NOT NULL DEFAULT 0,
    turns INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (principal_id, day, provider)
);
CREATE INDEX usage_by_day ON usage(day);
"""

# Version 9: tokens the owner added to one Principal's budget for one UTC day (see hub.usage).
_V9_BUDGET_EXTENSIONS = """
CREATE TABLE budget_extensions (
    principal_id TEXT NOT NULL,
    day TEXT NOT NULL,
    tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (principal_id, day)
);
"""

# Version 10: projects (a git repository conversations check out, with its service Principal
# whose memory a bound group shares), which chat is bound to which, and on each Session the
# project it was created in and the name of the worker holding its checkout (see hub.projects).
_V10_PROJECTS = """
CREATE TABLE projects (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('path', 'remote')),
    source TEXT NOT NULL,
    default_branch TEXT NOT NULL,
    provider TEXT NOT NULL,
    permissions TEXT CHECK (permissions IN ('ask', 'auto', 'read-only')),
    credential_env TEXT,
    principal_id TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE chat_projects (
    chat_id TEXT PRIMARY KEY,
    project TEXT NOT NULL REFERENCES projects(name),
    bound_by TEXT NOT NULL,
    bound_at REAL NOT NULL
);
CREATE INDEX chat_projects_by_project ON chat_projects(project);
ALTER TABLE sessions ADD COLUMN project TEXT;
ALTER TABLE sessions ADD COLUMN home_worker TEXT;
"""

# Version 11: the name people know a Principal by (Feishu's display name) and when it was last
# read, so cards, prompts and logs can say it and the bot refreshes it now and then (see
# hub.people).
_V11_DISPLAY_NAMES = """
ALTER TABLE principals ADD COLUMN display_name TEXT NOT NULL DEFAULT '';
ALTER TABLE principals ADD COLUMN display_name_at REAL NOT NULL DEFAULT 0;
"""

# Version 12: who stopped a turn (the person whose Stop cancelled it), and the owner's answers to
# budget extension requests, each request granted at most once and only on its own day (see
# hub.usage).
_V12_STOPS_AND_EXTENSION_REQUESTS = """
ALTER TABLE executions ADD COLUMN cancelled_by TEXT;
CREATE TABLE budget_requests (
    id TEXT PRIMARY KEY,
    principal_id TEXT NOT NULL,
    day TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    asked_at REAL NOT NULL,
    granted_by TEXT,
    granted_at REAL
);
"""

# Version 13: schedules and triggers (turns that start on a clock or a signed request, as their
# creator, into one chat) and each of their firings, keyed by schedule and scheduled time so a
# firing runs at most once (see hub.schedules).
_V13_SCHEDULES = """
CREATE TABLE schedules (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_by TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    chat_type TEXT NOT NULL CHECK (chat_type IN ('p2p', 'group')),
    prompt TEXT NOT NULL,
    provider TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('cron', 'once', 'trigger')),
    spec TEXT NOT NULL,
    time_zone TEXT NOT NULL,
    overlap TEXT NOT NULL CHECK (overlap IN ('skip', 'queue')),
    paused TEXT,
    failures INTEGER NOT NULL DEFAULT 0,
    next_run_at REAL,
    last_run_at REAL,
    last_result TEXT NOT NULL DEFAULT '',
    secret TEXT,
    run_requested_at REAL,
    created_at REAL NOT NULL
);
CREATE INDEX schedules_due ON schedules(next_run_at) WHERE paused IS NULL;
CREATE INDEX schedules_asked ON schedules(run_requested_at) WHERE run_requested_at IS NOT NULL;
CREATE INDEX schedules_by_chat ON schedules(chat_id);
CREATE TABLE schedule_firings (
    schedule_id TEXT NOT NULL,
    scheduled_at REAL NOT NULL,
    outcome TEXT NOT NULL CHECK (outcome IN ('run', 'skipped', 'missed', 'refused')),
    count INTEGER NOT NULL DEFAULT 1,
    execution_id TEXT,
    recorded_at REAL NOT NULL,
    said_at REAL,
    settled_at REAL,
    PRIMARY KEY (schedule_id, scheduled_at)
);
CREATE INDEX schedule_firings_by_execution ON schedule_firings(execution_id);
CREATE TABLE trigger_deliveries (
    schedule_id TEXT NOT NULL,
    signature TEXT NOT NULL,
    received_at REAL NOT NULL,
    PRIMARY KEY (schedule_id, signature)
);
"""

# Version 14: a project's forge (GitHub or GitLab: where its pull requests are opened, and the
# owner's token for it, which nothing prints) and the pull request each conversation opened, so
# later turns update it rather than open another (see hub.forges).
_V14_FORGES = """
CREATE TABLE project_forges (
    project TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('github', 'gitlab')),
    base_url TEXT NOT NULL,
    repo TEXT NOT NULL,
    token TEXT NOT NULL,
    set_by TEXT NOT NULL,
    set_at REAL NOT NULL
);
CREATE TABLE pull_requests (
    session_id TEXT PRIMARY KEY,
    project TEXT NOT NULL,
    number INTEGER NOT NULL,
    url TEXT NOT NULL,
    opened_by TEXT NOT NULL,
    opened_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
"""

# Version 15: each person's own Feishu user access token, sealed (see hub.user_tokens); the
# scopes are in clear so a card can show them without opening the token.
_V15_USER_TOKENS = """
CREATE TABLE user_tokens (
    principal_id TEXT PRIMARY KEY REFERENCES principals(id) ON DELETE CASCADE,
    sealed BLOB NOT NULL,
    scopes TEXT NOT NULL,
    connected_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
"""

# Version 16: a project's forge token sealed like a user token (see hub.forges); ``token`` keeps
# only what an older version wrote in the clear, until the Hub seals it at its next start.
_V16_SEALED_FORGE_TOKENS = """
ALTER TABLE project_forges ADD COLUMN sealed BLOB;
"""

# Version 17: the model a conversation's next turns ask their Agent for (``/model`` in its
# topic; NULL: the Agent's own default), and the conversation a side question's Session forks
# (``/btw``; NULL: none).
_V17_SESSION_MODELS = """
ALTER TABLE sessions ADD COLUMN model TEXT;
ALTER TABLE sessions ADD COLUMN fork_of TEXT;
"""

MIGRATIONS: tuple[tuple[int, Step], ...] = (
    (1, _V1_IDENTITY_AND_SETTINGS),
    (2, _queue_with_request_ids),
    (3, _V3_MEMORY_LOG),
    (4, _V4_SESSION_WORKSPACES),
    (5, _V5_FEISHU_ALIASES_WAIT_FOR_THE_TENANT),
    (6, _V6_EXECUTIONS_RUN_AS),
    (7, _V7_APPROVALS),
    (8, _V8_USAGE),
    (9, _V9_BUDGET_EXTENSIONS),
    (10, _V10_PROJECTS),
    (11, _V11_DISPLAY_NAMES),
    (12, _V12_STOPS_AND_EXTENSION_REQUESTS),
    (13, _V13_SCHEDULES),
    (14, _V14_FORGES),
    (15, _V15_USER_TOKENS),
    (16, _V16_SEALED_FORGE_TOKENS),
    (17, _V17_SESSION_MODELS),
)

SCHEMA_VERSION = sqlite.latest(MIGRATIONS)


def migrate(db: sqlite3.Connection, path: Path) -> int:
    """Bring the state database to ``SCHEMA_VERSION``; returns the version it had before.

    Raises:
        Unavailable: a newer amux wrote the database.
    """
    return sqlite.migrate(db, path, MIGRATIONS, name="the state database")
