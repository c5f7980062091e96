"""What a search keeps of a scope for the next one, trusted only while the watch saw no change.

A search that walked a whole scope keeps every document it scanned, in walk order, with their
lower-cased bytes joined into one haystack: each keyword is then looked for once over the scope
(the C library's ``memmem``) instead of once per document in Python, and only the documents it
occurs in are scored. Nothing is written anywhere: the files stay the only truth.

A kept scope is dropped as soon as the watch (``hub.watch``) reports a change in or above one of
its directories, including the Hub's own writes, and when the watch overflows; the next search
then walks the scope again, checking every file's ``stat``. A scope is not kept when a directory
of it could not be watched, when a document has a second name (an edit through it would not be
seen), or when the scan ended on the clock (the next one may get further).
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import hashlib
from dataclasses import dataclass, field

from hub.files import MemoryFiles, OnDirectory, WalkedFile
from hub.search import Query, title_of
from hub.watch import WATCH, Parts, TreeWatch
from hub.watchedcache import Pending, WatchedStore

# Documents are joined with a byte no keyword can straddle unnoticed: a hit is kept only when it
# lies within one document.
_SEPARATOR = b"\0"


def _memmem() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        found = libc.memmem
    except (OSError, AttributeError):
        return None
    found.restype = ctypes.c_void_p
    found.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    return found


_MEMMEM = _memmem()


class Haystack:
    """Bytes searched for a literal in C; ``bytes.find`` where the C library has no memmem."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        # The pointer object holds a reference to ``data``, so the address stays valid.
        self._pointer = ctypes.c_char_p(data)
        self._base = ctypes.cast(self._pointer, ctypes.c_void_p).value or 0

    def find(self, needle: bytes, start: int, end: int) -> int:
        if _MEMMEM is None or not self._base:
            return self.data.find(needle, start, end)
        if end - start < len(needle):
            return -1
        hit = _MEMMEM(self._base + start, end - start, needle, len(needle))
        return -1 if not hit else int(hit) - self._base


@dataclass
class Corpus:
    """A scope's scanned documents in walk order, as the walk that kept them saw them."""

    documents: tuple[WalkedFile, ...]
    # Where each document's lower-cased bytes begin in the haystack.
    starts: list[int]
    # Each document's path and heading, lower-cased, as ``match_document`` compares them.
    paths: tuple[str, ...]
    titles: tuple[str, ...]
    haystack: Haystack
    # False when the walk's budget ran out: then these are the documents it got to.
    complete: bool
    _revisions: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, documents: list[WalkedFile], complete: bool) -> Corpus:
        lowered = [d.lowered if d.lowered is not None else d.data.lower() for d in documents]
        starts: list[int] = []
        offset = 0
        for text in lowered:
            starts.append(offset)
            offset += len(text) + len(_SEPARATOR)
        return cls(
            tuple(
                WalkedFile(d.parts, d.data, low, d.names)
                for d, low in zip(documents, lowered, strict=True)
            ),
            starts,
            tuple("/".join(d.parts).lower() for d in documents),
            tuple(title_of(d.data).lower() for d in documents),
            Haystack(_SEPARATOR.join(lowered)),
            complete,
        )

    @property
    def size(self) -> int:
        return len(self.haystack.data)

    def under(self, prefix: tuple[str, ...]) -> range:
        """The documents a walk narrowed to ``prefix`` yields: they are contiguous in walk order,
        since every directory's entries are walked whole, in name order."""
        if not prefix:
            return range(len(self.documents))
        width = len(prefix)
        inside = [i for i, d in enumerate(self.documents) if d.parts[:width] == prefix]
        return range(inside[0], inside[-1] + 1) if inside else range(0)

    def text_hits(self, query: Query, within: range) -> list[set[int]]:
        """Per keyword, the documents within ``within`` whose text holds it, each keyword
        looked for once over their joined bytes. Only for keywords matched on bytes (every
        needle set)."""
        found: list[set[int]] = []
        if not within:
            return [set() for _ in query.needles]
        first, last = within.start, within.stop - 1
        end = self.starts[last] + len(self.documents[last].data)
        for needle in query.needles:
            assert needle is not None
            hits: set[int] = set()
            position = self.starts[first]
            while True:
                hit = self.haystack.find(needle, position, end)
                if hit < 0:
                    break
                index = bisect.bisect_right(self.starts, hit) - 1
                document_end = self.starts[index] + len(self.documents[index].data)
                if hit + len(needle) <= document_end:
                    hits.add(index)
                    position = document_end + len(_SEPARATOR)
                else:
                    position = hit + 1
            found.append(hits)
        return found

    def revision(self, index: int) -> str:
        known = self._revisions.get(index)
        if known is None:
            known = self._revisions[index] = hashlib.sha256(self.documents[index].data).hexdigest()
        return known


Build = Pending


class Corpora(WatchedStore[Corpus]):
    """The scopes kept for one memory root, bounded in bytes (least recently searched go)."""

    def __init__(
        self,
        files: MemoryFiles,
        max_bytes: int = 64 * 1024 * 1024,
        max_watches: int = 8192,
        watch: TreeWatch = WATCH,
    ) -> None:
        super().__init__(max_bytes, max_watches, watch, size=lambda corpus: corpus.size)
        self._files = files

    def current(self, scope: Parts) -> Corpus | None:
        """The scope as kept, if nothing in it changed since; every change made before this call
        returned is taken into account."""
        return self.lookup(scope)

    def kept(self, scope: Parts) -> bool:
        """Whether the next search of ``scope`` can use what was kept (for tests and metrics)."""
        return self.current(scope) is not None

    def begin(self, scope: Parts) -> Build | None:
        """A walk of ``scope`` that may be kept; None when the scope's place cannot be watched
        (then the walk checks every file, as it must)."""
        if self._max_bytes <= 0:
            return None
        build = self.start(scope)
        if not self._files.visit_path(scope[:-1], self.watcher(build)):
            build.watched = False
        if not build.watched:
            self.finish(build)
            return None
        return build

    def on_directory(self, build: Build) -> OnDirectory:
        return self.watcher(build)

    def keep(self, build: Build, documents: list[WalkedFile], complete: bool) -> None:
        """Keep what ``build``'s walk scanned, unless something changed meanwhile."""
        try:
            # Building the haystack is skipped when the result could not be kept anyway.
            self._watch.drain()
            if not build.watched or build.stale:
                return
            if any(document.names != 1 for document in documents):
                return
            self.store(build, Corpus.of(documents, complete))
        finally:
            self.finish(build)

    def abandon(self, build: Build) -> None:
        self.finish(build)

