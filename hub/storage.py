"""A disk that refuses the Hub: full, over quota, read-only or failing, as one typed error.

The memory root, its history and the state database each map their file system's refusal to
``StorageUnavailable`` (``StorageFull`` when room is what is missing), naming which of them
refused and why. A caller's message never holds a path or a traceback; the Hub log adds where.
Writes stay whole regardless: a document is written to a temp file and renamed, so a write that
fails leaves the old document, and the temp file is removed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from hub.errors import StorageFull, StorageUnavailable

logger = logging.getLogger("amux.hub.storage")

NO_SPACE, QUOTA, READ_ONLY, IO = "no_space", "quota", "read_only", "io"
CAUSES = (NO_SPACE, QUOTA, READ_ONLY, IO)
MEMORY, MEMORY_HISTORY, STATE = "memory", "memory_history", "state"
DISKS = (MEMORY, MEMORY_HISTORY, STATE)

_BY_ERRNO = {errno.ENOSPC: NO_SPACE, errno.EDQUOT: QUOTA, errno.EROFS: READ_ONLY, errno.EIO: IO}
# SQLite's primary result codes; an extended code carries its primary one in the low byte.
_BY_SQLITE = {
    sqlite3.SQLITE_FULL: NO_SPACE,
    sqlite3.SQLITE_READONLY: READ_ONLY,
    sqlite3.SQLITE_IOERR: IO,
}
_SAYS = {
    NO_SPACE: "is full",
    QUOTA: "is over its quota",
    READ_ONLY: "is read-only",
    IO: "failed to read or write",
}
_NAMES = {
    MEMORY: "the memory disk",
    MEMORY_HISTORY: "the memory history disk",
    STATE: "the state database's disk",
}


def storage_error(cause: str, disk: str, reason: str) -> StorageUnavailable:
    """The error for ``disk`` refusing for ``cause``, with the system's ``reason`` in brackets."""
    kind = StorageFull if cause in (NO_SPACE, QUOTA) else StorageUnavailable
    return kind(f"{_NAMES[disk]} {_SAYS[cause]} ({reason})", cause=cause, disk=disk)


def is_storage_errno(number: int | None) -> bool:
    return number in _BY_ERRNO


def from_os_error(err: OSError, disk: str) -> StorageUnavailable | None:
    """``err`` as a storage error of ``disk``; None when it is about something else."""
    if err.errno is None:
        return None
    cause = _BY_ERRNO.get(err.errno)
    return None if cause is None else storage_error(cause, disk, os.strerror(err.errno))


def from_sqlite_error(err: sqlite3.Error) -> StorageUnavailable | None:
    """A state database error as a storage error; None when it is about something else."""
    code = getattr(err, "sqlite_errorcode", None)
    cause = _BY_SQLITE.get(code & 0xFF) if isinstance(code, int) else None
    # SQLite's messages ("database or disk is full", "disk I/O error") name no file.
    return None if cause is None else storage_error(cause, STATE, str(err))


@contextlib.contextmanager
def guarded(disk: str, where: Path) -> Iterator[None]:
    """Raise a refusal of the file system under ``where`` as the storage error of ``disk``."""
    try:
        yield
    except OSError as err:
        failure = from_os_error(err, disk)
        if failure is None:
            raise
        raise refused(failure, where) from None


def refused(failure: StorageUnavailable, where: Path) -> StorageUnavailable:
    """Log ``failure`` for the operator (with where it happened) and hand it back to raise."""
    logger.error("%s; under %s", failure.message, where)
    return failure
