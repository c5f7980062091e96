"""Who an Agent runs as on this host: never uid 0, and a uid of its own per Principal.

A root worker that let its Agents keep uid 0 hands the host to any of them: sysctls check only
file permissions (``kernel.core_pattern`` makes the kernel run a program as full root), and
kernel objects keyed by uid (the user keyring, POSIX IPC, files in shared places) would be
shared by every Principal's Agents. So a root worker gives each Principal an unprivileged uid of
its own from the range systemd reserves for dynamic users, with no entry in ``/etc/passwd``:
nothing else on the host owns files as that uid, and one Principal's Agents share no
uid-keyed object with another's. The group is the uid's number, so group permissions never
join two Principals either.

The table lives in the worker's work directory (``agent-users.sqlite3``): the worker and the
bot beside it read the same answers, a Principal keeps its uid across restarts (its workspace
and Session homes stay its own), and ``UNIQUE`` makes two Principals sharing one uid impossible
even when two processes allocate at once.

A uid is a host's, not a work directory's: two amux installations on one host (two Hubs, or a
second worker with a work directory of its own) handing out the same number would let one's
Agents read what the other's left in their user keyring or own on disk. Each uid is therefore
also reserved host-wide, in ``HOST_REGISTRY`` (root's, mode 0700, so no Agent uid can write or
read it): which installation (its table's path) and which owner hold it. Allocating and checking
a reservation happen under that registry's write lock, so two installations allocating at once
never pick one number. A reservation outlives its installation's processes (the files its
Agents made stay that uid's), and is reclaimed only when the installation no longer holds it: its
table is gone, or no longer gives that uid to that owner. An installation made before this
registry keeps its uids where no other installation has reserved them first (they are reserved
for it on first use); a Principal whose uid another installation already holds is given a new
one, logged, and the files its Agents made under the old uid stay that uid's until the operator
hands them over (``chown``).

An explicit ``AMUX_RUNTIME_RUN_AS`` names one local user all Agents run as; ``root`` or uid 0
there is refused. A worker that is not root keeps its own uid: its sandbox's user namespace gives
the Agent no privilege over anything the worker does not own.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import logging
import os
import pwd
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from hub.errors import InvalidArgument
from hub.sqlite import Step, connect, migrate

# systemd's DynamicUser range: uids a distribution never hands to a package or a person.
DYNAMIC_UIDS = range(61184, 65520)
REGISTRY = "agent-users.sqlite3"
HOST_REGISTRY = Path("/var/lib/amux-agent-uids/agent-uids.sqlite3")

logger = logging.getLogger("amux.agent_users")

Identity = tuple[int, int]

# Version 1: the table as the first version of this file created it, before versions were kept,
# so a file it left at version 0 holds it already.
_V1_AGENT_USERS = """
CREATE TABLE IF NOT EXISTS agent_users (owner TEXT PRIMARY KEY, uid INTEGER NOT NULL UNIQUE);
"""
MIGRATIONS: tuple[tuple[int, Step], ...] = ((1, _V1_AGENT_USERS),)

_V1_RESERVATIONS = """
CREATE TABLE IF NOT EXISTS reservations (
    uid INTEGER PRIMARY KEY,
    installation TEXT NOT NULL,
    owner TEXT NOT NULL
);
"""
HOST_MIGRATIONS: tuple[tuple[int, Step], ...] = ((1, _V1_RESERVATIONS),)


def _holds(installation: str, owner: str, uid: int) -> bool:
    """Whether ``installation``'s table still gives ``uid`` to ``owner``. One that cannot be
    read is taken to hold it: a reservation is given up only when it is certainly unused."""
    if not os.path.exists(installation):
        return False
    try:
        db = sqlite3.connect(f"file:{installation}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error:
        return True
    try:
        row = db.execute("SELECT uid FROM agent_users WHERE owner = ?", (owner,)).fetchone()
    except sqlite3.Error:
        return True
    finally:
        db.close()
    return row is not None and int(row[0]) == uid


def _taken(uid: int) -> bool:
    """Whether a local account or group already has this number."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except KeyError:
            continue
        return True
    return False


class AgentUsers:
    """The uid each Principal's Agents run as on this host, allocated once and kept."""

    def __init__(
        self, work_dir: Path, uids: range = DYNAMIC_UIDS, host_registry: Path = HOST_REGISTRY
    ) -> None:
        self._path = work_dir / REGISTRY
        self._uids = uids
        self._host = host_registry

    @property
    def _installation(self) -> str:
        return os.path.realpath(self._path)

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Durable: a uid handed out and then forgotten could go to a second Principal, whose
        # Agents would then own the first one's files. The worker and the bot may allocate at
        # once, hence the longer wait for the lock.
        db = connect(self._path, durable=True, timeout=30)
        try:
            migrate(db, self._path, MIGRATIONS, name="the Agent users registry")
            yield db
        finally:
            db.close()

    @contextlib.contextmanager
    def _host_db(self) -> Iterator[sqlite3.Connection]:
        """The host's registry, under its write lock until the block ends."""
        self._host.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Whoever made the directory, no Agent uid may change or read what is in it.
        os.chmod(self._host.parent, 0o700)
        db = connect(self._host, durable=True, timeout=30)
        try:
            migrate(db, self._host, HOST_MIGRATIONS, name="the host's Agent uid registry")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        finally:
            db.close()

    def _reserved_elsewhere(self) -> set[int]:
        """Uids other installations hold (read only, for a plan): none when unreadable."""
        if not self._host.exists():
            return set()
        try:
            db = sqlite3.connect(f"file:{self._host}?mode=ro", uri=True, timeout=30)
        except sqlite3.Error:
            return set()
        try:
            rows = db.execute("SELECT uid, installation FROM reservations").fetchall()
        except sqlite3.Error:
            return set()
        finally:
            db.close()
        return {int(uid) for uid, where in rows if where != self._installation}

    def planned(self, owner: str) -> Identity:
        """(uid, gid) ``owner`` has, or would be given first: nothing is written."""
        key = hashlib.sha256(owner.encode("utf-8")).hexdigest()
        used: set[int] = set()
        if self._path.exists():
            db = sqlite3.connect(f"file:{self._path}?mode=ro", uri=True, timeout=30)
            try:
                row = db.execute("SELECT uid FROM agent_users WHERE owner = ?", (key,)).fetchone()
                if row is not None:
                    return int(row[0]), int(row[0])
                used = {int(r[0]) for r in db.execute("SELECT uid FROM agent_users")}
            except sqlite3.Error:
                pass
            finally:
                db.close()
        used |= self._reserved_elsewhere()
        uid = next((u for u in self._uids if u not in used and not _taken(u)), self._uids.start)
        return uid, uid

    def of(self, owner: str) -> Identity:
        """(uid, gid) for ``owner`` (a Principal id, or a shared directory's key), reserved for
        this installation on the whole host.

        Raises:
            InvalidArgument: every uid of the range is taken.
        """
        key = hashlib.sha256(owner.encode("utf-8")).hexdigest()
        installation = self._installation
        known = self._known(key)
        if known is not None:
            return known, known
        with self._host_db() as host, self._db() as db:
            row = db.execute("SELECT uid FROM agent_users WHERE owner = ?", (key,)).fetchone()
            if row is not None:
                uid = int(row[0])
                holder = host.execute(
                    "SELECT installation, owner FROM reservations WHERE uid = ?", (uid,)
                ).fetchone()
                if (
                    holder is None
                    or tuple(holder) == (installation, key)
                    or not _holds(str(holder[0]), str(holder[1]), uid)
                ):
                    # Ours, or free, or left by an installation that no longer uses it (this
                    # is also where a table made before the host registry has its uids reserved).
                    self._reserve(host, uid, key)
                    return uid, uid
                logger.warning(
                    "uid %s of this installation's table is reserved on this host by %s: its "
                    "owner is given another; chown what its Agents made to the new uid",
                    uid,
                    holder[0],
                )
            uid = self._free(host, db)
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM agent_users WHERE owner = ?", (key,))
                db.execute("INSERT INTO agent_users (owner, uid) VALUES (?, ?)", (key, uid))
                self._reserve(host, uid, key)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return uid, uid

    def _known(self, key: str) -> int | None:
        """``key``'s uid when its table and the host's registry already agree, read without
        taking either lock (every turn asks; a new Principal is rare)."""
        if not (self._path.exists() and self._host.exists()):
            return None
        try:
            db = sqlite3.connect(f"file:{self._path}?mode=ro", uri=True, timeout=30)
            try:
                row = db.execute("SELECT uid FROM agent_users WHERE owner = ?", (key,)).fetchone()
            finally:
                db.close()
            if row is None:
                return None
            host = sqlite3.connect(f"file:{self._host}?mode=ro", uri=True, timeout=30)
            try:
                holder = host.execute(
                    "SELECT installation, owner FROM reservations WHERE uid = ?", (int(row[0]),)
                ).fetchone()
            finally:
                host.close()
        except sqlite3.Error:
            return None
        return (
            int(row[0])
            if holder is not None and tuple(holder) == (self._installation, key)
            else None
        )

    def _reserve(self, host: sqlite3.Connection, uid: int, key: str) -> None:
        host.execute(
            "INSERT OR REPLACE INTO reservations (uid, installation, owner) VALUES (?, ?, ?)",
            (uid, self._installation, key),
        )

    def _free(self, host: sqlite3.Connection, db: sqlite3.Connection) -> int:
        """The first uid neither this table, a local account nor a live reservation holds."""
        used = {int(r[0]) for r in db.execute("SELECT uid FROM agent_users")}
        reserved = {
            int(uid): (str(where), str(owner))
            for uid, where, owner in host.execute(
                "SELECT uid, installation, owner FROM reservations"
            )
        }
        for uid in self._uids:
            if uid in used or _taken(uid):
                continue
            holder = reserved.get(uid)
            # A reservation of this installation's that its table no longer lists is free too.
            if holder is None or not _holds(holder[0], holder[1], uid):
                return uid
        raise InvalidArgument(
            f"no free uid left for Agents in {self._uids.start}-{self._uids.stop - 1}"
        )


def configured_user(run_as: str) -> Identity:
    """(uid, gid) of ``AMUX_RUNTIME_RUN_AS``, given by name or number.

    Raises:
        InvalidArgument: there is no such user, or it is root.
    """
    try:
        entry = pwd.getpwuid(int(run_as)) if run_as.isdigit() else pwd.getpwnam(run_as)
    except KeyError:
        raise InvalidArgument(f"AMUX_RUNTIME_RUN_AS names no local user: {run_as}") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise InvalidArgument(
            f"AMUX_RUNTIME_RUN_AS={run_as} would run Agents as root, which hands them the host; "
            "unset it (a root worker then gives each Principal a uid of its own) or name an "
            "unprivileged user"
        )
    return entry.pw_uid, entry.pw_gid


def worker_is_root() -> bool:
    return os.geteuid() == 0
