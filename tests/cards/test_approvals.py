import json
from dataclasses import replace

import pytest

from cards import actions
from cards.approvals import (
    LISTED_REQUESTS,
    approval_card,
    approvals_section,
    outcome,
    progress_elements,
    request_file_text,
    request_line,
    shows_whole,
    subject_file_name,
)
from cards.catalogue import text
from cards.elements import CARD_MAX_BYTES, card, encoded_size
from cards.models import LANGS, ApprovalView, Lang, ProgressView, TurnApprovals
from cards.progress import RESULT_CHUNK_BYTES, progress_card, result_cards
from tests.cards.structure import all_text, assert_valid_card, callbacks

AT = 1_700_000_000.0  # 22:13 UTC, 06:13 the next day in Beijing (the default zone)
PENDING = ApprovalView(
    run_id="run_1",
    request_id="req_1",
    tool="Write",
    action="edit",
    subject="/w/notes.md",
    detail="+hello",
    expires_at=AT + 600,
    asked_of="Bob",
)


def settled(decision: str, via: str, by: str | None = "Bob", **kw: object) -> ApprovalView:
    values: dict[str, object] = {
        "decision": decision,
        "via": via,
        "decided_by": by,
        "decided_at": AT,
    }
    values.update(kw)
    return ApprovalView(**{**PENDING.__dict__, **values})  # type: ignore[arg-type]


@pytest.mark.parametrize("lang", LANGS)
def test_a_pending_request_shows_what_is_wanted_and_three_answers(lang: Lang) -> None:
    shown = approval_card(PENDING, lang, title="write the notes")
    assert_valid_card(shown)
    assert shown["header"]["title"]["content"] == text(lang, "approval.title.pending")
    body = all_text(shown)
    assert "/w/notes.md" in body and "+hello" in body and "Write" in body
    assert "06:23 UTC+8" in body, "when it expires, in the chat's zone"
    assert "Bob" in body
    assert callbacks(shown) == [
        {"action": actions.RUN_APPROVE, "run_id": "run_1", "request_id": "req_1", "decision": d}
        for d in ("allow_once", "allow_session", "deny")
    ]
    labels = [b["text"]["content"] for b in _buttons(shown)]
    assert labels == [
        text(lang, "approval.allow_once"),
        text(lang, "approval.allow_session"),
        text(lang, "approval.deny"),
    ]


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize(
    ("view", "key", "title"),
    [
        (settled("allow_once", "person"), "approval.allowed_once", "approval.title.allowed"),
        (settled("allow_session", "person"), "approval.allowed_session", "approval.title.allowed"),
        (settled("deny", "person"), "approval.denied_person", "approval.title.denied"),
        (settled("deny", "timeout", None), "approval.denied_timeout", "approval.title.denied"),
        (settled("deny", "lapsed", None), "approval.lapsed", "approval.title.denied"),
        (settled("allow_session", "rule", None), "approval.allowed_rule", "approval.title.allowed"),
    ],
)
def test_a_settled_request_says_who_decided_and_when_without_buttons(
    lang: Lang, view: ApprovalView, key: str, title: str
) -> None:
    shown = approval_card(view, lang)
    assert_valid_card(shown)
    assert callbacks(shown) == []
    assert shown["header"]["title"]["content"] == text(lang, title)
    assert text(lang, key, name="Bob", when="06:13 UTC+8") in all_text(shown)


def test_a_long_path_keeps_its_file_and_a_long_command_its_program() -> None:
    path = settled("allow_once", "person", subject="/deep" * 50 + "/notes.md")
    assert request_line(path).endswith("/deep/notes.md`")
    assert request_line(path).startswith("Write `…")
    command = settled("allow_once", "person", action="command", subject="npm " + "x" * 300)
    assert request_line(command).startswith("Write `npm xxx")
    assert request_line(command).endswith(" …`")
    several = settled("allow_once", "person", action="command", subject="ls\nrm -rf /")
    assert request_line(several) == "Write `ls …`"


def test_a_denial_gives_its_reason() -> None:
    denied = settled("deny", "person", reason="not on main")
    assert outcome(denied, "en_us") == "Denied by Bob · 06:13 UTC+8 · Reason: not on main"


def test_names_are_escaped_on_cards_and_plain_in_toasts() -> None:
    view = settled("allow_once", "person", by="a_*b*")
    assert "a&#95;&#42;b&#42;" in outcome(view, "en_us")
    assert outcome(view, "en_us", markup=False) == "Allowed once by a_*b* · 06:13 UTC+8"


@pytest.mark.parametrize("lang", LANGS)
def test_what_an_agent_sends_can_neither_mention_anyone_nor_leave_its_code_block(
    lang: Lang,
) -> None:
    view = ApprovalView(
        "run_1",
        "req_1",
        "Bash <at id=all></at>",
        "command",
        "echo <at id=all></at>\n```\n**bold** ````",
        "```\n<AT id=ou_x></AT>" + "x" * 12_000,
        AT,
    )
    shown = approval_card(view, lang)
    assert_valid_card(shown)
    assert "<at" not in json.dumps(shown).lower()
    blocks = [el["content"] for el in shown["body"]["elements"] if el.get("tag") == "markdown"]
    for block in blocks[:2]:
        fences = [line for line in block.split("\n") if line.lstrip().startswith("```")]
        assert fences == ["```", "```"], block
    # Too long for a card, and no file with the whole of it: its start, said so, Deny alone.
    unseen = text(lang, "approval.subject_unseen", count=len(view.detail))
    assert unseen in all_text(shown)
    assert [v["decision"] for v in callbacks(shown)] == ["deny"]
    assert len(all_text(shown)) < 11_000


# A new file of 5,000 characters whose harmful line is near its end.
HARM = "\nos.system('rm -rf ~')\n"
NEW_FILE = "".join(f"line_{n} = {n}\n" for n in range(400))[: 5000 - len(HARM)] + HARM


@pytest.mark.parametrize("lang", LANGS)
def test_an_edit_is_shown_whole_on_its_card_and_a_larger_one_is_posted_as_a_file(
    lang: Lang,
) -> None:
    view = ApprovalView("run_1", "req_1", "Write", "edit", "/w/setup.py", NEW_FILE, AT)
    shown = approval_card(view, lang)
    assert_valid_card(shown)
    assert len(NEW_FILE) == 5000 and NEW_FILE in all_text(shown), "the edit is not shown whole"
    assert shows_whole(view)
    answers = [v["decision"] for v in callbacks(shown)]
    assert answers == ["allow_once", "allow_session", "deny"]
    # Four times as long: its start on the card, the whole request in the file posted beside it.
    larger = replace(view, detail=NEW_FILE * 4, subject_file=True)
    shown = approval_card(larger, lang)
    assert_valid_card(shown)
    assert not shows_whole(larger) and "rm -rf" in all_text(shown)
    name = subject_file_name(larger)
    assert text(lang, "approval.subject_in_file", count=len(NEW_FILE) * 4, name=f"`{name}`") in (
        all_text(shown)
    )
    assert len(callbacks(shown)) == 3
    whole = request_file_text(larger, lang)
    assert whole.startswith("/w/setup.py\n\n") and whole.endswith(NEW_FILE * 4 + "\n")


@pytest.mark.parametrize("lang", LANGS)
def test_a_running_turns_card_shows_pending_requests_in_full_and_settled_ones_briefly(
    lang: Lang,
) -> None:
    answered = settled("allow_once", "person", request_id="req_0", subject="/w/a.md")
    view = ProgressView("write", "running", ("working",), 3.0, "run_1", (answered, PENDING))
    shown = progress_card(view, lang)
    assert_valid_card(shown)
    decisions = [v.get("decision") for v in callbacks(shown)]
    assert decisions == ["allow_once", "allow_session", "deny", None]  # then Stop
    body = all_text(shown)
    assert "/w/a.md" in body
    assert text(lang, "approval.allowed_once", name="Bob", when="06:13 UTC+8") in body
    assert "+hello" in body


def test_a_finished_turns_card_has_no_answer_buttons() -> None:
    view = ProgressView("write", "cancelled", (), 3.0, approvals=(PENDING,))
    shown = progress_card(view, "en_us")
    assert callbacks(shown) == []
    assert "Not answered" in all_text(shown)


@pytest.mark.parametrize("lang", LANGS)
def test_the_answer_lists_what_was_allowed_and_denied_and_the_conversation_rules(
    lang: Lang,
) -> None:
    turn = TurnApprovals(
        (settled("allow_once", "person"), settled("deny", "timeout", None, subject="rm -rf /")),
        ("Bash: npm test …", "Write: /w/notes.md"),
    )
    (first,) = result_cards("Done.", lang, title="t", approvals=turn)
    assert_valid_card(first)
    body = all_text(first)
    assert text(lang, "result.approvals") in body
    assert (
        "✅ Write `/w/notes.md`: "
        + text(lang, "approval.allowed_once", name="Bob", when="06:13 UTC+8")
        in body
    )
    assert "⛔ Write `rm -rf /`" in body
    rules = "`Bash: npm test …`; `Write: /w/notes.md`"
    assert text(lang, "result.approvals.rules", rules=rules) in body


def test_a_turn_that_asked_nothing_adds_nothing() -> None:
    assert approvals_section(TurnApprovals(), "en_us") == []
    plain = result_cards("Done.", "en_us")
    assert result_cards("Done.", "en_us", approvals=TurnApprovals()) == plain


@pytest.mark.parametrize("lang", LANGS)
def test_the_list_stays_bounded_beside_a_full_result_chunk(lang: Lang) -> None:
    huge = settled(
        "deny",
        "person",
        by="名" * 500,
        tool="T*" * 500,
        subject="中`" * 3000,
        reason="<" * 500,
    )
    turn = TurnApprovals((huge,) * 40, ("规" * 3000,) * 40)
    body = all_text(card("x", "green", approvals_section(turn, lang)))
    # The newest requests that fit are listed; the rest are counted.
    hidden = [
        n for n in range(40 - LISTED_REQUESTS, 40) if text(lang, "approval.more", count=n) in body
    ]
    assert len(hidden) == 1
    (first,) = result_cards("中" * (RESULT_CHUNK_BYTES // 3 - 10), lang, approvals=turn)
    assert encoded_size(first) <= CARD_MAX_BYTES


def test_many_pending_requests_keep_the_progress_card_under_the_limit() -> None:
    big = ApprovalView("run_1", "r", "Write", "edit", "p" * 5000, "d" * 9000, AT)
    shown = progress_card(
        ProgressView("t", "running", ("x" * 300,) * 12, 1.0, "run_1", (big,) * 9), "en_us"
    )
    assert_valid_card(shown)
    assert len(progress_elements((big,) * 9, "en_us")) <= 3 * 5


@pytest.mark.parametrize("lang", LANGS)
def test_the_whole_command_is_on_the_card_and_the_progress_card_stays_under_the_limit(
    lang: Lang,
) -> None:
    # Near the most a card shows whole, in characters of three bytes each, with a full detail.
    command = "echo " + "中" * 2300 + "; rm -rf ~"
    wide = ApprovalView("run_1", "r", "Bash", "command", command, "細" * 1500, AT)
    # Progress lines of four-byte characters give way to the requests, which must be seen.
    lines = ("😀" * 300,) * 12
    settled_ones = tuple(
        settled("deny", "person", request_id=f"s{n}", subject="字" * 300) for n in range(5)
    )
    views = (*settled_ones, wide, wide, wide)
    shown = progress_card(ProgressView("t", "running", lines, 1.0, "run_1", views), lang)
    assert_valid_card(shown)
    assert command in all_text(shown), "the command is not shown whole"
    assert text(lang, "approval.more_pending", count=2) in all_text(shown)
    alone = approval_card(wide, lang)
    assert_valid_card(alone)
    assert command in all_text(alone)


def _buttons(shown: dict[str, object]) -> list[dict[str, object]]:
    from tests.cards.structure import walk

    return [el for el in walk(shown) if el["tag"] == "button"]
