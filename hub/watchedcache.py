"""A bounded store of what reads of a memory root found, trusted only while the watch saw nothing.

Searches keep whole scopes (``hub.corpus``) and ``memory.get`` keeps single documents
(``hub.readcache``); both follow the same rules, kept here once:

- an entry is dropped when the watch (``hub.watch``) reports a change in or above its path, and
  everything is dropped when the watch overflows;
- a read marks itself pending while it runs, so a change reported before it is stored keeps it
  from being stored at all;
- a read is stored only when every directory it passed could be watched, within a bound on the
  number of watches, and the store stays under its byte bound by dropping the least recently used.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from hub.files import OnDirectory
from hub.watch import Listener, Parts, TreeWatch

V = TypeVar("V")


def related(one: Parts, other: Parts) -> bool:
    """Whether either path is inside the other (or they are the same)."""
    width = min(len(one), len(other))
    return one[:width] == other[:width]


@dataclass(eq=False)
class Pending:
    """One read whose result may be stored, and whether that is still allowed."""

    path: Parts
    watched: bool = True
    stale: bool = False


class WatchedStore(Listener, Generic[V]):
    """Entries by path below one memory root, bounded in bytes (least recently used go first)."""

    def __init__(
        self, max_bytes: int, max_watches: int, watch: TreeWatch, size: Callable[[V], int]
    ) -> None:
        self._max_bytes = max_bytes
        self._max_watches = max_watches
        self._watch = watch
        self._size = size
        self._lock = threading.Lock()
        self._kept: OrderedDict[Parts, V] = OrderedDict()
        self._bytes = 0
        self._pending: list[Pending] = []
        self._watched: set[Parts] = set()

    # -- the watch's listener --------------------------------------------------------------------

    def changed(self, path: Parts) -> None:
        with self._lock:
            for key in [k for k in self._kept if related(k, path)]:
                self._drop(key)
            for pending in self._pending:
                if related(pending.path, path):
                    pending.stale = True

    def overflowed(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0
            for pending in self._pending:
                pending.stale = True

    def _drop(self, key: Parts) -> None:
        self._bytes -= self._size(self._kept.pop(key))

    # -- reads -----------------------------------------------------------------------------------

    def lookup(self, path: Parts) -> V | None:
        """What is kept for ``path``, if nothing changed since; every change made before this
        call returned is taken into account."""
        self._watch.drain()
        with self._lock:
            kept = self._kept.get(path)
            if kept is not None:
                self._kept.move_to_end(path)
            return kept

    def start(self, path: Parts) -> Pending:
        pending = Pending(path)
        with self._lock:
            self._pending.append(pending)
        return pending

    def watcher(self, pending: Pending) -> OnDirectory:
        """Watches each directory ``pending``'s read opens; one that cannot be watched means its
        result is not stored."""

        def watch(dir_fd: int, path: Parts) -> None:
            if not pending.watched:
                return
            if path not in self._watched and len(self._watched) >= self._max_watches:
                pending.watched = False
            elif self._watch.add(self, dir_fd, path):
                self._watched.add(path)
            else:
                pending.watched = False

        return watch

    def store(self, pending: Pending, value: V, limit: int | None = None) -> None:
        """Keep ``value`` for ``pending``'s path unless something changed while it was read, or
        it is larger than ``limit`` (the whole bound when None)."""
        # Events of changes made while it was read are queued by now.
        self._watch.drain()
        size = self._size(value)
        with self._lock:
            if not pending.watched or pending.stale:
                return
            if size > (self._max_bytes if limit is None else limit):
                return
            if pending.path in self._kept:
                self._drop(pending.path)
            self._kept[pending.path] = value
            self._bytes += size
            while self._bytes > self._max_bytes:
                self._drop(next(iter(self._kept)))

    def finish(self, pending: Pending) -> None:
        with self._lock:
            if pending in self._pending:
                self._pending.remove(pending)

    def close(self) -> None:
        self._watch.forget(self)
        with self._lock:
            self._kept.clear()
            self._bytes = 0

