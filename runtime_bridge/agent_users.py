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

An explicit ``AMUX_RUNTIME_RUN_AS`` names one local user all Agents run as; ``root`` or uid 0
there is refused. A worker that is not root keeps its own uid: its sandbox's user namespace gives
the Agent no privilege over anything the worker does not own.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
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

Identity = tuple[int, int]

# Version 1: the table as the first version of this file created it, before versions were kept,
# so a file it left at version 0 holds it already.
_V1_AGENT_USERS = """
CREATE TABLE IF NOT EXISTS agent_users (owner TEXT PRIMARY KEY, uid INTEGER NOT NULL UNIQUE);
"""
MIGRATIONS: tuple[tuple[int, Step], ...] = ((1, _V1_AGENT_USERS),)


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

    def __init__(self, work_dir: Path, uids: range = DYNAMIC_UIDS) -> None:
        self._path = work_dir / REGISTRY
        self._uids = uids

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
        uid = next((u for u in self._uids if u not in used and not _taken(u)), self._uids.start)
        return uid, uid

    def of(self, owner: str) -> Identity:
        """(uid, gid) for ``owner`` (a Principal id, or a shared directory's key).

        Raises:
            InvalidArgument: every uid of the range is taken.
        """
        key = hashlib.sha256(owner.encode("utf-8")).hexdigest()
        with self._db() as db:
            row = db.execute("SELECT uid FROM agent_users WHERE owner = ?", (key,)).fetchone()
            if row is not None:
                return int(row[0]), int(row[0])
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT uid FROM agent_users WHERE owner = ?", (key,)).fetchone()
                if row is not None:
                    db.execute("COMMIT")
                    return int(row[0]), int(row[0])
                used = {int(r[0]) for r in db.execute("SELECT uid FROM agent_users")}
                uid = next((u for u in self._uids if u not in used and not _taken(u)), None)
                if uid is None:
                    raise InvalidArgument(
                        f"no free uid left for Agents in {self._uids.start}-{self._uids.stop - 1}"
                    )
                db.execute("INSERT INTO agent_users (owner, uid) VALUES (?, ?)", (key, uid))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return uid, uid


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
