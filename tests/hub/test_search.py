"""Literal keyword search: query rules, Latin/CJK matching, ranking and snippets."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from hub.errors import InvalidArgument
from hub.search import Ranking, match_document, parse_limit, parse_query
from hub.store import MemoryStore

SCOPE = "global"


def doc(path: str, text: str) -> tuple[tuple[str, ...], bytes]:
    return tuple(path.split("/")), text.encode()


async def fill(store: MemoryStore, documents: dict[str, str]) -> None:
    for path, text in documents.items():
        await store.upsert(SCOPE, path, text, "absent")


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    memory = MemoryStore(tmp_path / "memory")
    memory.open()
    return memory


# -- query rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["", "   ", "\t\n", None, 3, ["a"], "ok \ud800", "\udcff"])
def test_a_query_without_keywords_or_not_valid_text_is_invalid_argument(query: object) -> None:
    with pytest.raises(InvalidArgument):
        parse_query(query)


def test_sixteen_keywords_are_accepted_and_seventeen_are_not() -> None:
    assert len(parse_query(" ".join(f"k{i}" for i in range(16))).terms) == 16
    with pytest.raises(InvalidArgument, match="16"):
        parse_query(" ".join(f"k{i}" for i in range(17)))


def test_a_query_over_512_bytes_is_rejected_counting_utf8_bytes() -> None:
    assert parse_query("x" * 512).terms == ("x" * 512,)
    with pytest.raises(InvalidArgument, match="512"):
        parse_query("x" * 513)
    # 171 CJK characters are 513 bytes although only 171 characters long.
    assert parse_query("发" * 170)
    with pytest.raises(InvalidArgument):
        parse_query("发" * 171)


def test_keywords_are_split_on_any_whitespace_and_deduplicated_ignoring_case() -> None:
    parsed = parse_query("Release\tflow  release\n发布 FLOW")
    assert parsed.terms == ("Release", "flow", "发布")
    assert parsed.folded == ("release", "flow", "发布")


def test_regex_and_glob_characters_are_literal() -> None:
    parsed = parse_query("a.*b [x] $HOME")
    data = b"literal a.*b here"
    assert match_document(("n.md",), data, parsed) is not None
    assert match_document(("n.md",), b"aXXb", parse_query("a.*b")) is None


@pytest.mark.parametrize(("limit", "expected"), [(None, 5), (1, 1), (20, 20)])
def test_limit_defaults_to_five_and_allows_up_to_twenty(limit: object, expected: int) -> None:
    assert parse_limit(limit) == expected


@pytest.mark.parametrize("limit", [0, -1, 21, 1000, True, "5", 2.0])
def test_limits_outside_one_to_twenty_are_invalid_argument(limit: object) -> None:
    with pytest.raises(InvalidArgument):
        parse_limit(limit)


# -- matching -------------------------------------------------------------------------------------


def test_latin_matching_ignores_case_both_ways() -> None:
    parts, data = doc("n.md", "We Deploy on FRIDAYS.\n")
    for query in ["deploy", "DEPLOY", "fridays", "Fridays"]:
        found = match_document(parts, data, parse_query(query))
        assert found is not None, query
        assert found.snippet == "We Deploy on FRIDAYS."


def test_chinese_matches_contiguous_text_without_spaces() -> None:
    parts, data = doc("n.md", "笔记\n我们的发布流程需要两次审核\n")
    whole = match_document(parts, data, parse_query("发布流程"))
    assert whole is not None
    assert (whole.distinct, whole.line) == (1, 2)
    assert match_document(parts, data, parse_query("发布审核")) is None


def test_separated_chinese_keywords_match_separately() -> None:
    parts, data = doc("n.md", "发布前先审核流程\n")
    assert match_document(parts, data, parse_query("发布流程")) is None
    both = match_document(parts, data, parse_query("发布 流程"))
    assert both is not None and both.distinct == 2
    one = match_document(parts, data, parse_query("发布 部署"))
    assert one is not None and one.distinct == 1


def test_any_keyword_makes_a_candidate_and_none_means_no_candidate() -> None:
    parts, data = doc("n.md", "alpha beta\n")
    assert match_document(parts, data, parse_query("gamma alpha")) is not None
    assert match_document(parts, data, parse_query("gamma delta")) is None


def test_snippet_is_the_line_of_the_earliest_match_with_its_number() -> None:
    text = "# Title\n\nfirst line\nsecond has kiwi\nthird has apple\n"
    found = match_document(*doc("n.md", text), parse_query("apple kiwi"))
    assert found is not None
    assert (found.line, found.snippet, found.snippet_truncated) == (4, "second has kiwi", False)


def test_a_match_on_a_very_long_line_gives_a_truncated_snippet_holding_the_keyword() -> None:
    text = "intro\n" + "词" * 3000 + "NEEDLE" + "x" * 5000 + "\n"
    found = match_document(*doc("n.md", text), parse_query("needle"))
    assert found is not None
    assert found.line == 2
    assert found.snippet_truncated is True
    assert "NEEDLE" in found.snippet
    assert len(found.snippet.encode()) <= 240


def test_a_path_only_match_shows_the_first_non_empty_line() -> None:
    found = match_document(*doc("deploy/notes.md", "\n\n  body text\n"), parse_query("deploy"))
    assert found is not None
    assert (found.line, found.snippet) == (3, "  body text")
    assert found.path_title == 1


_line_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=40
)


@given(
    before=st.lists(_line_text, max_size=5),
    prefix=_line_text,
    suffix=_line_text,
    keyword=st.sampled_from(["Needle", "发布流程", "ÜBER", "ok"]),
)
# Some capitals lower-case to two characters ("İ" → "i̇"): positions must not drift.
@example(before=["İİ"], prefix="", suffix="", keyword="Needle")
@example(before=[], prefix="İstanbul ", suffix=" İ", keyword="ok")
def test_the_snippet_is_the_line_that_contains_the_first_match(
    before: list[str], prefix: str, suffix: str, keyword: str
) -> None:
    lines = [*before, prefix + keyword + suffix]
    text = "\n".join(lines) + "\n"
    found = match_document(("n.md",), text.encode(), parse_query(keyword))
    assert found is not None
    low = keyword.lower()
    expected = next(i for i, line in enumerate(lines) if low in line.lower())
    assert found.line == expected + 1
    assert found.snippet == lines[expected]
    assert low in found.snippet.lower()


# -- ranking --------------------------------------------------------------------------------------


def test_ranking_keeps_the_best_and_counts_every_match() -> None:
    ranking = Ranking(limit=2)
    query = parse_query("a b c")
    texts = {"z.md": "a b c", "y.md": "a", "x.md": "a b", "w.md": "c", "v.md": "b c"}
    for path, text in texts.items():
        found = match_document(*doc(path, text), query)
        assert found is not None
        ranking.offer(found)
    assert ranking.matched == 5
    assert ["/".join(c.parts) for c in ranking.ranked()] == ["z.md", "v.md"]


async def test_more_distinct_keywords_rank_first_then_path_or_title_then_path_order(
    store: MemoryStore,
) -> None:
    await fill(
        store,
        {
            "a/one.md": "mentions release once\n",
            "b/two.md": "release and rollback both\n",
            "c/release.md": "nothing else here\n",
            "d/titled.md": "# Release notes\nbody\n",
            "e/three.md": "release rollback canary\n",
            "f/plain.md": "release\n",
            "g/rollback.md": "release here too\n",
        },
    )
    result = await store.search(SCOPE, "release rollback canary", limit=20)
    assert [m.path for m in result.matches] == [
        "e/three.md",  # three distinct keywords
        "g/rollback.md",  # two, one of them in the path
        "b/two.md",  # two, in the body only
        "c/release.md",  # one, in the path
        "d/titled.md",  # one, in the title
        "a/one.md",  # one, body only: path order from here
        "f/plain.md",
    ]
    assert result.truncated is False


async def test_ties_fall_back_to_stable_path_order(store: MemoryStore) -> None:
    # "C.md" sorts before "a.md" by bytes; a case twin of an existing name is refused.
    paths = ["b.md", "a/z.md", "a.md", "a/b/c.md", "中文.md", "C.md"]
    await fill(store, dict.fromkeys(paths, "shared word\n"))
    result = await store.search(SCOPE, "word", limit=20)
    found = [m.path for m in result.matches]
    assert found == sorted(found, key=lambda p: tuple(p.split("/")))
    assert set(found) == set(paths)


async def test_a_repeated_keyword_counts_once(store: MemoryStore) -> None:
    await fill(store, {"a.md": "kiwi kiwi kiwi\n", "b.md": "kiwi mango\n"})
    result = await store.search(SCOPE, "kiwi KIWI mango")
    assert [m.path for m in result.matches] == ["b.md", "a.md"]


def test_a_case_free_query_matches_without_lower_casing_the_document() -> None:
    parsed = parse_query("发布 2024")
    assert parsed.folds_ascii is False
    assert match_document(("n.md",), "2024 年的发布\n".encode(), parsed) is not None
    assert parse_query("Deploy 发布").folds_ascii is True
    assert parse_query("ÜBER").needles == (None,)


_vocab = ["alpha", "Beta", "GAMMA", "发布", "流程", "审核", "delta", "🚀", "#", "# alpha"]


@given(
    docs=st.dictionaries(
        st.lists(st.sampled_from(["a", "b", "alpha", "流程", "z"]), min_size=1, max_size=3).map(
            lambda parts: "/".join(parts) + ".md"
        ),
        st.lists(st.lists(st.sampled_from(_vocab), max_size=6), max_size=6),
        max_size=12,
    ),
    query=st.lists(st.sampled_from(_vocab), min_size=1, max_size=4),
    limit=st.integers(1, 20),
)
def test_ranking_agrees_with_a_plain_reading_of_the_rules(
    docs: dict[str, list[list[str]]], query: list[str], limit: int
) -> None:
    parsed = parse_query(" ".join(query))
    ranking = Ranking(limit)
    expected = []
    for path, lines in docs.items():
        text = "\n".join(" ".join(words) for words in lines) + "\n"
        parts = tuple(path.split("/"))
        found = match_document(parts, text.encode(), parsed)
        if found is not None:
            ranking.offer(found)
        body = text.lower()
        first = next((line for line in text.split("\n") if line.strip()), "")
        title = first.strip().lstrip("#").strip().lower() if first.strip().startswith("#") else ""
        in_text = [t for t in parsed.folded if t in body]
        in_heading = [t for t in parsed.folded if t in path.lower() or t in title]
        distinct = len(set(in_text) | set(in_heading))
        assert (found is not None) == (distinct > 0)
        if distinct:
            expected.append((-distinct, -len(in_heading), parts))
    assert [c.rank_key for c in ranking.ranked()] == sorted(expected)[:limit]
    assert ranking.matched == len(expected)
