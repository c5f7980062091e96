"""The Agent's plan and steps on its cards: a checklist and the tools it used on the progress card,
the streamed text and the result card, each within Feishu's card limit however long they are."""

from __future__ import annotations

import pytest

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
from cards.progress import progress_card, result_cards
from cards.streaming import stream_text, streaming_card
from tests.cards.structure import all_text, assert_valid_card

PLAN = (
    ("Read the parser", "completed"),
    ("Fix the *bug* <at id=all></at>", "in_progress"),
    ("Run the tests", "pending"),
)


@pytest.mark.parametrize("lang", LANGS)
def test_the_progress_card_shows_the_plan_as_a_checklist_with_each_steps_state(
    lang: Lang,
) -> None:
    view = ProgressView("fix it", "running", ("working",), 3.0, "run_1", plan=PLAN)
    card = progress_card(view, lang)
    assert_valid_card(card)
    shown = all_text(card)
    assert "✅ ~~Read the parser~~" in shown
    # A step's text is the Agent's: it cannot restyle the card nor mention anyone.
    assert "🔄 Fix the &#42;bug&#42;" in shown and "<at" not in shown
    assert "⬜ Run the tests" in shown
    assert {"en_us": "1/3 done", "zh_cn": "已完成 1/3"}[lang] in shown
    # Above what the Agent said.
    assert shown.index("Run the tests") < shown.index("working")


def test_a_card_without_a_plan_shows_no_plan() -> None:
    card = progress_card(ProgressView("t", "running", ("working",), 1.0, "run_1"), "en_us")
    assert "Plan" not in all_text(card)


def test_the_streamed_text_leads_with_the_plan() -> None:
    streamed = stream_text(["said this"], PLAN, "en_us")
    assert streamed.startswith("**Plan** (1/3 done)")
    assert streamed.endswith("said this")
    card = streaming_card(ProgressView("t", "running", (), 1.0, "run_1", plan=PLAN), "en_us")
    assert "⬜ Run the tests" in all_text(card)


@pytest.mark.parametrize("lang", LANGS)
def test_the_result_card_keeps_the_plans_final_state(lang: Lang) -> None:
    final = tuple((step, "completed") for step, _ in PLAN)
    (card,) = result_cards("All done.", lang, title="fix it", plan=final)
    assert_valid_card(card)
    shown = all_text(card)
    assert "✅ ~~Run the tests~~" in shown and "⬜" not in shown
    assert {"en_us": "3/3 done", "zh_cn": "已完成 3/3"}[lang] in shown


def test_a_long_plan_keeps_the_steps_still_to_do_and_counts_the_rest() -> None:
    plan = tuple((f"done step {n} " + "x" * 150, "completed") for n in range(60)) + tuple(
        (f"open step {n}", "pending") for n in range(5)
    )
    shown = all_text(progress_card(ProgressView("t", "running", plan=plan), "en_us"))
    for n in range(5):
        assert f"open step {n}" in shown
    assert "done step 0 " not in shown
    assert "more" in shown and "(60/65 done)" in shown


@pytest.mark.parametrize("lang", LANGS)
def test_every_card_fits_with_a_huge_plan_and_every_other_section_full(lang: Lang) -> None:
    states = ("completed", "in_progress", "pending")
    plan = tuple(("中`*<" * 500, states[n % 3]) for n in range(300))
    steps = tuple(("run", "中`*<" * 500) for _ in range(2000))
    long_path = "/".join(ch * 200 for ch in "abcd") + "/中`文.py"
    huge = ApprovalView("run_1", "r", "T*" * 500, "edit", "中`" * 3000, "d", 0.0, reason="<" * 500)
    progress = progress_card(
        ProgressView(
            "t" * 500,
            "running",
            tuple("中" * 5000 for _ in range(50)),
            10**6,
            "run_1",
            (huge,) * 40,
            "project",
            "amux/" + "b" * 300,
            plan=plan,
            steps=steps,
        ),
        lang,
    )
    assert_valid_card(progress)
    assert encoded_size(progress) <= CARD_MAX_BYTES
    branch = BranchView(
        "amux/1a2b3c4d",
        "main",
        tuple(ChangedFileView(f"{long_path}{n}", 3, 1) for n in range(200)),
        200,
        diff_attached=True,
    )
    notes = tuple(
        MemoryNote(op, f"{long_path}{n}.md", "f" * 64, "e" * 64)
        for n in range(40)
        for op in ("read", "saved", "forgot")
    )
    answer = "中文 `code`\n" * 20_000
    cards = result_cards(
        answer,
        lang,
        title="t" * 500,
        memory=TurnMemory("p-alice", notes),
        approvals=TurnApprovals((huge,) * 40, ("规" * 3000,) * 40),
        branch=branch,
        finish=FinishView({"input_tokens": 10**9, "output_tokens": 10**9}, 10**6, "feishu:oc:om"),
        plan=plan,
        steps=steps,
    )
    for shown in cards:
        assert_valid_card(shown)
        assert encoded_size(shown) <= CARD_MAX_BYTES
    first = all_text(cards[0])
    assert {"en_us": "/300 done", "zh_cn": "/300）"}[lang] in first


STEPS = (
    ("read", "src/app.py"),
    ("edit", "src/app.py"),
    ("run", "pytest -x `rm` <at id=all></at>"),
    ("search", "**/*.py"),
    ("tool", "mcp__memory__amux_memory_get"),
)


@pytest.mark.parametrize("lang", LANGS)
def test_the_cards_list_the_tools_the_agent_used(lang: Lang) -> None:
    view = ProgressView("t", "running", ("working",), 1.0, "run_1", steps=STEPS)
    progress = all_text(progress_card(view, lang))
    (result,) = result_cards("Done.", lang, steps=STEPS)
    assert_valid_card(result)
    for shown in (progress, all_text(result)):
        words = {"en_us": ("read", "edit", "run"), "zh_cn": ("读取", "编辑", "运行")}[lang]
        assert f"- {words[0]} `src/app.py`" in shown
        assert f"- {words[1]} `src/app.py`" in shown
        # A command cannot break out of its code span nor mention anyone.
        assert f"- {words[2]} `pytest -x 'rm' &lt;at" in shown
        assert "`mcp__memory__amux_memory_get`" in shown
        assert {"en_us": "**Steps** (5)", "zh_cn": "**步骤**（5）"}[lang] in shown


@pytest.mark.parametrize("lang", LANGS)
def test_a_compaction_is_a_step_saying_the_context_was_compacted(lang: Lang) -> None:
    (result,) = result_cards("", lang, steps=(("compact", ""),))
    assert_valid_card(result)
    said = {"en_us": "compacted the conversation's context", "zh_cn": "已压缩对话的上下文"}[lang]
    shown = all_text(result)
    assert f"- {said}" in shown and "``" not in shown


def test_many_steps_keep_the_newest_and_count_the_earlier() -> None:
    steps = tuple(("read", f"file{n}.py") for n in range(300))
    shown = all_text(progress_card(ProgressView("t", "running", steps=steps), "en_us"))
    assert "`file299.py`" in shown and "`file0.py`" not in shown
    earlier = int(shown.split("… and ")[1].split(" earlier")[0])
    assert 0 < earlier < 300 and f"`file{earlier}.py`" in shown
    assert f"`file{earlier - 1}.py`" not in shown


def test_the_streamed_text_lists_the_steps() -> None:
    streamed = stream_text(["said"], (), "en_us", STEPS)
    assert streamed.startswith("**Steps** (5)") and "- run `pytest -x" in streamed
