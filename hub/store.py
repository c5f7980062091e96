"""The memory store: search, get, upsert and forget over one scope's Markdown documents."""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hub import paging
from hub.corpus import Corpora, Corpus
from hub.errors import Conflict, InvalidArgument, QuotaExceeded
from hub.files import MemoryFiles, WalkedFile, WalkStop
from hub.limits import DEFAULT_LIMITS, ENTRY_NAME, Limits
from hub.paths import check_new_path, name_fold, scope_directory, validate_path, validate_prefix
from hub.readcache import Kept, Reads
from hub.search import (
    Candidate,
    Query,
    Ranking,
    encoded_size,
    match_document,
    parse_limit,
    parse_query,
)

ABSENT = "absent"
_REVISION = re.compile(r"^[0-9a-f]{64}$")


def revision_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_expected_revision(value: object) -> str:
    """Raises: InvalidArgument: not ``absent`` or a lowercase SHA-256 hex digest."""
    if not isinstance(value, str) or not (value == ABSENT or _REVISION.match(value)):
        raise InvalidArgument(
            "expected_revision must be 'absent' or the document's 64-hex-digit revision"
        )
    return value


def encode_content(content: object) -> bytes:
    """Raises: InvalidArgument: content is not a string of valid UTF-8 text."""
    if not isinstance(content, str):
        raise InvalidArgument("content must be a string")
    try:
        return content.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("content is not valid UTF-8 text") from None


_PAGES_KEPT = 8
T = TypeVar("T")

# Work done while a write is made (see ``MemoryStore.upsert``): given what the write will leave
# and the body it replaces (None for a new document).
Alongside = Callable[["Written", bytes | None], Awaitable[object]]


def _revision(kept: Kept) -> str:
    revision = kept.derived.get("revision")
    if not isinstance(revision, str):
        revision = kept.derived["revision"] = revision_of(kept.data)
    return revision


async def _settled(work: Awaitable[T]) -> T:
    """``work``'s result; a cancelled caller still waits for it, so the scope stays locked until
    the file and its log are as the write left them."""
    inner = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        await asyncio.wait([inner])
        raise


def count_lines(data: bytes) -> int:
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


@dataclass(frozen=True)
class Match:
    path: str
    line: int
    snippet: str
    revision: str
    truncated: bool

    def to_wire(self) -> dict[str, object]:
        return {
            "path": self.path,
            "line": self.line,
            "snippet": self.snippet,
            "revision": self.revision,
            "truncated": self.truncated,
        }


@dataclass(frozen=True)
class Found:
    """A search's matches, best first; ``incomplete`` when the scan budget ran out."""

    matches: tuple[Match, ...]
    incomplete: bool
    scanned_files: int
    truncated: bool

    def to_wire(self) -> dict[str, object]:
        return {
            "matches": [match.to_wire() for match in self.matches],
            "incomplete": self.incomplete,
            "scanned_files": self.scanned_files,
            "truncated": self.truncated,
        }


@dataclass(frozen=True)
class Document:
    """A fragment of one document (or its absence) with its whole-file revision."""

    path: str
    exists: bool
    revision: str
    content: str
    truncated: bool
    next_offset: int | None

    def to_wire(self) -> dict[str, object]:
        return {
            "path": self.path,
            "exists": self.exists,
            "revision": self.revision,
            "content": self.content,
            "truncated": self.truncated,
            "next_offset": self.next_offset,
        }


@dataclass(frozen=True)
class Written:
    """What an upsert or restore left: the document's path and revision, and whether the write
    changed it (an equal body changes nothing, and is neither logged nor kept)."""

    path: str
    revision: str
    changed: bool

    def to_wire(self) -> dict[str, object]:
        return {"path": self.path, "revision": self.revision}


@dataclass(frozen=True)
class Forgotten:
    """What a forget left: the path, and whether there was nothing to forget."""

    path: str
    already_absent: bool

    def to_wire(self) -> dict[str, object]:
        return {"path": self.path, "already_absent": self.already_absent}


@dataclass(frozen=True)
class Listed:
    path: str
    size_bytes: int
    revision: str


@dataclass(frozen=True)
class Listing:
    """A scope's documents in path order."""

    documents: tuple[Listed, ...]
    truncated: bool


@dataclass
class _Usage:
    documents: int
    bytes: int


def _rank_keys(
    corpus: Corpus, query: Query, within: range
) -> list[tuple[int, int, tuple[str, ...], int]]:
    """``Candidate.rank_key`` and the index of every document within ``within`` that matches:
    a keyword in its text, or in its path or (found in the text) its heading."""
    in_text = corpus.text_hits(query, within)
    in_path = [{i for i in within if term in corpus.paths[i]} for term in query.folded]
    keys = []
    for index in sorted(set().union(*in_text, *in_path)):
        distinct = path_title = 0
        for term, text_hits, path_hits in zip(query.folded, in_text, in_path, strict=True):
            found = index in text_hits
            heading = index in path_hits or (found and term in corpus.titles[index])
            if found or heading:
                distinct += 1
                path_title += heading
        keys.append((-distinct, -path_title, corpus.documents[index].parts, index))
    return keys


class MemoryStore:
    """One Hub's memory root. The Hub is its only online writer (see ``RootLock``)."""

    def __init__(
        self,
        root: Path,
        limits: Limits = DEFAULT_LIMITS,
        clock: Callable[[], float] = time.monotonic,
        max_watches: int = 8192,
    ) -> None:
        self.files = MemoryFiles(root)
        # Whole scopes as the last search saw them, while the watch saw nothing change.
        self.corpora = Corpora(self.files, max_watches=max_watches)
        # Documents as ``get`` and ``upsert`` last read them, on the same terms.
        self.reads = Reads(self.files, max_watches=max_watches)
        self.limits = limits
        self._clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._usage: dict[str, _Usage] = {}
        # Called with (scope, path parts, old body) in the write thread, under the scope lock,
        # before a body is overwritten or forgotten: the Hub's history keeps it (hub.history).
        # It returns a call that waits until the copy is durable, made before the rename.
        self.history_keeper: Callable[[str, tuple[str, ...], bytes], Callable[[], None]] | None = (
            None
        )

    def open(self) -> None:
        """Create the root and clear temp files an earlier crash left behind."""
        self.files.ensure_root()
        self.files.sweep_temp_files()

    def close(self) -> None:
        """Stop watching the root for searches."""
        self.corpora.close()
        self.reads.close()

    def _lock(self, scope: str) -> asyncio.Lock:
        lock = self._locks.get(scope)
        if lock is None:
            lock = self._locks[scope] = asyncio.Lock()
        return lock

    # -- reads -----------------------------------------------------------------------------------

    async def get(
        self,
        scope: str,
        path: object,
        start_line: object = None,
        end_line: object = None,
        offset: object = None,
    ) -> Document:
        """A bounded fragment of one document with its whole-file revision."""
        parts = validate_path(path, self.limits)
        start, end, off = paging.parse_range(start_line, end_line, offset)
        logical = "/".join(parts)
        kept = self.reads.read(scope_directory(scope) + parts)
        if kept is None:
            return Document(logical, False, ABSENT, "", False, None)
        # The same path (so the same scope and logical path) and range give the same answer
        # while the document is unchanged.
        page = (start, end, off)
        document = kept.derived.get(page)
        if isinstance(document, Document):
            return document
        data = kept.data
        revision = _revision(kept)
        # The widest next_offset a page can carry, so the answer fits whatever the page is.
        envelope = Document(logical, True, revision, "", False, 10**12)
        budget = self.limits.response_bytes - encoded_size(envelope.to_wire())
        fragment = paging.select(data, start, end, off, budget)
        document = Document(
            logical, True, revision, fragment.content, fragment.truncated, fragment.next_offset
        )
        if len(kept.derived) < _PAGES_KEPT:
            kept.derived[page] = document
        return document

    async def search(
        self, scope: str, query: object, path_prefix: object = None, limit: object = None
    ) -> Found:
        """Literal keyword search of a scope within the scan budget."""
        parsed = parse_query(query, self.limits)
        prefix = validate_prefix(path_prefix, self.limits)
        wanted = parse_limit(limit, self.limits)
        return await asyncio.to_thread(self._search, scope, parsed, prefix, wanted)

    def _search(self, scope: str, query: Query, prefix: tuple[str, ...], wanted: int) -> Found:
        scope_parts = scope_directory(scope)
        corpus = self.corpora.current(scope_parts)
        if corpus is not None and (corpus.complete or not prefix):
            return self._search_kept(corpus, query, prefix, wanted)
        limits = self.limits
        deadline = self._clock() + limits.scan_seconds
        scanned_files = 0
        scanned_bytes = 0
        timed_out = False
        ranking = Ranking(wanted)

        def admit(size: int) -> bool:
            nonlocal timed_out
            if scanned_files >= limits.scan_files or scanned_bytes + size > limits.scan_bytes:
                return False
            timed_out = self._clock() >= deadline
            return not timed_out

        # Only a whole-scope walk is kept: a narrowed one has a budget of its own.
        build = None if prefix else self.corpora.begin(scope_parts)
        scanned: list[WalkedFile] = []
        incomplete = False
        walk = self.files.walk(
            scope_parts,
            prefix,
            admit,
            limits.scan_entries,
            query.folds_ascii or build is not None,
            None if build is None else self.corpora.on_directory(build),
        )
        try:
            for document in walk:
                scanned_files += 1
                scanned_bytes += len(document.data)
                if build is not None:
                    scanned.append(document)
                candidate = match_document(
                    document.parts, document.data, query, limits, document.lowered
                )
                if candidate is not None:
                    ranking.offer(candidate)
        except WalkStop:
            incomplete = True
        finally:
            walk.close()
            if build is not None:
                if timed_out:
                    self.corpora.abandon(build)
                else:
                    self.corpora.keep(build, scanned, complete=not incomplete)
        return self._found(ranking, incomplete, scanned_files, lambda c: revision_of(c.data))

    def _search_kept(
        self, corpus: Corpus, query: Query, prefix: tuple[str, ...], wanted: int
    ) -> Found:
        """The search the walk that kept ``corpus`` would give, without reading a file."""
        within = corpus.under(prefix)
        ranking = Ranking(wanted)
        revisions: dict[int, str] = {}

        def score(index: int) -> None:
            document = corpus.documents[index]
            candidate = match_document(
                document.parts, document.data, query, self.limits, document.lowered
            )
            if candidate is not None:
                revisions[id(candidate)] = corpus.revision(index)
                ranking.offer(candidate)

        if any(needle is None for needle in query.needles):
            # A keyword with cased non-ASCII letters is matched on decoded text, one document
            # at a time.
            for index in within:
                score(index)
        else:
            # Ranked by the same key as ``match_document``'s, from where each keyword occurs;
            # only the best are scored in full (for their line and snippet).
            keys = _rank_keys(corpus, query, within)
            for *_key, index in heapq.nsmallest(wanted, keys):
                score(index)
            ranking.matched = len(keys)
        return self._found(ranking, not corpus.complete, len(within), lambda c: revisions[id(c)])

    def _found(
        self,
        ranking: Ranking,
        incomplete: bool,
        scanned_files: int,
        revision: Callable[[Candidate], str],
    ) -> Found:
        empty = Found((), incomplete, scanned_files, False)
        budget = self.limits.response_bytes - encoded_size(empty.to_wire())
        matches: list[Match] = []
        for candidate in ranking.ranked():
            match = Match(
                "/".join(candidate.parts),
                candidate.line,
                candidate.snippet,
                revision(candidate),
                candidate.snippet_truncated,
            )
            size = encoded_size(match.to_wire()) + (1 if matches else 0)
            if size > budget:
                break
            matches.append(match)
            budget -= size
        return Found(tuple(matches), incomplete, scanned_files, len(matches) < ranking.matched)

    # -- writes ----------------------------------------------------------------------------------

    async def upsert(
        self,
        scope: str,
        path: object,
        content: object,
        expected_revision: object,
        alongside: Alongside | None = None,
    ) -> Written:
        """Replace or create a whole document if its revision is still ``expected_revision``.

        ``alongside`` is called once the write is sure to be attempted (every check passed), with
        what it will leave and the body it replaces, and the coroutine it returns runs while the
        document is written and synced: both are done before this returns or raises.

        Raises:
            Conflict: the document changed; ``observed_revision`` is what is there now.
            QuotaExceeded: a document, entry or scope bound would be exceeded.
        """
        parts = validate_path(path, self.limits)
        data = encode_content(content)
        expected = parse_expected_revision(expected_revision)
        self._check_document_bounds(parts, data)
        logical = "/".join(parts)
        async with self._lock(scope):
            if scope in self._usage:
                # Checked on the event loop: the document is usually kept in memory, and a read
                # of it is what ``get`` does there too; only the write and its syncs need a thread.
                planned = self._plan(scope, parts, logical, data, expected)
            else:
                # The scope's first write counts the whole scope: a walk kept off the loop.
                planned = await asyncio.to_thread(self._plan, scope, parts, logical, data, expected)
            written, current = planned
            if not written.changed:
                return written
            writing = asyncio.ensure_future(
                asyncio.to_thread(self._write, scope, parts, data, current)
            )
            if alongside is None:
                await _settled(writing)
                return written
            # The write's syncs and the other work's (a commit) overlap, each on its own thread.
            both = asyncio.gather(writing, alongside(written, current), return_exceptions=True)
            for outcome in await _settled(both):
                if isinstance(outcome, BaseException):
                    raise outcome
            return written

    def _plan(
        self, scope: str, parts: tuple[str, ...], logical: str, data: bytes, expected: str
    ) -> tuple[Written, bytes | None]:
        """What writing ``data`` will leave, and the body it replaces, once every check passed.

        Raises: Conflict, QuotaExceeded (as ``upsert``).
        """
        full = scope_directory(scope) + parts
        kept = self.reads.read(full)
        current = None if kept is None else kept.data
        observed = ABSENT if kept is None else _revision(kept)
        if observed != expected:
            raise Conflict(
                f"'{logical}' changed since it was read; reread it and merge",
                path=logical,
                observed_revision=observed,
            )
        if current == data:
            return Written(logical, observed, changed=False), current
        if current is None:
            check_new_path(parts, logical)
            twin = self._twin(scope_directory(scope), parts)
            if twin is not None:
                raise Conflict(
                    f"'{twin}' already exists and differs from '{logical}' only in case; write "
                    "to it instead",
                    path=logical,
                    existing=twin,
                )
        usage = self._scope_usage(scope)
        documents = usage.documents + (1 if current is None else 0)
        total = usage.bytes - (len(current) if current is not None else 0) + len(data)
        if documents > self.limits.scope_documents:
            raise QuotaExceeded(
                f"the memory scope holds at most {self.limits.scope_documents} documents",
                limit="scope_documents",
            )
        if total > self.limits.scope_bytes:
            raise QuotaExceeded(
                f"the memory scope holds at most {self.limits.scope_bytes} bytes",
                limit="scope_bytes",
            )
        return Written(logical, revision_of(data), changed=True), current

    def _write(
        self, scope: str, parts: tuple[str, ...], data: bytes, current: bytes | None
    ) -> None:
        """Keep the replaced body (history), then write the document durably, under the scope
        lock; the scope's usage follows only a write that was made."""
        full = scope_directory(scope) + parts
        kept = None
        if current is not None and self.history_keeper is not None:
            kept = self.history_keeper(scope, parts, current)
        # The copy's sync overlaps the new body's own; both are done before the rename.
        self.files.write_atomic(full, data, kept)
        usage = self._scope_usage(scope)
        usage.documents += 1 if current is None else 0
        usage.bytes += len(data) - (len(current) if current is not None else 0)

    def _twin(self, scope_parts: tuple[str, ...], parts: tuple[str, ...]) -> str | None:
        """The existing document or directory a new path would be beside, differing only in case:
        one name on a case-insensitive file system, and two easily confused ones anywhere."""
        for index, name in enumerate(parts):
            names = self.files.names(scope_parts + parts[:index])
            if names is None:
                return None
            if name in names:
                continue
            folded = name_fold(name)
            for other in sorted(names):
                if not other.startswith(".") and name_fold(other) == folded:
                    return "/".join((*parts[:index], other))
            return None
        return None

    def _check_document_bounds(self, parts: tuple[str, ...], data: bytes) -> None:
        limits = self.limits
        if parts == (ENTRY_NAME,):
            if len(data) > limits.entry_bytes or count_lines(data) > limits.entry_lines:
                raise QuotaExceeded(
                    f"{ENTRY_NAME} is limited to {limits.entry_bytes} bytes and "
                    f"{limits.entry_lines} lines; move details into topic documents and keep "
                    "short pointers",
                    limit="entry",
                )
        elif len(data) > limits.document_bytes:
            raise QuotaExceeded(
                f"a document is limited to {limits.document_bytes} bytes; split it by topic",
                limit="document_bytes",
            )

    async def forget(self, scope: str, path: object, expected_revision: object) -> Forgotten:
        """Delete one document if its revision is still ``expected_revision``.

        Raises:
            Conflict: the document changed; ``observed_revision`` is what is there now.
        """
        parts = validate_path(path, self.limits)
        expected = parse_expected_revision(expected_revision)
        logical = "/".join(parts)
        async with self._lock(scope):
            return await asyncio.to_thread(self._forget, scope, parts, logical, expected)

    def _forget(self, scope: str, parts: tuple[str, ...], logical: str, expected: str) -> Forgotten:
        scope_parts = scope_directory(scope)
        full = scope_parts + parts
        current = self.files.read(full)
        if current is None:
            return Forgotten(logical, already_absent=True)
        observed = revision_of(current)
        if observed != expected:
            raise Conflict(
                f"'{logical}' changed since it was read; reread it before forgetting",
                path=logical,
                observed_revision=observed,
            )
        usage = self._scope_usage(scope)
        if self.history_keeper is not None:
            self.history_keeper(scope, parts, current)()
        # Under the scope lock: no write in this scope can be creating a directory meanwhile.
        removed = self.files.delete(full, keep=len(scope_parts))
        if removed:
            usage.documents -= 1
            usage.bytes -= len(current)
        return Forgotten(logical, already_absent=not removed)

    async def erase(
        self,
        scope: str,
        path: str | None,
        only: set[str] | None = None,
        spare: frozenset[str] = frozenset(),
    ) -> int:
        """Delete one document (or, with ``path`` None, every document of the scope) whatever
        its revision, keeping no history; ``only`` limits it to documents at those revisions,
        and the paths in ``spare`` stay. Returns how many were removed."""
        async with self._lock(scope):
            return await asyncio.to_thread(self._erase, scope, path, only, spare)

    def _erase(
        self, scope: str, path: str | None, only: set[str] | None, spare: frozenset[str]
    ) -> int:
        scope_parts = scope_directory(scope)
        if path is not None:
            targets = [tuple(path.split("/"))]
        else:
            targets = [document.parts for document in self.files.walk(scope_parts)]
        usage = self._scope_usage(scope)
        removed = 0
        for parts in targets:
            if "/".join(parts) in spare:
                continue
            current = self.files.read(scope_parts + parts)
            if current is None or (only is not None and revision_of(current) not in only):
                continue
            if self.files.delete(scope_parts + parts, keep=len(scope_parts)):
                removed += 1
                usage.documents -= 1
                usage.bytes -= len(current)
        return removed

    def _scope_usage(self, scope: str) -> _Usage:
        # Counted once per scope, then kept current by our own writes: the Hub is the only writer.
        usage = self._usage.get(scope)
        if usage is None:
            documents = 0
            size = 0
            for document in self.files.walk(scope_directory(scope)):
                documents += 1
                size += len(document.data)
            usage = self._usage[scope] = _Usage(documents, size)
        return usage

    async def count_documents(self, scope: str) -> int:
        """How many documents the scope holds."""
        async with self._lock(scope):
            return await asyncio.to_thread(lambda: self._scope_usage(scope).documents)

    async def list_documents(
        self, scope: str, path_prefix: object = None, limit: int = 50
    ) -> Listing:
        """Paths, sizes and revisions of a scope's documents in path order, at most ``limit``."""
        prefix = validate_prefix(path_prefix, self.limits)
        return await asyncio.to_thread(self._list, scope, prefix, limit)

    def _list(self, scope: str, prefix: tuple[str, ...], limit: int) -> Listing:
        documents: list[Listed] = []
        truncated = False
        walk = self.files.walk(scope_directory(scope), prefix)
        try:
            for document in walk:
                if len(documents) >= limit:
                    truncated = True
                    break
                documents.append(
                    Listed("/".join(document.parts), len(document.data), revision_of(document.data))
                )
        finally:
            walk.close()
        return Listing(tuple(documents), truncated)
