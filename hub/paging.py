"""Bounded reads of one document: line ranges, byte-offset continuation, JSON byte budgets. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hub.errors import InvalidArgument


@dataclass(frozen=True)
class Fragment:
    content: str
    truncated: bool
    next_offset: int | None


def _optional_int(name: str, value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer")
    if value < 0:
        raise InvalidArgument(f"{name} must not be negative")
    return value


def parse_range(start_line: object, end_line: object, offset: object) -> tuple[int, int, int]:
    """Validate get's positional arguments; zero means "from the start" / "to the end".

    Raises:
        InvalidArgument: negative or non-integer values, a start line with an offset, or an end
            line before the start line.
    """
    start = _optional_int("start_line", start_line)
    end = _optional_int("end_line", end_line)
    off = _optional_int("offset", offset)
    if start and off:
        raise InvalidArgument("use either start_line or offset, not both")
    if start and end and end < start:
        raise InvalidArgument("end_line must not be before start_line")
    return start, end, off


def escaped_size(text: str) -> int:
    """Bytes ``text`` takes inside a JSON string as the Hub writes it."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8")) - 2


def _line_starts(data: bytes) -> list[int]:
    starts = [0]
    find = data.find
    pos = find(b"\n")
    while pos >= 0:
        starts.append(pos + 1)
        pos = find(b"\n", pos + 1)
    return starts


def select(data: bytes, start_line: int, end_line: int, offset: int, budget: int) -> Fragment:
    """Cut the requested part of ``data`` to at most ``budget`` bytes of escaped JSON text.

    Whole lines are preferred; a single line larger than the budget is cut at a character boundary.
    ``next_offset`` is the byte offset to pass back as ``offset`` (with the same ``end_line``) to
    continue, so the pages of a read concatenate to exactly the requested bytes.

    Raises:
        InvalidArgument: the offset lies beyond the document or inside a UTF-8 character.
    """
    # Line positions cost a pass over the document; plain and offset reads need none.
    starts = _line_starts(data) if start_line or end_line else [0]
    line_count = len(starts) if starts[-1] < len(data) else len(starts) - 1
    stop = len(data)
    if end_line and end_line < line_count:
        stop = starts[end_line]
    if offset:
        if offset > len(data):
            raise InvalidArgument("offset is beyond the end of the document", offset=offset)
        if offset < len(data) and (data[offset] & 0xC0) == 0x80:
            raise InvalidArgument("offset falls inside a UTF-8 character", offset=offset)
        begin = offset
    elif start_line:
        if start_line > line_count:
            return Fragment("", False, None)
        begin = starts[start_line - 1]
    else:
        begin = 0
    if begin >= stop:
        return Fragment("", False, None)
    # Most reads are of small documents that fit whole: measure once instead of line by line.
    if stop - begin <= budget:
        whole = data[begin:stop].decode("utf-8", "replace")
        if escaped_size(whole) <= budget:
            return Fragment(whole, False, None)

    used = 0
    cursor = begin
    pieces: list[str] = []
    while cursor < stop:
        newline = data.find(b"\n", cursor, stop)
        line_end = stop if newline < 0 else newline + 1
        piece = data[cursor:line_end].decode("utf-8", "replace")
        size = escaped_size(piece)
        if used + size <= budget:
            pieces.append(piece)
            used += size
            cursor = line_end
            continue
        if not pieces:
            # One line alone exceeds the budget: take as many whole characters as fit.
            part, consumed = _fit_characters(data, cursor, line_end, budget)
            pieces.append(part)
            cursor += consumed
        break
    truncated = cursor < stop
    return Fragment("".join(pieces), truncated, cursor if truncated else None)


def _fit_characters(data: bytes, begin: int, end: int, budget: int) -> tuple[str, int]:
    # surrogateescape keeps one code point per undecodable byte, so byte offsets stay exact.
    text = data[begin:end].decode("utf-8", "surrogateescape")
    used = 0
    consumed = 0
    out: list[str] = []
    for ch in text:
        raw_byte = "\udc80" <= ch <= "\udcff"
        shown = "\ufffd" if raw_byte else ch
        size = escaped_size(shown)
        if used + size > budget:
            break
        out.append(shown)
        used += size
        consumed += 1 if raw_byte else len(ch.encode("utf-8"))
    if not out:
        # A budget too small for any character would loop forever; the caller sizes budgets sanely.
        raise InvalidArgument("response budget too small for one character")
    return "".join(out), consumed
