"""Literal keyword search: query parsing, matching and ranking. Pure: no files, no clock.

Keywords are whitespace-separated literals. Matching lower-cases both sides, so Latin text matches
regardless of case, and Chinese (which has no spaces) matches as a contiguous substring. There is no
tokenizer, regular expression, glob or index: what the Agent typed is what is looked for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hub.errors import InvalidArgument
from hub.limits import DEFAULT_LIMITS, Limits


@dataclass(frozen=True)
class Query:
    terms: tuple[str, ...]
    folded: tuple[str, ...]


def parse_query(query: object, limits: Limits = DEFAULT_LIMITS) -> Query:
    """Split a query into distinct literal keywords.

    Raises:
        InvalidArgument: not a string, empty, over the byte limit or over the keyword limit.
    """
    if not isinstance(query, str):
        raise InvalidArgument("query must be a string")
    if len(query.encode("utf-8", "surrogatepass")) > limits.query_bytes:
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
    return Query(tuple(kept), tuple(folded))


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
    parts: tuple[str, ...]
    data: bytes
    distinct: int
    path_title: int
    line: int
    snippet: str
    snippet_truncated: bool
    rank_key: tuple[int, int, tuple[str, ...]] = field(init=False)

    def __post_init__(self) -> None:
        self.rank_key = (-self.distinct, -self.path_title, self.parts)


def match_document(
    parts: tuple[str, ...], data: bytes, query: Query, limits: Limits = DEFAULT_LIMITS
) -> Candidate | None:
    """Score one document against the query; None when no keyword occurs in its path or text."""
    text = data.decode("utf-8", "replace")
    low = text.lower()
    path_low = "/".join(parts).lower()
    title_low = _title(text).lower()
    distinct = 0
    path_title = 0
    first_pos = -1
    for term in query.folded:
        pos = low.find(term)
        in_heading = term in path_low or term in title_low
        if pos < 0 and not in_heading:
            continue
        distinct += 1
        if in_heading:
            path_title += 1
        if pos >= 0 and (first_pos < 0 or pos < first_pos):
            first_pos = pos
    if distinct == 0:
        return None
    line, snippet, truncated = _snippet(text, low, first_pos, limits.snippet_bytes)
    return Candidate(parts, data, distinct, path_title, line, snippet, truncated)


def _title(text: str) -> str:
    for raw in text.split("\n", 64)[:64]:
        stripped = raw.strip()
        if stripped.startswith("#"):
            return stripped.lstrip("#").strip()
        if stripped:
            return ""
    return ""


def _snippet(text: str, low: str, pos: int, budget: int) -> tuple[int, str, bool]:
    """The line holding the first match, cut to ``budget`` UTF-8 bytes around the match."""
    if pos < 0:
        # Only the path or title matched: show the document's first non-empty line.
        for number, raw in enumerate(text.split("\n"), start=1):
            if raw.strip():
                cut, truncated = _clip(raw.rstrip("\r"), 0, budget)
                return number, cut, truncated
        return 1, "", False
    # lower() never adds or removes a newline, so positions in ``low`` count lines of ``text``.
    line = low.count("\n", 0, pos) + 1
    start = low.rfind("\n", 0, pos) + 1
    end = low.find("\n", pos)
    if end < 0:
        end = len(low)
    raw = text[start:end].rstrip("\r")
    cut, truncated = _clip(raw, min(pos - start, len(raw)), budget)
    return line, cut, truncated


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


def encoded_size(value: object) -> int:
    """Bytes of ``value`` as the Hub writes JSON (UTF-8, not ASCII-escaped)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
