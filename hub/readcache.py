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

from dataclasses import dataclass, field
from typing import Any

from hub.files import MemoryFiles
from hub.watch import WATCH, Parts, TreeWatch
from hub.watchedcache import WatchedStore


@dataclass
class Kept:
    """One document's bytes and what was worked out from them (keyed by the caller)."""

    data: bytes
    derived: dict[Any, Any] = field(default_factory=dict)


class Reads(WatchedStore[Kept]):
    """Kept documents of one memory root, bounded in bytes (least recently read go first)."""

    def __init__(
        self,
        files: MemoryFiles,
        max_bytes: int = 16 * 1024 * 1024,
        max_watches: int = 8192,
        watch: TreeWatch = WATCH,
    ) -> None:
        super().__init__(max_bytes, max_watches, watch, size=lambda kept: len(kept.data))
        self._files = files

    def read(self, path: Parts) -> Kept | None:
        """The document at ``path`` (below the root), from memory when nothing changed since it
        was read, else read again; None when it does not exist.

        Raises: what ``MemoryFiles.read`` raises.
        """
        kept = self.lookup(path)
        if kept is not None:
            return kept
        pending = self.start(path)
        try:
            data = self._files.read(path, self.watcher(pending))
            if data is None:
                return None
            kept = Kept(data)
            # One large document must not push out the many small ones most reads are.
            self.store(pending, kept, limit=self._max_bytes // 8)
            return kept
        finally:
            self.finish(pending)

    def kept(self, path: Parts) -> bool:
        """Whether the next read of ``path`` answers from memory (for tests)."""
        return self.lookup(path) is not None
