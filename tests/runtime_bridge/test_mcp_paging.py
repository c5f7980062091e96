"""The pure paging of MCP tool results: parts, trailers and cursors."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.errors import NotFound
from runtime_bridge.mcp_paging import (
    CONTINUE_TOOL,
    PAGE_BYTES,
    TRAILER_RESERVE,
    Page,
    PageCache,
    split_text,
    trailer,
    utf8_size,
)


def counter_ids() -> PageCache:
    numbers = itertools.count(1)
    return PageCache(lambda: f"r{next(numbers)}")


def walk(cache: PageCache, first: Page, now: float = 0.0) -> list[Page]:
    pages = [first]
    while pages[-1].next_cursor is not None:
        pages.append(cache.next_page(pages[-1].next_cursor, now))
    return pages


@given(st.text(), st.integers(min_value=4, max_value=64))
def test_split_parts_join_to_the_text_and_respect_the_budget(text: str, budget: int) -> None:
    parts = split_text(text, budget)
    assert "".join(parts) == text
    assert all(utf8_size(part) <= budget for part in parts)
    assert all(parts) or parts == [""]


def test_split_never_cuts_inside_a_character() -> None:
    text = "记忆" * 10 + "😀" * 5
    parts = split_text(text, 5)
    assert "".join(parts) == text
    for part in parts:
        part.encode("utf-8")  # each part is whole characters


def test_split_refuses_a_budget_smaller_than_a_character() -> None:
    with pytest.raises(ValueError):
        split_text("abc", 3)


def test_a_result_within_the_budget_goes_out_whole_and_is_not_kept() -> None:
    cache = counter_ids()
    text = "x" * PAGE_BYTES
    page = cache.first_page(text, now=0.0)
    assert page.blocks() == [text]
    assert page.next_cursor is None
    assert len(cache) == 0


@given(st.text(min_size=1, max_size=9000).map(lambda t: t * (1 + 7000 // max(1, len(t)))))
def test_pages_of_a_long_result_join_to_it_and_each_fits_the_page(text: str) -> None:
    cache = counter_ids()
    pages = walk(cache, cache.first_page(text, now=0.0))
    assert "".join(page.body for page in pages) == text
    for page in pages:
        assert sum(utf8_size(block) for block in page.blocks()) <= PAGE_BYTES
    if utf8_size(text) > PAGE_BYTES:
        assert len(pages) > 1
        assert [p.number for p in pages] == list(range(1, len(pages) + 1))
        assert {p.total for p in pages} == {len(pages)}


def test_a_cut_part_tells_the_model_how_to_continue() -> None:
    cache = counter_ids()
    page = cache.first_page("a" * 20_000, now=0.0)
    body, note = page.blocks()
    assert page.next_cursor is not None
    assert CONTINUE_TOOL in note and f'"{page.next_cursor}"' in note
    assert "part 1 of 4" in note
    last = walk(cache, page)[-1]
    assert last.blocks() == [last.body]


def test_the_trailer_fits_its_reserve_even_for_the_longest_cursor() -> None:
    longest = "x" * 64 + ".999999"
    assert utf8_size(trailer(longest, 999_999, 999_999)) < TRAILER_RESERVE


def test_resending_a_cursor_returns_the_same_part() -> None:
    cache = counter_ids()
    first = cache.first_page("b" * 20_000, now=0.0)
    assert first.next_cursor is not None
    again = cache.next_page(first.next_cursor, now=1.0)
    assert cache.next_page(first.next_cursor, now=2.0) == again


@pytest.mark.parametrize("cursor", ["", "r1", "r1.0", "r1.9", "r2.2", "../r1.2", "r1.2 ", "r1.02"])
def test_unknown_or_malformed_cursors_are_a_clear_not_found(cursor: str) -> None:
    cache = counter_ids()
    cache.first_page("c" * 20_000, now=0.0)
    with pytest.raises(NotFound, match="unknown or has expired"):
        cache.next_page(cursor, now=0.0)


def test_cursors_expire_after_the_ttl_unless_used() -> None:
    numbers = itertools.count(1)
    cache = PageCache(lambda: f"r{next(numbers)}", ttl=10.0)
    first = cache.first_page("d" * 20_000, now=0.0)
    assert first.next_cursor is not None
    second = cache.next_page(first.next_cursor, now=9.0)  # use slides the expiry
    assert second.next_cursor is not None
    cache.next_page(second.next_cursor, now=18.0)
    with pytest.raises(NotFound):
        cache.next_page(second.next_cursor, now=28.5)
    assert len(cache) == 0


def test_the_cache_keeps_only_the_most_recently_used_results() -> None:
    numbers = itertools.count(1)
    cache = PageCache(lambda: f"r{next(numbers)}", capacity=2)
    one = cache.first_page("e" * 20_000, now=0.0)
    two = cache.first_page("f" * 20_000, now=0.0)
    assert one.next_cursor is not None and two.next_cursor is not None
    cache.next_page(one.next_cursor, now=0.0)  # one is now the most recent
    cache.first_page("g" * 20_000, now=0.0)
    assert cache.next_page(one.next_cursor, now=0.0).body.startswith("e")
    with pytest.raises(NotFound):
        cache.next_page(two.next_cursor, now=0.0)


def test_an_id_source_giving_unusable_ids_is_refused() -> None:
    cache = PageCache(lambda: "not an id!")
    with pytest.raises(ValueError):
        cache.first_page("h" * 20_000, now=0.0)
