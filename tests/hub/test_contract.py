"""The execution contract survives the wire unchanged, and a malformed answer is named."""

from __future__ import annotations

import json

import pytest

from hub.contract import (
    BranchWork,
    ChangedFile,
    Claim,
    Execution,
    ExecutionEvent,
    ProjectSource,
    Session,
    TurnResult,
    WatchResult,
    visible,
)
from hub.errors import InvalidArgument

SESSION = Session(
    id="s1",
    principal_id="p1",
    provider="claude",
    cwd=None,
    origin="feishu:chat:thread",
    native_id="n1",
    memory="bound",
    binding="principal:p1",
)
EXECUTION = Execution(
    id="e1",
    session_id="s1",
    state="succeeded",
    attempts=1,
    result=TurnResult(
        text="Saved.",
        provider="claude",
        binding="principal:p1",
        warnings=("memory capability missing",),
        usage={"input_tokens": 12},
    ),
    error=None,
    submitted_by="p1",
)


def test_every_record_comes_back_from_its_wire_form_unchanged() -> None:
    watch = WatchResult(EXECUTION, (ExecutionEvent(3, "progress", "thinking", 1.5),))
    claim = Claim("e1", "hello", 2, SESSION, 30.0, request_id="r1")
    assert Session.from_wire(SESSION.to_wire()) == SESSION
    assert Execution.from_wire(EXECUTION.to_wire()) == EXECUTION
    assert WatchResult.from_wire(watch.to_wire()) == watch
    assert Claim.from_wire(claim.to_wire()) == claim


def test_a_project_claim_carries_its_source_and_the_session_its_project_by_name() -> None:
    source = ProjectSource(
        "web", "remote", "https://git.example/web.git", "main", "WEB_TOKEN", worktree_days=3
    )
    session = Session(**{**SESSION.__dict__, "project": "web"})
    claim = Claim("e1", "hello", 1, session, 30.0, project=source)
    wire = claim.to_wire()
    assert wire["project"]["credential_env"] == "WEB_TOKEN"
    assert wire["session"]["project"] == "web"
    assert Claim.from_wire(wire) == claim
    # A turn without a project says nothing about one, and an older Hub's claim reads as none.
    plain = Claim("e1", "hello", 1, SESSION, 30.0).to_wire()
    assert "project" not in plain and Claim.from_wire(plain).project is None
    with pytest.raises(InvalidArgument, match="kind"):
        ProjectSource.from_wire({**source.to_wire(), "kind": "svn"})


def test_a_project_turns_result_carries_its_branch_and_a_plain_one_says_nothing_of_it() -> None:
    work = BranchWork(
        project="web",
        branch="amux/0123456789ab",
        base="main",
        commit="c" * 40,
        files=(ChangedFile("app.py", 3, 1), ChangedFile("logo.png", None, None)),
        files_total=2,
        diff="--- a/app.py\n+++ b/app.py\n",
        diff_truncated=False,
    )
    result = TurnResult(text="Done.", provider="claude", branch=work)
    wire = result.to_wire()
    assert wire["branch"]["files"][1] == {"path": "logo.png", "added": None, "removed": None}
    assert TurnResult.from_wire(wire) == result
    plain = TurnResult(text="Done.").to_wire()
    assert "branch" not in plain and TurnResult.from_wire(plain).branch is None


def test_a_watch_answer_keeps_the_rpcs_flat_shape_and_knows_its_last_event() -> None:
    events = (ExecutionEvent(4, "warning", "w", 2.0), ExecutionEvent(5, "status", "s", 3.0))
    wire = WatchResult(EXECUTION, events).to_wire()
    assert wire["state"] == "succeeded" and wire["result"]["text"] == "Saved."
    assert [e["seq"] for e in wire["events"]] == [4, 5]
    assert WatchResult.from_wire(wire).last_seq == 5
    assert WatchResult(EXECUTION, ()).last_seq == 0


def test_an_answer_missing_a_field_is_refused_with_its_name() -> None:
    wire = EXECUTION.to_wire()
    del wire["state"]
    with pytest.raises(InvalidArgument, match="state"):
        Execution.from_wire(wire)
    with pytest.raises(InvalidArgument, match="execution"):
        Claim.from_wire({"session": SESSION.to_wire(), "lease_seconds": 30})


def test_a_memory_event_parses_to_the_memory_use_it_records_and_other_kinds_to_none() -> None:
    from hub.contract import MEMORY, ExecutionEvent, MemoryUse

    use = MemoryUse("saved", "topics/a.md", "b" * 64, None)
    event = ExecutionEvent(3, MEMORY, json.dumps(use.to_wire()), 1.0)
    assert event.memory_use() == use
    assert ExecutionEvent(4, "progress", json.dumps(use.to_wire()), 1.0).memory_use() is None
    assert ExecutionEvent(5, MEMORY, "not json", 1.0).memory_use() is None
    assert ExecutionEvent(6, MEMORY, '{"op": "ate", "path": "a.md"}', 1.0).memory_use() is None
    read = MemoryUse("read", "a.md", "c" * 64)
    assert "previous_revision" not in read.to_wire()


def test_what_could_hide_or_reorder_a_command_is_shown_as_an_escape() -> None:
    # ESC and CR redraw a line, BS erases, CSI (C1) starts a sequence, DEL; bidi overrides and
    # isolates reorder; zero-width characters and the BOM hide; line separators break lines.
    disguised = (
        "rm -rf ~\x1b[2K\rls\x08\x9b2J\x7f \u202eevil\u202c \u2066x\u2069 \u200b\ufeff\u2028"
    )
    assert visible(disguised) == (
        "rm -rf ~\\x1b[2K\\x0dls\\x08\\x9b2J\\x7f \\u202eevil\\u202c \\u2066x\\u2069 "
        "\\u200b\\ufeff\\u2028"
    )
    assert visible("tag\U000e0041") == "tag\\U000e0041"
    # What shows itself is left alone: line breaks, tabs, any script, a backslash typed.
    plain = 'for f in *; do\n\techo "中文 é $f\\n"\ndone'
    assert visible(plain) == plain
