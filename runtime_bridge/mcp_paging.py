"""Pages of MCP tool results: the 6 KiB page budget and ``amux.result_continue`` cursors. Pure.

A result whose text fits the budget goes out whole. A longer one is cut into parts at character
boundaries; every part but the last comes with a trailer naming a cursor for the next part, and
the parts (without trailers) concatenate to exactly the original text. Cursors are opaque to the
model and live only in this process: a bounded least-recently-used cache with a sliding expiry.
Re-sending a cursor returns the same part again, so a retried call is harmless.

The clock and the source of cursor ids are passed in, so this module does no I/O.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from hub.errors import NotFound

PAGE_BYTES = 6 * 1024
CACHE_RESULTS = 64
CURSOR_TTL_SECONDS = 15 * 60.0
CONTINUE_TOOL = "amux.result_continue"

# Room kept for the trailer on every part but the last; a test pins that real trailers fit.
TRAILER_RESERVE = 256

_CURSOR = re.compile(r"^([A-Za-z0-9_-]{1,64})\.([1-9][0-9]{0,5})$")


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def split_text(text: str, budget: int) -> list[str]:
    """Cut ``text`` into parts of at most ``budget`` UTF-8 bytes each, never inside a character.

    ``"".join(parts) == text``; an empty text is one empty part.
    """
    if budget < 4:
        # Four bytes is the widest UTF-8 character; a smaller budget could not always advance.
        raise ValueError("a page budget must hold at least one character")
    data = text.encode("utf-8", "surrogatepass")
    parts: list[str] = []
    start = 0
    while True:
        stop = min(start + budget, len(data))
        # Step back off UTF-8 continuation bytes so every part decodes on its own.
        while stop < len(data) and (data[stop] & 0xC0) == 0x80:
            stop -= 1
        parts.append(data[start:stop].decode("utf-8", "surrogatepass"))
        if stop >= len(data):
            return parts
        start = stop


def trailer(cursor: str, number: int, total: int) -> str:
    """The note after a cut part telling the model how to get the next one."""
    return (
        f"[amux: result continues, part {number} of {total}. Call {CONTINUE_TOOL} with "
        f'cursor "{cursor}" for the next part; the parts join into one text.]'
    )


@dataclass(frozen=True)
class Page:
    """One part of a result and, unless it is the last, the cursor of the next part."""

    body: str
    number: int
    total: int
    next_cursor: str | None

    def blocks(self) -> list[str]:
        """The text blocks of the tool result: the body, then the trailer if more follows."""
        if self.next_cursor is None:
            return [self.body]
        return [self.body, trailer(self.next_cursor, self.number, self.total)]


@dataclass
class _Entry:
    parts: list[str]
    expires_at: float


class PageCache:
    """Results waiting to be continued, keyed by an opaque id; bounded and expiring."""

    def __init__(
        self,
        new_id: Callable[[], str],
        *,
        page_bytes: int = PAGE_BYTES,
        capacity: int = CACHE_RESULTS,
        ttl: float = CURSOR_TTL_SECONDS,
    ) -> None:
        if page_bytes <= TRAILER_RESERVE + 4:
            raise ValueError("page budget too small for a part and its trailer")
        self._new_id = new_id
        self._page_bytes = page_bytes
        self._capacity = capacity
        self._ttl = ttl
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def first_page(self, text: str, now: float) -> Page:
        """The page to send for a fresh result; keeps the rest for ``next_page`` if it is cut."""
        if utf8_size(text) <= self._page_bytes:
            return Page(text, 1, 1, None)
        parts = split_text(text, self._page_bytes - TRAILER_RESERVE)
        self._expire(now)
        result_id = self._new_id()
        if not _CURSOR.match(f"{result_id}.1") or result_id in self._entries:
            raise ValueError(f"unusable result id {result_id!r}")
        self._entries[result_id] = _Entry(parts, now + self._ttl)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        return self._page(result_id, parts, 1)

    def next_page(self, cursor: str, now: float) -> Page:
        """The part a cursor names.

        Raises:
            NotFound: the cursor is malformed, unknown, evicted or expired.
        """
        self._expire(now)
        matched = _CURSOR.match(cursor)
        entry = self._entries.get(matched.group(1)) if matched else None
        if matched is None or entry is None or int(matched.group(2)) > len(entry.parts):
            raise NotFound(
                "this result cursor is unknown or has expired; repeat the original tool call "
                "to get a fresh result",
                cursor=cursor,
            )
        result_id = matched.group(1)
        entry.expires_at = now + self._ttl
        self._entries.move_to_end(result_id)
        return self._page(result_id, entry.parts, int(matched.group(2)))

    def _page(self, result_id: str, parts: list[str], number: int) -> Page:
        # ``number`` is 1-based; cursor ``<id>.<n>`` names part n, so part 1 hands out n = 2.
        more = number < len(parts)
        cursor = f"{result_id}.{number + 1}" if more else None
        return Page(parts[number - 1], number, len(parts), cursor)

    def _expire(self, now: float) -> None:
        stale = [key for key, entry in self._entries.items() if entry.expires_at <= now]
        for key in stale:
            del self._entries[key]
