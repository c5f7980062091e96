"""The Hub's state database, and the identity and settings rows in it.

This module opens ``state.sqlite3`` (bringing its schema up to date, see ``hub.migrations``,
which defines every table and names each one's owner) and owns the rows of ``principals``,
``aliases``, ``credentials``, ``credential_launches`` and ``settings``. The same connection
serves the other owners: ``hub.executions`` (sessions, executions, their events, workers),
``hub.approvals`` (approvals, session rules) and ``hub.history`` (the memory change log). The
settings table is a key-value store: what each key means belongs to the one module that writes it
(``hub.sysconfig`` the Hub's settings, ``hub.aliases`` ``feishu.app``, ``hub.preferences`` the
bot's ``bot.`` keys). Callers outside hub/ never reach these rows: the bot's doors are
``hub.people`` (principals and aliases) and ``hub.preferences``, on ``hub.services.Hub``.

Queries are short and indexed, so they run on the event loop; WAL mode lets the local admin
commands (``amux principal …``, ``amux token …``) work while the Hub is serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import sqlite3
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hub import sqlite
from hub.errors import Conflict, InvalidArgument, NotFound
from hub.migrations import migrate
from hub.principals import Principal as Principal
from hub.storage import from_sqlite_error, refused

TOKEN_PREFIX = "amux_"
T = TypeVar("T")


def no_such_credential(credential_id: str) -> NotFound:
    """The answer for a credential that does not exist, or that the caller may not see."""
    return NotFound(f"no credential with id '{credential_id}'")


def hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough to make a stolen database useless.
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Credential:
    id: str
    principal_id: str
    kind: str
    binding: str | None
    label: str
    expires_at: float | None
    revoked_at: float | None
    created_at: float

    def to_wire(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": self.kind,
            "binding": self.binding,
            "label": self.label,
            "expires_at": self.expires_at,
            "revoked": self.revoked_at is not None,
            "created_at": self.created_at,
        }


def name_key(name: str) -> str:
    """What two principal names are compared by: NFC, case-folded (folding may decompose)."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold())


def _invisible(ch: str) -> bool:
    """A control, format (zero-width, bidi), separator, private-use or unassigned character."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp")


def _principal(row: sqlite3.Row) -> Principal:
    return Principal(
        row["id"], row["name"], row["kind"], bool(row["is_owner"]), row["display_name"]
    )


def _credential(row: sqlite3.Row) -> Credential:
    return Credential(
        row["id"],
        row["principal_id"],
        row["kind"],
        row["binding"],
        row["label"],
        row["expires_at"],
        row["revoked_at"],
        row["created_at"],
    )


class State:
    """One connection to the Hub's state database."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        self.db = sqlite.connect(path, durable=True)
        path.chmod(0o600)
        self.db.row_factory = sqlite3.Row
        try:
            migrate(self.db, path)
        except BaseException:
            self.db.close()
            raise
        # Bumped on every revocation through this connection, so caches of credentials can tell.
        self.credential_changes = 0
        # Writes waiting for the next shared commit (see ``write``).
        self._writes: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []

    def close(self) -> None:
        self.db.close()

    def commits_elsewhere(self) -> int:
        """A number that changes whenever another connection (another process, such as a local
        ``amux token revoke``) commits to this database; one pragma, no table read."""
        return self.db.execute("PRAGMA data_version").fetchone()[0]  # type: ignore[no-any-return]

    async def write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` in a transaction shared with the other writes queued this moment.

        Each commit syncs the WAL, on the event loop. Under a burst one commit covers every
        write queued while the last one ran instead of one sync each; each caller is answered
        only after the commit that holds its write. ``work`` runs in a savepoint of its own, so
        its exception undoes its writes alone and is raised to its caller.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._writes.append((work, future))
        if len(self._writes) == 1:
            loop.call_soon(self._commit_writes)
        result: T = await future
        return result

    def _commit_writes(self) -> None:
        batch, self._writes = self._writes, []
        outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        try:
            with self.transaction():
                for work, future in batch:
                    if future.cancelled():
                        continue
                    try:
                        with self.transaction():
                            result = work(self.db)
                    except Exception as error:
                        outcomes.append((future, None, error))
                    else:
                        outcomes.append((future, result, None))
        except Exception as error:  # the transaction failed as a whole: nothing was written
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for future, result, failure in outcomes:
            if future.done():
                continue
            if failure is not None:
                future.set_exception(failure)
            else:
                future.set_result(result)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One transaction; inside another, a savepoint of it, so steps can be grouped into one
        commit (one WAL sync) and a failed step still undoes only its own writes.

        Raises: StorageUnavailable: the database's disk is full, read-only or failing; nothing
        of the transaction was written.
        """
        try:
            if self.db.in_transaction:
                self.db.execute("SAVEPOINT amux_step")
                try:
                    yield self.db
                except BaseException:
                    # A full disk or an I/O error may have rolled the whole transaction back.
                    if self.db.in_transaction:
                        self.db.execute("ROLLBACK TO amux_step")
                        self.db.execute("RELEASE amux_step")
                    raise
                self.db.execute("RELEASE amux_step")
                return
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
                self.db.execute("COMMIT")
            except BaseException:
                # A COMMIT that failed for want of space leaves the transaction open unless
                # SQLite rolled it back itself; left open, every later write would fail too.
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
        except sqlite3.Error as err:
            failure = from_sqlite_error(err)
            if failure is None:
                raise
            raise refused(failure, self.path) from None

    # -- principals ------------------------------------------------------------------------------

    def add_principal(self, name: str, kind: str = "user", owner: bool = False) -> Principal:
        """Add a Principal under ``name`` in Unicode NFC. Names are one name whatever their case
        or composition (``name_key``): ``Alice`` is taken once ``alice`` is. Names an older Hub
        stored are kept as they are; the rule applies to new ones.

        Raises: Conflict: the name is taken. InvalidArgument: bad name or kind.
        """
        name = unicodedata.normalize("NFC", name.strip())
        if not name or len(name) > 128 or any(ch.isspace() for ch in name):
            raise InvalidArgument("a principal name is 1-128 characters without spaces")
        if any(_invisible(ch) for ch in name):
            raise InvalidArgument(
                "a principal name must not contain control or invisible characters",
                name=name.encode("utf-8", "surrogatepass").hex(),
            )
        if kind not in ("user", "service"):
            raise InvalidArgument("a principal is a 'user' or a 'service'")
        principal = Principal(uuid.uuid4().hex, name, kind, owner)
        key = name_key(name)
        try:
            with self.transaction() as db:
                for (taken,) in db.execute("SELECT name FROM principals"):
                    if name_key(taken) == key:
                        raise Conflict(f"a principal named '{taken}' already exists", name=taken)
                db.execute(
                    "INSERT INTO principals (id, name, kind, is_owner, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (principal.id, name, kind, int(owner), time.time()),
                )
        except sqlite3.IntegrityError:
            raise Conflict(f"a principal named '{name}' already exists") from None
        return principal

    def principal(self, principal_id: str) -> Principal | None:
        row = self.db.execute("SELECT * FROM principals WHERE id = ?", (principal_id,)).fetchone()
        return _principal(row) if row else None

    def principal_by_name(self, name: str) -> Principal:
        """The Principal named exactly ``name``, or else its NFC form (names are stored so).

        Raises: NotFound: no principal has that name.
        """
        row = self.db.execute("SELECT * FROM principals WHERE name = ?", (name,)).fetchone()
        if row is None and not name.isascii():
            composed = unicodedata.normalize("NFC", name)
            row = self.db.execute("SELECT * FROM principals WHERE name = ?", (composed,)).fetchone()
        if row is None:
            raise NotFound(f"no principal named '{name}'")
        return _principal(row)

    def principals(self) -> list[Principal]:
        rows = self.db.execute("SELECT * FROM principals ORDER BY created_at, name").fetchall()
        return [_principal(row) for row in rows]

    def owner(self) -> Principal | None:
        row = self.db.execute(
            "SELECT * FROM principals WHERE is_owner = 1 ORDER BY created_at LIMIT 1"
        ).fetchone()
        return _principal(row) if row else None

    def set_display_name(self, principal_id: str, display_name: str, at: float) -> None:
        """Record how people know ``principal_id`` (already cleaned) and when it was read."""
        with self.transaction() as db:
            db.execute(
                "UPDATE principals SET display_name = ?, display_name_at = ? WHERE id = ?",
                (display_name, at, principal_id),
            )

    def display_name_at(self, principal_id: str) -> float:
        """When the display name of ``principal_id`` was last read (0: never)."""
        row = self.db.execute(
            "SELECT display_name_at FROM principals WHERE id = ?", (principal_id,)
        ).fetchone()
        return float(row[0]) if row else 0.0

    def set_owner(self, principal_id: str, owner: bool) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE principals SET is_owner = ? WHERE id = ?", (int(owner), principal_id)
            )

    # -- aliases ---------------------------------------------------------------------------------

    def add_alias(self, principal_id: str, kind: str, value: str) -> None:
        """Raises: Conflict: the alias already belongs to another principal."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT principal_id FROM aliases WHERE kind = ? AND value = ?", (kind, value)
            ).fetchone()
            if row is not None:
                if row["principal_id"] == principal_id:
                    return
                raise Conflict(f"the {kind} alias already belongs to another principal")
            db.execute(
                "INSERT INTO aliases (kind, value, principal_id, created_at) VALUES (?, ?, ?, ?)",
                (kind, value, principal_id, time.time()),
            )

    def move_alias(self, kind: str, value: str, principal_id: str) -> None:
        """Point an alias at ``principal_id``, taking it from whoever had it."""
        with self.transaction() as db:
            db.execute("DELETE FROM aliases WHERE kind = ? AND value = ?", (kind, value))
            db.execute(
                "INSERT INTO aliases (kind, value, principal_id, created_at) VALUES (?, ?, ?, ?)",
                (kind, value, principal_id, time.time()),
            )

    def rekind_aliases(self, kind: str, new_kind: str) -> list[str]:
        """Give every alias of ``kind`` the kind ``new_kind``, keeping value and holder.

        An alias whose ``new_kind`` twin belongs to another principal stays as it was; returns
        the ids of those holders.
        """
        with self.transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO aliases (kind, value, principal_id, created_at) "
                "SELECT ?, value, principal_id, created_at FROM aliases WHERE kind = ?",
                (new_kind, kind),
            )
            db.execute(
                "DELETE FROM aliases WHERE kind = ? AND EXISTS (SELECT 1 FROM aliases b "
                "WHERE b.kind = ? AND b.value = aliases.value "
                "AND b.principal_id = aliases.principal_id)",
                (kind, new_kind),
            )
            rows = db.execute(
                "SELECT principal_id FROM aliases WHERE kind = ? ORDER BY principal_id", (kind,)
            ).fetchall()
        return [row["principal_id"] for row in rows]

    def principal_by_alias(self, kind: str, value: str) -> Principal | None:
        row = self.db.execute(
            "SELECT p.* FROM aliases a JOIN principals p ON p.id = a.principal_id "
            "WHERE a.kind = ? AND a.value = ?",
            (kind, value),
        ).fetchone()
        return _principal(row) if row else None

    def alias_holders(self, kind: str) -> list[tuple[str, Principal]]:
        """Every alias of ``kind`` with its Principal, newest first."""
        rows = self.db.execute(
            "SELECT a.value AS alias_value, p.* FROM aliases a "
            "JOIN principals p ON p.id = a.principal_id "
            "WHERE a.kind = ? ORDER BY a.created_at DESC, a.value",
            (kind,),
        ).fetchall()
        return [(row["alias_value"], _principal(row)) for row in rows]

    def aliases(self, principal_id: str) -> list[tuple[str, str]]:
        rows = self.db.execute(
            "SELECT kind, value FROM aliases WHERE principal_id = ? ORDER BY kind, value",
            (principal_id,),
        ).fetchall()
        return [(row["kind"], row["value"]) for row in rows]

    # -- credentials -----------------------------------------------------------------------------

    def issue_credential(
        self,
        principal_id: str,
        kind: str = "cli",
        *,
        binding: str | None = None,
        label: str = "",
        expires_at: float | None = None,
        issued_by: str | None = None,
    ) -> tuple[str, Credential]:
        """Create a credential; the token is returned once and only its hash is stored."""
        token = new_token()
        credential = Credential(
            uuid.uuid4().hex[:16], principal_id, kind, binding, label, expires_at, None, time.time()
        )
        with self.transaction() as db:
            db.execute(
                "INSERT INTO credentials (id, principal_id, token_hash, kind, binding, label, "
                "issued_by, expires_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    credential.id,
                    principal_id,
                    hash_token(token),
                    kind,
                    binding,
                    label,
                    issued_by,
                    expires_at,
                    credential.created_at,
                ),
            )
        return token, credential

    def credential_by_token(self, token: str) -> tuple[Credential, Principal] | None:
        row = self.db.execute(
            "SELECT c.*, p.name AS p_name, p.kind AS p_kind, p.is_owner AS p_owner, "
            "p.display_name AS p_display_name "
            "FROM credentials c JOIN principals p ON p.id = c.principal_id "
            "WHERE c.token_hash = ?",
            (hash_token(token),),
        ).fetchone()
        if row is None:
            return None
        principal = Principal(
            row["principal_id"],
            row["p_name"],
            row["p_kind"],
            bool(row["p_owner"]),
            row["p_display_name"],
        )
        return _credential(row), principal

    def credentials(self, principal_id: str | None = None) -> list[Credential]:
        if principal_id is None:
            rows = self.db.execute("SELECT * FROM credentials ORDER BY created_at").fetchall()
        else:
            rows = self.db.execute(
                "SELECT * FROM credentials WHERE principal_id = ? ORDER BY created_at",
                (principal_id,),
            ).fetchall()
        return [_credential(row) for row in rows]

    def credential_issuer(self, credential_id: str) -> str | None:
        """Raises: NotFound: no credential has that id."""
        row = self.db.execute(
            "SELECT issued_by FROM credentials WHERE id = ?", (credential_id,)
        ).fetchone()
        if row is None:
            raise no_such_credential(credential_id)
        return row["issued_by"]  # type: ignore[no-any-return]

    def revoke_credential(self, credential_id: str) -> Credential:
        """Raises: NotFound: no credential has that id."""
        with self.transaction() as db:
            cursor = db.execute(
                "UPDATE credentials SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?",
                (time.time(), credential_id),
            )
            if cursor.rowcount == 0:
                raise no_such_credential(credential_id)
            row = db.execute("SELECT * FROM credentials WHERE id = ?", (credential_id,)).fetchone()
        self.credential_changes += 1
        return _credential(row)

    def record_launch(self, credential_id: str, session_id: str, execution_id: str | None) -> None:
        """Remember which launch a delegated credential was issued for (for the change log)."""
        self.db.execute(
            "INSERT OR REPLACE INTO credential_launches (credential_id, session_id, execution_id) "
            "VALUES (?, ?, ?)",
            (credential_id, session_id, execution_id),
        )

    def credential_launch(self, credential_id: str) -> tuple[str, str | None] | None:
        """The (Session id, execution id) a delegated credential was issued for, if recorded."""
        row = self.db.execute(
            "SELECT session_id, execution_id FROM credential_launches WHERE credential_id = ?",
            (credential_id,),
        ).fetchone()
        return (row["session_id"], row["execution_id"]) if row else None

    # -- settings --------------------------------------------------------------------------------

    def saved_settings(self) -> dict[str, object]:
        """Every saved setting by key, its value as the JSON it was saved as: callers check
        the shape they expect, since the bot keeps its own keys here too."""
        rows = self.db.execute("SELECT key, value FROM settings").fetchall()
        return {row["key"]: json.loads(row["value"]) for row in rows}

    def save_setting(self, key: str, value: object) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO settings (key, value, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
                "updated_at = excluded.updated_at",
                (key, json.dumps(value), time.time()),
            )
