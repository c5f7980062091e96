"""Literal keyword search: query parsing, matching and ranking. Pure: no files, no clock.

Keywords are whitespace-separated literals. Matching lower-cases both sides, so Latin text matches
regardless of case, and Chinese (which has no spaces) matches as a contiguous substring. There is no
tokenizer, regular expression, glob or index: what the Agent typed is what is looked for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property

from hub.errors import InvalidArgument
from hub.limits import DEFAULT_LIMITS, Limits


@dataclass(frozen=True)
class Query:
    terms: tuple[str, ...]
    folded: tuple[str, ...]
    # Per folded keyword: its UTF-8 bytes to find in ASCII-lower-cased document bytes, or None
    # when it holds cased non-ASCII letters ("ÜBER") and needs the decoded text lower-cased.
    needles: tuple[bytes | None, ...] = ()
    # Whether any needle has ASCII letters, i.e. whether documents must be lower-cased at all.
    folds_ascii: bool = True


def _needs_unicode_folding(term: str) -> bool:
    # ASCII case folding works on bytes (bytes.lower() leaves UTF-8 sequences alone), so only
    # keywords with cased non-ASCII letters need the document decoded and lower-cased.
    return any(ord(ch) > 127 and (ch.lower() != ch or ch.upper() != ch) for ch in term)


def parse_query(query: object, limits: Limits = DEFAULT_LIMITS) -> Query:
    """Split a query into distinct literal keywords.

    Raises:
        InvalidArgument: not a string of valid text, empty, over the byte limit or over the
            keyword limit.
    """
    if not isinstance(query, str):
        raise InvalidArgument("query must be a string")
    try:
        size = len(query.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument("query is not valid UTF-8 text") from None
    if size > limits.query_bytes:
        raise InvalidArgument(f"query is longer than {limits.query_bytes} bytes")
    terms = query.split()
    if not terms:
        raise InvalidArgument("query needs at least one keyword")
    if len(terms) > limits.query_terms:
        raise InvalidArgument(f"query has more than {limits.query_terms} keywords")
    folded: list[str] = []
    kept: list[str] = []
    for term in terms:
        low = term.lower()
        if low not in folded:
            folded.append(low)
            kept.append(term)
    needles = tuple(
        None if _needs_unicode_folding(low) else low.encode("utf-8") for low in folded
    )
    folds_ascii = any(
        needle is None or any(65 <= b <= 90 or 97 <= b <= 122 for b in needle)
        for needle in needles
    )
    return Query(tuple(kept), tuple(folded), needles, folds_ascii)


def parse_limit(limit: object, limits: Limits = DEFAULT_LIMITS) -> int:
    """Validate the requested number of results; None means the default.

    Raises:
        InvalidArgument: not an integer between 1 and the maximum.
    """
    if limit is None:
        return limits.search_default_results
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidArgument("limit must be an integer")
    if not 1 <= limit <= limits.search_max_results:
        raise InvalidArgument(f"limit must be between 1 and {limits.search_max_results}")
    return limit


@dataclass
class Candidate:
    """A matching document. Its snippet is cut only if it makes the ranked results."""

    parts: tuple[str, ...]
    data: bytes
    distinct: int
    path_title: int
    # 1-based line of the earliest keyword in the text and that keyword, or (0, "") when only the
    # path or title matched.
    first_line: int
    first_term: str
    snippet_bytes: int = DEFAULT_LIMITS.snippet_bytes
    rank_key: tuple[int, int, tuple[str, ...]] = field(init=False)

    def __post_init__(self) -> None:
        self.rank_key = (-self.distinct, -self.path_title, self.parts)

    @cached_property
    def _shown(self) -> tuple[int, str, bool]:
        return _snippet(self.data, self.first_line, self.first_term, self.snippet_bytes)

    @property
    def line(self) -> int:
        return self._shown[0]

    @property
    def snippet(self) -> str:
        return self._shown[1]

    @property
    def snippet_truncated(self) -> bool:
        return self._shown[2]


def match_document(
    parts: tuple[str, ...],
    data: bytes,
    query: Query,
    limits: Limits = DEFAULT_LIMITS,
    lowered: bytes | None = None,
) -> Candidate | None:
    """Score one document against the query; None when no keyword occurs in its path or text.

    ``lowered`` is ``data.lower()`` if the caller already has it.
    """
    if query.folds_ascii:
        haystack = lowered if lowered is not None else data.lower()
    else:
        haystack = data
    low_text: str | None = None
    path_low = "/".join(parts).lower()
    title_low: str | None = None
    distinct = 0
    path_title = 0
    first_pos = -1  # earliest byte position among keywords found in the bytes
    first_line = 0
    first_term = ""
    first_byte_term = ""
    for term, needle in zip(query.folded, query.needles, strict=True):
        found = False
        if needle is None:
            if low_text is None:
                low_text = data.decode("utf-8", "replace").lower()
            pos = low_text.find(term)
            if pos >= 0:
                found = True
                # lower() never adds or removes a newline, so lines still count right.
                line = low_text.count("\n", 0, pos) + 1
                if not first_line or line < first_line:
                    first_line, first_term = line, term
        else:
            pos = haystack.find(needle)
            if pos >= 0:
                found = True
                if first_pos < 0 or pos < first_pos:
                    first_pos, first_byte_term = pos, term
        in_heading = term in path_low
        # The title is the text's first line, so only a keyword found in the text can be in it.
        if found and not in_heading:
            if title_low is None:
                title_low = title_of(data).lower()
            in_heading = term in title_low
        if not found and not in_heading:
            continue
        distinct += 1
        if in_heading:
            path_title += 1
    if distinct == 0:
        return None
    if first_pos >= 0:
        line = haystack.count(b"\n", 0, first_pos) + 1
        if not first_line or line <= first_line:
            first_line, first_term = line, first_byte_term
    return Candidate(
        parts, data, distinct, path_title, first_line, first_term, limits.snippet_bytes
    )


_HEADING = re.compile(rb"\s*(#[^\n]*)")
_HEAD_BYTES = 4096


def title_of(data: bytes) -> str:
    """The text of a leading Markdown heading, if the first non-empty line is one (looked for
    in the first 4 KiB)."""
    # Matched in place: slicing and stripping the head would copy it for every document.
    heading = _HEADING.match(data, 0, _HEAD_BYTES)
    if heading is None:
        return ""
    return heading.group(1).lstrip(b"#").strip().decode("utf-8", "replace")


def _line_bytes(data: bytes, number: int) -> bytes:
    start = 0
    for _ in range(number - 1):
        start = data.index(b"\n", start) + 1
    end = data.find(b"\n", start)
    return data[start:] if end < 0 else data[start:end]


def _snippet(data: bytes, line: int, term: str, budget: int) -> tuple[int, str, bool]:
    """The line holding the first match, cut to ``budget`` UTF-8 bytes around the match."""
    if not line:
        # Only the path or title matched: show the document's first non-empty line.
        for number, raw in enumerate(data.split(b"\n"), start=1):
            if raw.strip():
                text = raw.decode("utf-8", "replace").rstrip("\r")
                cut, truncated = _clip(text, 0, budget)
                return number, cut, truncated
        return 1, "", False
    text = _line_bytes(data, line).decode("utf-8", "replace").rstrip("\r")
    cut, truncated = _clip(text, _focus(text, term), budget)
    return line, cut, truncated


def _focus(text: str, term: str) -> int:
    """Where ``term`` starts in ``text``, in characters of ``text`` (not of its lower case)."""
    pos = text.lower().find(term)
    if pos <= 0:
        return max(pos, 0)
    # A few capitals lower-case to two characters ("İ"), so walk to map the position back.
    lowered = 0
    for index, ch in enumerate(text):
        if lowered >= pos:
            return index
        lowered += len(ch.lower())
    return len(text)


def _clip(line: str, focus: int, budget: int) -> tuple[str, bool]:
    if len(line.encode("utf-8")) <= budget:
        return line, False
    # Start a little before the match so the keyword is shown with some context.
    begin = max(0, focus - budget // 4)
    out: list[str] = []
    used = 0
    for ch in line[begin:]:
        size = len(ch.encode("utf-8"))
        if used + size > budget:
            break
        out.append(ch)
        used += size
    return "".join(out), True


@dataclass
class Ranking:
    """Keeps the best ``limit`` candidates while a scan goes on, and how many matched in all."""

    limit: int
    best: list[Candidate] = field(default_factory=list)
    matched: int = 0

    def offer(self, candidate: Candidate) -> None:
        self.matched += 1
        self.best.append(candidate)
        if len(self.best) > self.limit * 2:
            self.best.sort(key=lambda c: c.rank_key)
            del self.best[self.limit :]

    def ranked(self) -> list[Candidate]:
        self.best.sort(key=lambda c: c.rank_key)
        return self.best[: self.limit]


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def encoded_size(value: object) -> int:
    """Bytes of ``value`` as the Hub writes JSON (UTF-8, not ASCII-escaped)."""
    return len(_ENCODER.encode(value).encode("utf-8"))
