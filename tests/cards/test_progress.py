import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cards.elements import CARD_MAX_BYTES, encoded_size
from cards.models import (
    LANGS,
    ApprovalView,
    BranchView,
    ChangedFileView,
    FinishView,
    Lang,
    MemoryNote,
    ProgressView,
    TurnApprovals,
    TurnMemory,
)
from cards.progress import progress_card, result_cards, split_text
from tests.cards.structure import all_text, assert_valid_card, callbacks

prose = st.text(
    alphabet=st.sampled_from(list('ab \n\n"\\`#*中文\t')) | st.characters(codec="utf-8"),
    max_size=3000,
)


@given(prose, st.integers(min_value=8, max_value=400))
@settings(max_examples=200, deadline=None)
def test_split_concatenates_back_to_the_input_within_the_limit(text: str, limit: int) -> None:
    pieces = split_text(text, limit)
    assert "".join(pieces) == text
    for piece in pieces:
        assert piece
        assert encoded_size(piece) - 2 <= limit


def test_split_prefers_paragraph_then_line_boundaries() -> None:
    paragraphs = [f"para {i} " + "word " * 30 for i in range(10)]
    text = "\n\n".join(paragraphs)
    pieces = split_text(text, 400)
    assert len(pieces) > 1
    for piece in pieces[:-1]:
        assert piece.endswith("\n\n")
    lines = "\n".join(f"line {i} " + "x" * 50 for i in range(40))
    for piece in split_text(lines, 300)[:-1]:
        assert piece.endswith("\n")


def test_split_cuts_hard_only_when_there_is_no_boundary() -> None:
    text = "x" * 1000
    pieces = split_text(text, 300)
    assert [len(p) for p in pieces] == [300, 300, 300, 100]


def test_short_result_is_one_card() -> None:
    cards = result_cards("All done.", "en_us", title="fix the build")
    assert len(cards) == 1
    assert cards[0]["header"]["title"]["content"] == "Result"
    assert_valid_card(cards[0])


@pytest.mark.parametrize("lang", LANGS)
def test_long_result_is_split_into_numbered_cards_under_the_size_limit(lang: Lang) -> None:
    text = "\n\n".join(f"Section {i}\n" + '内容 and "quotes"\n' * 200 for i in range(20))
    cards = result_cards(text, lang)
    assert len(cards) > 1
    for index, card in enumerate(cards, start=1):
        assert_valid_card(card)
        assert encoded_size(card) <= CARD_MAX_BYTES
        assert f"{index}/{len(cards)}" in card["header"]["title"]["content"]
    joined = "".join(card["body"]["elements"][0]["content"] for card in cards)
    assert joined == text


def test_a_code_block_cut_in_two_is_closed_and_reopened() -> None:
    text = "intro\n\n```python\n" + "print('x')\n" * 4000 + "```\n\nafter"
    cards = result_cards(text, "en_us")
    contents = [card["body"]["elements"][0]["content"] for card in cards]
    assert len(contents) > 1
    assert contents[0].endswith("\n```")
    assert contents[1].startswith("```python\n")
    for content in contents:
        fences = [line for line in content.split("\n") if line.startswith("```")]
        assert len(fences) % 2 == 0


def test_result_cannot_mention_everyone() -> None:
    cards = result_cards("hi <at id=all></at>", "en_us")
    assert "<at" not in all_text(cards[0])


@pytest.mark.parametrize("lang", LANGS)
def test_running_progress_offers_stop_and_shows_the_latest_lines(lang: Lang) -> None:
    view = ProgressView(
        title="fix the build",
        status="running",
        lines=tuple(f"step {i}" for i in range(30)),
        elapsed_seconds=12.4,
        run_id="run_1",
    )
    card = progress_card(view, lang)
    assert_valid_card(card)
    assert callbacks(card) == [{"action": "run.cancel", "run_id": "run_1"}]
    text = all_text(card)
    assert "step 29" in text and "step 17" not in text
    assert "12" in text


def test_finished_progress_has_no_stop_button() -> None:
    card = progress_card(ProgressView(title="t", status="done", lines=("ok",)), "en_us")
    assert callbacks(card) == []
    assert card["header"]["template"] == "green"


@pytest.mark.parametrize("lang", LANGS)
def test_a_result_card_lists_what_the_turn_read_and_changed_with_an_undo_per_change(
    lang: Lang,
) -> None:
    from cards.models import MemoryNote, TurnMemory

    memory = TurnMemory(
        "p-alice",
        (
            MemoryNote("read", "MEMORY.md", "a" * 64),
            MemoryNote("searched", ""),
            MemoryNote("saved", "topics/re`view.md", "b" * 64, "c" * 64),
            MemoryNote("forgot", "old.md", None, "d" * 64),
        ),
    )
    (first,) = result_cards("Done.", lang, memory=memory)
    assert_valid_card(first)
    shown = all_text(first)
    assert "MEMORY.md" in shown and "bbbbbbbb" in shown and "old.md" in shown
    # A backtick in a path cannot close the code span early.
    assert "`topics/re'view.md`" in shown
    undos = [v for v in callbacks(first) if v["action"] == "memory.undo"]
    assert [u["path"] for u in undos] == ["topics/re`view.md", "old.md"]
    assert all(u["principal_id"] == "p-alice" for u in undos)
    assert undos[0]["previous_revision"] == "c" * 64
    assert "revision" not in undos[1]

    (unused,) = result_cards("Done.", lang, memory=TurnMemory("p-alice"))
    assert not [v for v in callbacks(unused) if v["action"] == "memory.undo"]
    (unbound,) = result_cards("Done.", lang)
    assert all_text(unbound) != all_text(unused)


@pytest.mark.parametrize("lang", LANGS)
def test_a_file_too_large_to_diff_is_named_so_not_as_binary(lang: Lang) -> None:
    files = (
        ChangedFileView("notes.txt", 1, 0),
        ChangedFileView("logo.png", None, None),
        ChangedFileView("table.csv", None, None, too_large=True),
    )
    (card,) = result_cards("Done.", lang, branch=BranchView("amux/1a2b", "main", files, 3))
    shown = all_text(card)
    binary, too_large = {
        "en_us": ("binary", "over 1 MiB, not diffed"),
        "zh_cn": ("二进制", "超过 1 MiB，未比较差异"),
    }[lang]
    assert "`notes.txt` +1 −0" in shown
    assert f"`logo.png` {binary}" in shown
    assert f"`table.csv` {too_large}" in shown


def _joined(cards: list[dict[str, object]]) -> str:
    """The answer the cards hold, the code fences a split reopened taken out again."""
    pieces = [c["body"]["elements"][0]["content"] for c in cards]  # type: ignore[index]
    joined = pieces[0]
    for piece in pieces[1:]:
        if joined.endswith("\n```") and piece.startswith("```"):
            joined = joined[: -len("\n```")]
            piece = piece.split("\n", 1)[1]
        joined += piece
    return joined


@pytest.mark.parametrize("lang", LANGS)
def test_every_result_card_fits_whatever_its_sections_hold_and_the_answer_is_whole(
    lang: Lang,
) -> None:
    long_path = "/".join(ch * 200 for ch in "abcd") + "/中`文.py"
    branch = BranchView(
        "amux/1a2b3c4d",
        "main",
        tuple(ChangedFileView(f"{long_path}{n}", 3, 1) for n in range(200)),
        200,
        diff_attached=True,
        diff_truncated=True,
    )
    notes = tuple(
        MemoryNote(op, f"{long_path}{n}.md", "f" * 64, "e" * 64)
        for n in range(40)
        for op in ("read", "saved", "forgot")
    )
    huge = ApprovalView("run_1", "r", "T*" * 500, "edit", "中`" * 3000, "d", 0.0, reason="<" * 500)
    approvals = TurnApprovals((huge,) * 40, ("规" * 3000,) * 40)
    answer = "```" + "py" * 500 + "\n" + ("中文 `code` <at id=all></at>\n" * 3000) + "```\nend"
    finish = FinishView({"input_tokens": 10**9, "output_tokens": 10**9}, 10**6, "feishu:oc:om")
    cards = result_cards(
        answer,
        lang,
        title="t" * 500,
        memory=TurnMemory("p-alice", notes),
        approvals=approvals,
        branch=branch,
        finish=finish,
    )
    assert len(cards) > 1
    for shown in cards:
        assert_valid_card(shown)
        assert encoded_size(shown) <= CARD_MAX_BYTES
    assert _joined(cards) == answer.replace("<at", "&lt;at")
    first = all_text(cards[0])
    # Each section shows what fits its budget, and counts the rest.
    assert "200 file(s)" in first or "200 个文件" in first


@pytest.mark.parametrize("lang", LANGS)
def test_a_recalled_turn_says_who_recalled_it_instead_of_who_stopped_it(lang: Lang) -> None:
    view = ProgressView("deploy", "cancelled", (), 3.0, stopped_by="bob", recalled_by="Bob *Li*")
    card = progress_card(view, lang)
    assert_valid_card(card)
    shown = all_text(card)
    recalled = {"en_us": "Recalled by", "zh_cn": "撤回"}[lang]
    # The name is escaped: it cannot restyle the card.
    assert recalled in shown and "Bob &#42;Li&#42;" in shown
    assert "Stopped by" not in shown and "由 **bob** 停止" not in shown
