"""Documents as the last confined read found them, trusted only while the watch saw no change.

``memory.get`` reads one document by walking every component of its path without following
links (an ``openat`` each). A document read that way is kept with what was answered for it, and
the next read of the same path answers from memory as long as the watch (``hub.watch``) reported
nothing about the document or any directory on its way since the root was reached: a component
swapped for a link, a directory renamed or the document edited, renamed over or removed (by the
Hub or anyone else) is an event in a watched directory, and drops what was kept. Where a
directory on the way cannot be watched, nothing of that read is kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hub.files import MemoryFiles
from hub.watch import WATCH, Listener, Parts, TreeWatch


@dataclass
class Kept:
    """One document's bytes and what was worked out from them (keyed by the caller)."""

    data: bytes
    derived: dict[Any, Any] = field(default_factory=dict)


@dataclass(eq=False)
class _Pending:
    path: Parts
    watched: bool = True
    stale: bool = False


class Reads(Listener):
    """Kept documents of one memory root, bounded in bytes (least recently read go first)."""

    def __init__(
        self,
        files: MemoryFiles,
        max_bytes: int = 16 * 1024 * 1024,
        max_watches: int = 8192,
        watch: TreeWatch = WATCH,
    ) -> None:
        self._files = files
        self._max_bytes = max_bytes
        self._max_watches = max_watches
        self._watch = watch
        self._lock = threading.Lock()
        self._kept: OrderedDict[Parts, Kept] = OrderedDict()
        self._bytes = 0
        self._pending: list[_Pending] = []
        self._watched: set[Parts] = set()

    # -- the watch's listener --------------------------------------------------------------------

    def changed(self, path: Parts) -> None:
        width = len(path)
        with self._lock:
            for key in [k for k in self._kept if k[:width] == path]:
                self._drop(key)
            for pending in self._pending:
                if pending.path[:width] == path:
                    pending.stale = True

    def overflowed(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0
            for pending in self._pending:
                pending.stale = True

    def _drop(self, key: Parts) -> None:
        self._bytes -= len(self._kept.pop(key).data)

    # -- reads -----------------------------------------------------------------------------------

    def read(self, path: Parts) -> Kept | None:
        """The document at ``path`` (below the root), from memory when nothing changed since it
        was read, else read again; None when it does not exist.

        Raises: what ``MemoryFiles.read`` raises.
        """
        self._watch.drain()
        with self._lock:
            kept = self._kept.get(path)
            if kept is not None:
                self._kept.move_to_end(path)
                return kept
            pending = _Pending(path)
            self._pending.append(pending)
        try:
            data = self._files.read(path, self._on_directory(pending))
            if data is None:
                return None
            kept = Kept(data)
            # Events of changes made while it was read are queued by now.
            self._watch.drain()
            with self._lock:
                if pending.watched and not pending.stale and len(data) <= self._max_bytes // 8:
                    if path in self._kept:
                        self._drop(path)
                    self._kept[path] = kept
                    self._bytes += len(data)
                    while self._bytes > self._max_bytes:
                        self._drop(next(iter(self._kept)))
            return kept
        finally:
            with self._lock:
                self._pending.remove(pending)

    def _on_directory(self, pending: _Pending) -> Callable[[int, Parts], None]:
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

    def kept(self, path: Parts) -> bool:
        """Whether the next read of ``path`` answers from memory (for tests)."""
        self._watch.drain()
        with self._lock:
            return path in self._kept

    def close(self) -> None:
        self._watch.forget(self)
        with self._lock:
            self._kept.clear()
            self._bytes = 0
