"""Provenance of memory: who changed which document how, the old bodies kept for a while, undo
and erase.

Rules:

- Every successful upsert, forget, restore and erase is one entry of the change log in the state
  database: scope, path, action, previous and new revision, size, time, the acting Principal,
  how the call came (``cli``, ``mcp``, ``card``, ``rpc``) and, for a delegated Agent credential,
  the Session and execution it was issued for. Metadata only: a body never goes to SQLite.
- Before a document is overwritten or forgotten its body is kept as a plain file named by its
  revision, ``<AMUX_HOME>/memory-history/<scope dirs>/<path>/<revision>`` (mode 0600; the
  replaced file itself under a second name where it can be, else a copy written durably like the
  memory root), for ``memory.history_days`` days (0 keeps none). Copies beyond
  4 × the scope quota go oldest first. History is outside the memory root: search, get and the
  quotas never see it.
- A restore writes a kept body back as an ordinary conditional upsert.
- An erase removes the document(s) and every history copy and replaces the path of the scope's
  log entries by a marker; afterwards no copy of the text is left in the memory root, the history
  or the state database.
- Under isolation every scope has one Principal and history, restore and erase act on the whole
  scope. In the one global scope (isolation off) history shows the caller's own entries only; a
  restore brings back any body a change replaced, whoever made the change or wrote the body,
  since anyone may write that scope. An erase there removes only what the caller wrote, and only
  documents nobody else changed: a path whose log has another Principal's change too is kept
  whole (document, copies, log entries) and named in the receipt. The owner erasing with its own
  credential is no exception; only the owner's erase of one named Principal
  (``erase_principal``) removes the documents whose current body that Principal wrote, whoever
  else changed them before, since leaving that text behind would defeat it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from hub.contract import MEMORY, ExecutionEvent
from hub.errors import InvalidArgument, NotFound
from hub.files import MemoryFiles
from hub.limits import Limits
from hub.paths import GLOBAL_SCOPE, principal_scope, scope_directory, validate_path
from hub.state import State
from hub.storage import MEMORY_HISTORY
from hub.store import ABSENT, Forgotten, MemoryStore, Written, revision_of

logger = logging.getLogger("amux.hub.history")

# How a change came: the amux CLI, ``amux mcp``, a Feishu card, or any other RPC caller.
Via = Literal["cli", "mcp", "card", "rpc"]
VIAS: tuple[Via, ...] = ("cli", "mcp", "card", "rpc")
Action = Literal["upsert", "forget", "restore", "erase"]
ERASED = "[erased]"
DAY = 86400.0
MAX_HISTORY_LIMIT = 200
# A restore names a kept revision whole or by a unique prefix of at least 12 hex digits: what
# ``amux memory history`` prints.
MIN_REVISION_PREFIX = 12
REVISION_PREFIX = re.compile(rf"^[0-9a-f]{{{MIN_REVISION_PREFIX},64}}$")
# Why a shared-scope erase kept a path (see the module's rules).
KEPT = "someone else changed it too: in shared memory, erase removes only what nobody else changed"
NOT_ERASED = (
    "Transcripts the Agents keep natively are conversation history, not memory: they are not "
    "erased."
)


def via_of(text: str) -> Via:
    """The route a caller named, or ``rpc`` for anything that is not one of ours."""
    for via in VIAS:
        if via == text:
            return via
    return "rpc"


@dataclass(frozen=True)
class Author:
    """Who makes a change and how it came: the Principal, the route, and the launch if any."""

    principal_id: str
    via: Via = "rpc"
    session_id: str | None = None
    execution_id: str | None = None


@dataclass(frozen=True)
class LogEntry:
    """One change of the log as callers see it."""

    id: int
    path: str
    action: Action
    previous_revision: str | None
    new_revision: str | None
    size_bytes: int
    at: float
    principal_id: str
    # The Principal's name, None once it is gone.
    principal: str | None
    via: Via
    session_id: str | None
    execution_id: str | None
    # Until when the body before this change is kept to restore; None when it is not.
    restorable_until: float | None

    @property
    def restorable(self) -> bool:
        return self.restorable_until is not None

    def to_wire(self) -> dict[str, object]:
        return {
            "id": self.id,
            "path": self.path,
            "action": self.action,
            "previous_revision": self.previous_revision,
            "new_revision": self.new_revision,
            "size_bytes": self.size_bytes,
            "at": self.at,
            "principal_id": self.principal_id,
            "principal": self.principal,
            "via": self.via,
            "session_id": self.session_id,
            "execution_id": self.execution_id,
            "restorable": self.restorable,
            "restorable_until": self.restorable_until,
        }


@dataclass(frozen=True)
class LogPage:
    """A page of the log, newest first; ``next_before`` continues it."""

    entries: tuple[LogEntry, ...]
    next_before: int | None
    history_days: float

    def to_wire(self) -> dict[str, object]:
        return {
            "entries": [entry.to_wire() for entry in self.entries],
            "next_before": self.next_before,
            "history_days": self.history_days,
        }


@dataclass(frozen=True)
class Receipt:
    """What an erase removed, and the paths it kept because someone else changed them too."""

    documents_removed: int
    history_copies_removed: int
    log_entries_redacted: int
    kept: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, object]:
        return {
            "documents_removed": self.documents_removed,
            "history_copies_removed": self.history_copies_removed,
            "log_entries_redacted": self.log_entries_redacted,
            "kept": [{"path": path, "reason": KEPT} for path in self.kept],
            "not_erased": NOT_ERASED,
        }


class MemoryHistory:
    """The change log (state database) and the kept bodies (``memory-history``) of one Hub."""

    def __init__(
        self, state: State, store: MemoryStore, root: Path, days: float, limits: Limits
    ) -> None:
        self._state = state
        self._store = store
        self.root = root
        self.days = max(0.0, float(days))
        self._limits = limits
        self.files = MemoryFiles(root, cache_bytes=0, disk=MEMORY_HISTORY)
        # Per scope, the copies kept and their bytes as last counted plus what was kept since:
        # a write then checks the bound without summing the scope's whole log again.
        self._kept: dict[str, tuple[int, int]] = {}
        # Pages freed by an erase are zeroed, so a redacted path leaves no trace in the file.
        state.db.execute("PRAGMA secure_delete = ON")

    @property
    def enabled(self) -> bool:
        return self.days > 0

    def open(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.files.ensure_root()
        self.files.sweep_temp_files()
        if self.enabled:
            # The store calls this in its write thread, under the scope lock, before the old
            # body is replaced or removed: a crash leaves the copy, never a lost body.
            self._store.history_keeper = self._keep

    # -- keeping ---------------------------------------------------------------------------------

    def _copy_parts(self, scope: str, path: str, revision: str) -> tuple[str, ...]:
        return scope_directory(scope) + tuple(path.split("/")) + (revision,)

    def _keep(self, scope: str, parts: tuple[str, ...], data: bytes) -> Callable[[], None]:
        full = scope_directory(scope) + parts
        return self.files.keep_copy(self._store.files, full, full + (revision_of(data),), data)

    def record(
        self,
        scope: str,
        path: str,
        action: Action,
        author: Author,
        previous: str | None,
        new: str | None,
        size: int,
        kept_bytes: int | None,
    ) -> int:
        cursor = self._state.db.execute(
            "INSERT INTO memory_log (scope, path, action, previous_revision, new_revision, "
            "size_bytes, at, principal_id, via, session_id, execution_id, history_bytes) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                scope,
                path,
                action,
                previous,
                new,
                size,
                time.time(),
                author.principal_id,
                author.via,
                author.session_id,
                author.execution_id,
                kept_bytes if self.enabled else None,
            ),
        )
        return int(cursor.lastrowid or 0)

    # -- changes ---------------------------------------------------------------------------------

    async def upsert(
        self,
        scope: str,
        path: object,
        content: object,
        expected_revision: object,
        author: Author,
        action: Action = "upsert",
    ) -> Written:
        """``MemoryStore.upsert``, logged when it changed the document. Raises what it raises.

        The change log's row is committed while the document is written and synced, and both are
        durable before this returns; a write that fails after its row was committed takes the row
        back out, so the log never shows a change a caller was told failed.
        """
        previous = str(expected_revision)
        rows: list[int] = []
        sizes: list[int] = []

        async def log(written: Written, current: bytes | None) -> None:
            size = len(str(content).encode("utf-8"))
            kept = len(current) if self.enabled and current is not None else None
            if kept is not None:
                sizes.append(kept)
            # Through the shared commit: writers on other scopes then share its sync.
            rows.append(
                await self._state.write(
                    lambda _db: self.record(
                        scope,
                        written.path,
                        action,
                        author,
                        None if previous == ABSENT else previous,
                        written.revision,
                        size,
                        kept,
                    )
                )
            )

        try:
            written = await self._store.upsert(scope, path, content, expected_revision, log)
        except Exception:
            if rows:
                await self._state.write(
                    lambda db: db.execute("DELETE FROM memory_log WHERE id = ?", (rows[0],))
                )
            raise
        if sizes:
            await self._bound(scope, sizes[0])
        return written

    def _kept_size(self, scope: str, path: str, revision: str) -> int | None:
        """The size of the copy the store kept of ``revision``; None when history is off."""
        if not self.enabled:
            return None
        try:
            return self.root.joinpath(*self._copy_parts(scope, path, revision)).stat().st_size
        except OSError:
            return None

    async def forget(
        self, scope: str, path: object, expected_revision: object, author: Author
    ) -> Forgotten:
        """``MemoryStore.forget``, logged. Raises what it raises."""
        forgotten = await self._store.forget(scope, path, expected_revision)
        if not forgotten.already_absent:
            size = self._kept_size(scope, forgotten.path, str(expected_revision))
            await self._state.write(
                lambda _db: self.record(
                    scope, forgotten.path, "forget", author, str(expected_revision), None, 0, size
                )
            )
            if size is not None:
                await self._bound(scope, size)
        return forgotten

    async def restore(
        self,
        scope: str,
        path: object,
        revision: object,
        expected_revision: object,
        author: Author,
    ) -> Written:
        """Write a kept body back as an ordinary conditional upsert. ``revision`` is the whole
        revision or a unique prefix of it (at least 12 hex digits).

        Raises:
            InvalidArgument: ``revision`` is no such prefix, or names more than one kept copy.
            NotFound: no copy of that revision is kept for this path.
            Conflict: the document is no longer at ``expected_revision``.
        """
        logical = "/".join(validate_path(path, self._limits))
        revision = self._kept_revision(scope, logical, revision)
        data = await asyncio.to_thread(self.files.read, self._copy_parts(scope, logical, revision))
        if data is None or revision_of(data) != revision:
            raise NotFound(
                f"the copy of revision {revision[:12]} of '{logical}' is no longer kept",
                path=logical,
                revision=revision,
            )
        content = data.decode("utf-8")
        return await self.upsert(scope, logical, content, expected_revision, author, "restore")

    def _kept_revision(self, scope: str, path: str, revision: object) -> str:
        """The one revision of ``path`` kept to restore that ``revision`` names, whole or by a
        prefix. Whoever changed the document, and whoever wrote the body it replaced: anyone who
        may write the scope may put a replaced body back (in the shared scope, anyone)."""
        if not isinstance(revision, str) or not REVISION_PREFIX.match(revision):
            raise InvalidArgument(
                f"revision must be a revision or a prefix of at least {MIN_REVISION_PREFIX} "
                "hex digits, as amux memory history prints it",
                revision=revision,
            )
        rows = self._state.db.execute(
            "SELECT DISTINCT previous_revision FROM memory_log WHERE scope = ? AND path = ? "
            "AND history_bytes IS NOT NULL AND substr(previous_revision, 1, ?) = ?",
            (scope, path, len(revision), revision),
        ).fetchall()
        if not rows:
            raise NotFound(
                f"no kept copy of revision {revision[:12]} of '{path}'",
                path=path,
                revision=revision,
            )
        if len(rows) > 1:
            raise InvalidArgument(
                f"revision {revision} names {len(rows)} kept copies of '{path}'; give more digits",
                path=path,
                revision=revision,
                revisions=sorted(str(row[0]) for row in rows),
            )
        return str(rows[0][0])

    # -- reading the log -------------------------------------------------------------------------

    def entries(
        self,
        scope: str,
        principal_id: str,
        path: object = None,
        limit: int = 50,
        before: int | None = None,
    ) -> LogPage:
        """The scope's log, newest first (in the global scope only the caller's own entries)."""
        sql = "SELECT * FROM memory_log WHERE scope = ?"
        args: list[Any] = [scope]
        if path is not None:
            sql += " AND path = ?"
            args.append("/".join(validate_path(path, self._limits)))
        if scope == GLOBAL_SCOPE:
            sql += " AND principal_id = ?"
            args.append(principal_id)
        if before is not None:
            sql += " AND id < ?"
            args.append(before)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(min(max(1, limit), MAX_HISTORY_LIMIT) + 1)
        rows = self._state.db.execute(sql, args).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        return LogPage(
            tuple(self._entry(row) for row in rows),
            rows[-1]["id"] if more and rows else None,
            self.days,
        )

    def authored(
        self,
        scope: str,
        principal_id: str,
        path: str,
        revision: str | None,
        previous: str | None,
    ) -> bool:
        """Whether the log holds a change ``principal_id`` made in ``scope`` that took ``path``
        from ``previous`` to ``revision`` (None: no document)."""
        row = self._state.db.execute(
            "SELECT 1 FROM memory_log WHERE scope = ? AND path = ? AND principal_id = ? "
            "AND new_revision IS ? AND previous_revision IS ? LIMIT 1",
            (scope, path, principal_id, revision, previous),
        ).fetchone()
        return row is not None

    def _entry(self, row: sqlite3.Row) -> LogEntry:
        restorable_until = (
            row["at"] + self.days * DAY
            if row["history_bytes"] is not None and row["previous_revision"]
            else None
        )
        return LogEntry(
            id=row["id"],
            path=row["path"],
            action=row["action"],
            previous_revision=row["previous_revision"],
            new_revision=row["new_revision"],
            size_bytes=row["size_bytes"],
            at=row["at"],
            principal_id=row["principal_id"],
            principal=self._name_of(row["principal_id"]),
            via=row["via"],
            session_id=row["session_id"],
            execution_id=row["execution_id"],
            restorable_until=restorable_until,
        )

    def _name_of(self, principal_id: str) -> str | None:
        principal = self._state.principal(principal_id)
        return principal.label if principal is not None else None

    # -- erasing ---------------------------------------------------------------------------------

    async def erase(
        self,
        scope: str,
        path: object,
        author: Author,
        subject: str | None = None,
        spare_shared: bool = True,
    ) -> Receipt:
        """Erase one document (``path``) or, with ``path`` None, the whole scope: in the global
        scope only what ``subject`` (default: the author) wrote and, with ``spare_shared``, none
        of the paths someone else changed too (see the module's rules)."""
        logical = None if path is None else "/".join(validate_path(path, self._limits))
        shared = scope == GLOBAL_SCOPE
        whose = subject or author.principal_id
        owned: set[str] | None = None
        spare: frozenset[str] = frozenset()
        if shared:
            owned = self._written_by(scope, logical, whose)
            if spare_shared:
                spare = self._changed_by_others(scope, logical, whose)
        if logical is not None and logical in spare:
            documents = copies = redacted = 0
        else:
            documents = await self._store.erase(scope, logical, owned, spare)
            copies = await asyncio.to_thread(self._remove_copies, scope, logical, owned, spare)
            where, args = self._erased_entries(scope, logical, whose, spare)
            redacted = self._state.db.execute(
                f"UPDATE memory_log SET path = ?, history_bytes = NULL WHERE {where}",
                [ERASED, *args],
            ).rowcount
            self._kept.pop(scope, None)
            self._redact_turn_events(scope, logical, whose, spare)
        self.record(scope, ERASED, "erase", author, None, None, 0, None)
        self._scrub()
        return Receipt(documents, copies, redacted, tuple(sorted(spare)))

    async def erase_principal(self, principal_id: str, author: Author) -> Receipt:
        """Everything of one Principal: its own scope, and what it wrote in the global one."""
        own = await self.erase(principal_scope(principal_id), None, author, principal_id)
        shared = await self.erase(GLOBAL_SCOPE, None, author, principal_id, spare_shared=False)
        return Receipt(
            own.documents_removed + shared.documents_removed,
            own.history_copies_removed + shared.history_copies_removed,
            own.log_entries_redacted + shared.log_entries_redacted,
        )

    async def preview_erase(self, scope: str, path: object, principal_id: str) -> Receipt:
        """What ``erase`` would remove now, removing nothing: for a confirmation that states it."""
        logical = None if path is None else "/".join(validate_path(path, self._limits))
        owned: set[str] | None = None
        spare: frozenset[str] = frozenset()
        if scope == GLOBAL_SCOPE:
            owned = self._written_by(scope, logical, principal_id)
            spare = self._changed_by_others(scope, logical, principal_id)
        if logical is not None and logical in spare:
            return Receipt(0, 0, 0, (logical,))
        documents = await asyncio.to_thread(self._count_documents, scope, logical, owned, spare)
        copies = await asyncio.to_thread(self._count_copies, scope, logical, owned, spare)
        where, args = self._erased_entries(scope, logical, principal_id, spare)
        entries = self._state.db.execute(
            f"SELECT COUNT(*) FROM memory_log WHERE {where}", args
        ).fetchone()[0]
        return Receipt(documents, copies, int(entries), tuple(sorted(spare)))

    def _changed_by_others(self, scope: str, path: str | None, principal_id: str) -> frozenset[str]:
        """The paths (``path`` or any) this Principal changed that another one changed too."""
        sql = (
            "SELECT DISTINCT path FROM memory_log WHERE scope = ? AND principal_id = ? "
            "AND path != ? AND path IN (SELECT path FROM memory_log WHERE scope = ? "
            "AND principal_id != ?)"
        )
        args: list[Any] = [scope, principal_id, ERASED, scope, principal_id]
        if path is not None:
            sql += " AND path = ?"
            args.append(path)
        return frozenset(row[0] for row in self._state.db.execute(sql, args))

    def _erased_entries(
        self, scope: str, path: str | None, principal_id: str, spare: frozenset[str]
    ) -> tuple[str, list[Any]]:
        """The log entries an erase redacts, as a WHERE clause and its arguments."""
        where = "scope = ?"
        args: list[Any] = [scope]
        if path is not None:
            where += " AND path = ?"
            args.append(path)
        else:
            where += " AND path != ?"
            args.append(ERASED)
        if scope == GLOBAL_SCOPE:
            where += " AND principal_id = ?"
            args.append(principal_id)
        if spare:
            where += f" AND path NOT IN ({', '.join('?' * len(spare))})"
            args += sorted(spare)
        return where, args

    def _count_documents(
        self, scope: str, path: str | None, owned: set[str] | None, spare: frozenset[str]
    ) -> int:
        scope_parts = scope_directory(scope)
        if path is not None:
            bodies = [(path, self._store.files.read(scope_parts + tuple(path.split("/"))))]
        else:
            bodies = [
                ("/".join(document.parts), document.data)
                for document in self._store.files.walk(scope_parts)
            ]
        return sum(
            1
            for logical, body in bodies
            if body is not None
            and logical not in spare
            and (owned is None or revision_of(body) in owned)
        )

    def _count_copies(
        self, scope: str, path: str | None, owned: set[str] | None, spare: frozenset[str]
    ) -> int:
        base = self.root.joinpath(*scope_directory(scope))
        if path is not None:
            base = base.joinpath(*path.split("/"))
        if base.is_symlink() or not base.is_dir():
            return 0
        return sum(
            1
            for directory, _dirs, names in os.walk(base, followlinks=False)
            if _relative(base, directory) not in spare
            for name in names
            if not name.startswith(".") and (owned is None or name in owned)
        )

    def _redact_turn_events(
        self, scope: str, path: str | None, principal_id: str, spare: frozenset[str]
    ) -> None:
        """Replace the erased path in the ``memory`` events of turns that ran in this scope (the
        events a turn's memory calls left, see ``hub.contract.MemoryUse``)."""
        db = self._state.db
        sql = (
            "SELECT e.execution_id, e.seq, e.text FROM execution_events e "
            "JOIN executions x ON x.id = e.execution_id JOIN sessions s ON s.id = x.session_id "
            "WHERE e.kind = 'memory' AND s.binding = ?"
        )
        args: list[Any] = [scope]
        if scope == GLOBAL_SCOPE:
            sql += " AND s.principal_id = ?"
            args.append(principal_id)
        for row in db.execute(sql, args).fetchall():
            use = ExecutionEvent(row["seq"], MEMORY, row["text"], 0.0).memory_use()
            if use is None or use.path == ERASED:
                continue
            if (path is not None and use.path != path) or use.path in spare:
                continue
            erased = replace(use, path=ERASED)
            db.execute(
                "UPDATE execution_events SET text = ? WHERE execution_id = ? AND seq = ?",
                (json.dumps(erased.to_wire()), row["execution_id"], row["seq"]),
            )

    def _written_by(self, scope: str, path: str | None, principal_id: str) -> set[str]:
        sql = (
            "SELECT DISTINCT new_revision FROM memory_log WHERE scope = ? AND principal_id = ? "
            "AND new_revision IS NOT NULL"
        )
        args: list[Any] = [scope, principal_id]
        if path is not None:
            sql += " AND path = ?"
            args.append(path)
        return {row[0] for row in self._state.db.execute(sql, args)}

    def _remove_copies(
        self, scope: str, path: str | None, owned: set[str] | None, spare: frozenset[str]
    ) -> int:
        base = self.root.joinpath(*scope_directory(scope))
        if path is not None:
            base = base.joinpath(*path.split("/"))
        return _remove_tree(base, owned, spare)

    def _scrub(self) -> None:
        # The WAL still holds the pages as they were before the redaction until a checkpoint.
        with contextlib.suppress(sqlite3.Error):
            self._state.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # -- retention -------------------------------------------------------------------------------

    async def _bound(self, scope: str, kept_bytes: int) -> None:
        """Count a copy just kept; prune the scope once it holds more than its bound allows."""
        totals = self._kept.get(scope)
        if totals is None:
            # Counted now, the new copy included: its log entry is committed.
            totals = self._count_kept(scope)
        else:
            totals = (totals[0] + 1, totals[1] + kept_bytes)
        if totals[0] > 4 * self._limits.scope_documents or totals[1] > 4 * self._limits.scope_bytes:
            await self.prune(scope)
        else:
            self._kept[scope] = totals

    def _count_kept(self, scope: str) -> tuple[int, int]:
        count, total = self._state.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(history_bytes), 0) FROM memory_log "
            "WHERE scope = ? AND history_bytes IS NOT NULL",
            (scope,),
        ).fetchone()
        return int(count), int(total)

    async def prune(self, scope: str | None = None) -> int:
        """Drop copies past the window, and beyond 4 × the scope quota oldest first."""
        # Whatever this removes, the next bound check counts afresh.
        if scope is None:
            self._kept.clear()
        else:
            self._kept.pop(scope, None)
        db = self._state.db
        expired: list[sqlite3.Row] = []
        cutoff = time.time() - self.days * DAY
        where = "history_bytes IS NOT NULL" + (" AND scope = ?" if scope else "")
        args: tuple[Any, ...] = (scope,) if scope else ()
        if not self.enabled:
            expired = db.execute(f"SELECT * FROM memory_log WHERE {where}", args).fetchall()
        else:
            expired = db.execute(
                f"SELECT * FROM memory_log WHERE {where} AND at < ?", (*args, cutoff)
            ).fetchall()
            scopes = (
                [scope]
                if scope
                else [
                    row[0]
                    for row in db.execute(f"SELECT DISTINCT scope FROM memory_log WHERE {where}")
                ]
            )
            for name in scopes:
                expired += self._over_bound(name, {row["id"] for row in expired})
        for row in expired:
            db.execute("UPDATE memory_log SET history_bytes = NULL WHERE id = ?", (row["id"],))
        removed = 0
        for row in expired:
            still = db.execute(
                "SELECT 1 FROM memory_log WHERE scope = ? AND path = ? AND previous_revision = ? "
                "AND history_bytes IS NOT NULL LIMIT 1",
                (row["scope"], row["path"], row["previous_revision"]),
            ).fetchone()
            if still is None and row["previous_revision"]:
                parts = self._copy_parts(row["scope"], row["path"], row["previous_revision"])
                keep = len(scope_directory(row["scope"]))
                if await asyncio.to_thread(self.files.delete, parts, keep):
                    removed += 1
        if scope is None:
            # A copy no log entry keeps (a crash between keeping a body and logging its change)
            # must not outlive the window either.
            candidates = await asyncio.to_thread(self._old_copies)
            orphans = [full for full, relative in candidates if not self._is_kept(relative)]
            removed += await asyncio.to_thread(_unlink_all, orphans)
        return removed

    def _old_copies(self) -> list[tuple[str, list[str]]]:
        """History files older than the window (all of them when history is off)."""
        cutoff = time.time() - self.days * DAY
        found: list[tuple[str, list[str]]] = []
        for directory, _dirs, names in os.walk(self.root, followlinks=False):
            for name in names:
                if name.startswith("."):
                    continue
                full = os.path.join(directory, name)
                try:
                    if self.enabled and os.lstat(full).st_mtime >= cutoff:
                        continue
                except OSError:
                    continue
                found.append((full, os.path.relpath(full, self.root).split(os.sep)))
        return found

    def _is_kept(self, relative: list[str]) -> bool:
        # <global | users/<hash>> / <path components> / <revision>
        width = 1 if relative[:1] == ["global"] else 2
        path = "/".join(relative[width:-1])
        row = self._state.db.execute(
            "SELECT scope FROM memory_log WHERE path = ? AND previous_revision = ? "
            "AND history_bytes IS NOT NULL",
            (path, relative[-1]),
        ).fetchall()
        return any(scope_directory(r["scope"]) == tuple(relative[:width]) for r in row)

    def _over_bound(self, scope: str, already: set[int]) -> list[sqlite3.Row]:
        max_bytes = 4 * self._limits.scope_bytes
        max_copies = 4 * self._limits.scope_documents
        count, total = self._count_kept(scope)
        if count <= max_copies and total <= max_bytes:
            # The common case: one aggregate instead of every kept entry as a row.
            return []
        rows = self._state.db.execute(
            "SELECT * FROM memory_log WHERE scope = ? AND history_bytes IS NOT NULL "
            "ORDER BY id DESC",
            (scope,),
        ).fetchall()
        total = 0
        count = 0
        over: list[sqlite3.Row] = []
        for row in rows:
            if row["id"] in already:
                continue
            total += int(row["history_bytes"])
            count += 1
            if total > max_bytes or count > max_copies:
                over.append(row)
        return over

    async def prune_forever(self, every: float = DAY) -> None:
        """Prune now and then once per ``every`` seconds, until cancelled."""
        while True:
            try:
                await self.prune()
            except Exception:
                logger.exception("pruning the memory history failed")
            await asyncio.sleep(every)


def _unlink_all(paths: list[str]) -> int:
    removed = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed += 1
    return removed


def _relative(base: Path, directory: str) -> str:
    """A directory under ``base`` as the memory path whose copies it holds."""
    return os.path.relpath(directory, base).replace(os.sep, "/")


def _remove_tree(base: Path, owned: set[str] | None, spare: frozenset[str] = frozenset()) -> int:
    """Remove the history copies under ``base`` (only those named in ``owned`` when given, none
    of the paths in ``spare``) and the directories left empty; returns how many copies went.
    Never follows a link."""
    removed = 0
    if base.is_symlink() or not base.is_dir():
        return 0
    for directory, dirs, names in os.walk(base, topdown=False, followlinks=False):
        if _relative(base, directory) in spare:
            continue
        for name in names:
            if owned is not None and name not in owned:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
                if not name.startswith("."):
                    removed += 1
        for name in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(directory, name))
        _sync_dir(directory)
    with contextlib.suppress(OSError):
        base.rmdir()
    _sync_dir(str(base.parent))
    return removed


def _sync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        if err.errno == errno.ENOENT:
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
