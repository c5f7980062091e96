import pytest

from cards import actions
from cards.memory import (
    DOCUMENT_CHARS,
    forget_confirm_card,
    forget_done_card,
    memory_document_card,
    memory_list_card,
    memory_search_card,
)
from cards.models import (
    LANGS,
    ForgetOutcome,
    Lang,
    MemoryDocument,
    MemoryItem,
    MemoryList,
    MemorySearch,
    SearchHit,
)
from tests.cards.structure import all_text, assert_valid_card, callbacks, tags

REV = "a" * 64


@pytest.mark.parametrize("lang", LANGS)
def test_list_offers_open_per_document_and_a_search_form(lang: Lang) -> None:
    view = MemoryList(
        scope="global",
        items=(MemoryItem("MEMORY.md", REV, 120), MemoryItem("topics/review-format.md", REV)),
    )
    card = memory_list_card(view, lang)
    assert_valid_card(card)
    values = callbacks(card)
    opens = [v["path"] for v in values if v["action"] == actions.MEMORY_OPEN]
    assert opens == ["MEMORY.md", "topics/review-format.md"]
    assert "form" in tags(card)
    assert actions.MEMORY_SEARCH in [v["action"] for v in values]


def test_empty_list_says_so() -> None:
    card = memory_list_card(MemoryList(scope="global", items=()), "en_us")
    assert "No memory documents" in all_text(card)


def test_search_shows_snippets_verbatim_and_flags_incomplete() -> None:
    view = MemorySearch(
        scope="global",
        query="review",
        hits=(SearchHit("topics/review-format.md", "<at id=all></at> **conclusion**", 3),),
        incomplete=True,
    )
    card = memory_search_card(view, "en_us")
    assert_valid_card(card)
    snippet = next(el for el in _walk(card) if el["tag"] == "div")
    assert snippet["text"] == {"tag": "plain_text", "content": "<at id=all></at> **conclusion**"}
    assert "incomplete" in all_text(card)


def test_document_view_offers_more_forget_with_revision_and_back() -> None:
    view = MemoryDocument("MEMORY.md", REV, "x" * (DOCUMENT_CHARS + 10), next_offset=8192)
    card = memory_document_card(view, "en_us")
    assert_valid_card(card)
    values = callbacks(card)
    assert values[0] == {"action": "memory.open", "path": "MEMORY.md", "offset": 8192}
    assert values[1] == {"action": "memory.forget.ask", "path": "MEMORY.md", "revision": REV}
    assert values[2] == {"action": "memory.erase.ask", "path": "MEMORY.md"}
    assert values[3] == {"action": "memory.list"}


@pytest.mark.parametrize("lang", LANGS)
def test_forget_confirmation_carries_the_revision_the_user_saw(lang: Lang) -> None:
    card = forget_confirm_card("topics/a_b.md", REV, lang)
    assert_valid_card(card)
    confirm, cancel = callbacks(card)
    assert confirm == {"action": "memory.forget.confirm", "path": "topics/a_b.md", "revision": REV}
    assert cancel["action"] == actions.MEMORY_OPEN
    assert "topics/a&#95;b.md" in all_text(card)


def test_forget_outcome_distinguishes_already_absent() -> None:
    assert "deleted" in all_text(forget_done_card(ForgetOutcome("a.md"), "en_us"))
    gone = forget_done_card(ForgetOutcome("a.md", already_absent=True), "en_us")
    assert "already gone" in all_text(gone)
    assert_valid_card(gone)


def test_no_interactive_element_lacks_a_callback() -> None:
    view = MemoryList("global", (MemoryItem("a.md", REV),), truncated=True)
    card = memory_list_card(view, "zh_cn")
    assert all("action" in v for v in callbacks(card))
    assert "更多文档" in all_text(card)


def _walk(card: dict[str, object]) -> list[dict[str, object]]:
    from tests.cards.structure import walk

    return list(walk(card))
