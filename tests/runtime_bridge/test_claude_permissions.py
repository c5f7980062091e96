"""The real ``claude`` CLI under each permission policy, against the fake Anthropic API.

Under ``ask`` Claude's permission prompt is the real ``runtime_bridge/permission_shim.py`` server,
asking the worker's real approval socket; the person is an approver in the test that records what
it was asked and answers as told. One launch runs inside amux's real sandbox, as another uid, so
the socket is reached from inside bwrap through the read-only run directory.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runtime_bridge.approvals import (
    ASK,
    AUTO,
    COMMAND,
    EDIT,
    READ_ONLY,
    ApprovalAnswer,
    ApprovalRequest,
)
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.providers import LaunchPlan, LaunchRequest, Result, build_plan, run
from runtime_bridge.worker import default_amux_executable
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import collect, offline_env, offline_request, sandboxed_launch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

REFUSAL = "The person declined: keep a.txt as it is."


@dataclass
class Person:
    """Answers every permission request the same way, and remembers each one."""

    answer: ApprovalAnswer
    asked: list[ApprovalRequest] = field(default_factory=list)

    async def __call__(self, request: ApprovalRequest) -> ApprovalAnswer:
        self.asked.append(request)
        return self.answer


def request_for(
    tmp_path: Path, model: FakeModelServer, claude_bin: str, permissions: str
) -> LaunchRequest:
    return offline_request(
        tmp_path,
        model.base_url,
        "claude",
        claude_bin,
        None,
        prompt="Do the work.",
        permissions=permissions,
        amux_argv=(default_amux_executable(),),
    )


async def launch(plan: LaunchPlan, person: Person) -> Result:
    events = await collect(run(plan, person))
    result = events[-1]
    assert isinstance(result, Result), events
    return result


def results(model: FakeModelServer) -> list[str]:
    return [text for _, text in model.tool_results]


async def test_auto_writes_files_and_runs_a_changing_command_without_asking(
    tmp_path: Path, claude_bin: str
) -> None:
    work = tmp_path / "work"
    script: list[Step] = [
        CallTool("Write", {"file_path": str(work / "a.txt"), "content": "written\n"}),
        CallTool("Bash", {"command": "echo hi > b.txt && cat b.txt", "description": "Write b"}),
        Answer("Both done."),
    ]
    person = Person(ApprovalAnswer(False, "nobody should be asked"))
    async with FakeModelServer(script) as model:
        plan = build_plan(request_for(tmp_path, model, claude_bin, AUTO))
        result = await launch(plan, person)

    assert result.text == "Both done."
    assert (work / "a.txt").read_text() == "written\n"
    assert (work / "b.txt").read_text() == "hi\n"
    assert results(model)[1].strip() == "hi"
    assert person.asked == []
    assert plan.approval_socket is None


async def test_ask_puts_one_write_to_the_person_and_an_allowed_write_lands(
    tmp_path: Path, claude_bin: str
) -> None:
    target = tmp_path / "work" / "a.txt"
    script: list[Step] = [
        CallTool("Write", {"file_path": str(target), "content": "approved\n"}),
        Answer("Written."),
    ]
    person = Person(ApprovalAnswer(True))
    async with FakeModelServer(script) as model:
        plan = build_plan(request_for(tmp_path, model, claude_bin, ASK))
        result = await launch(plan, person)

    assert result.text == "Written."
    assert person.asked == [ApprovalRequest("Write", EDIT, str(target), "approved\n")]
    assert target.read_text() == "approved\n"
    # The permission prompt is Claude's own: the model is never offered it as a tool.
    assert not any("permission" in name for name in model.main_requests[0].tool_names)


async def test_ask_denied_write_leaves_no_file_and_the_model_reads_the_reason(
    tmp_path: Path, claude_bin: str
) -> None:
    target = tmp_path / "work" / "a.txt"
    script: list[Step] = [
        CallTool("Write", {"file_path": str(target), "content": "refused\n"}),
        Answer("Understood."),
    ]
    person = Person(ApprovalAnswer(False, REFUSAL))
    async with FakeModelServer(script) as model:
        result = await launch(build_plan(request_for(tmp_path, model, claude_bin, ASK)), person)

    assert result.text == "Understood."
    assert [r.tool for r in person.asked] == ["Write"]
    assert not target.exists()
    assert any(REFUSAL in text for text in results(model)), model.tool_results


async def test_ask_lets_reads_run_and_asks_about_a_changing_command(
    tmp_path: Path, claude_bin: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("NOTE-CONTENT\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("OUTSIDE-CONTENT\n")
    script: list[Step] = [
        CallTool("Bash", {"command": "ls", "description": "List"}),
        CallTool("Bash", {"command": "cat notes.txt", "description": "Read notes"}),
        CallTool("Read", {"file_path": str(outside)}),
        CallTool("Bash", {"command": "touch made.txt", "description": "Make a file"}),
        Answer("Looked and made."),
    ]
    person = Person(ApprovalAnswer(True))
    async with FakeModelServer(script) as model:
        await launch(build_plan(request_for(tmp_path, model, claude_bin, ASK)), person)

    assert person.asked == [ApprovalRequest("Bash", COMMAND, "touch made.txt")]
    outputs = results(model)
    assert "notes.txt" in outputs[0]
    assert "NOTE-CONTENT" in outputs[1]
    # A read outside the working directory, which Claude alone would ask about, runs freely.
    assert "OUTSIDE-CONTENT" in outputs[2]
    assert (work / "made.txt").exists()


async def test_read_only_refuses_edits_and_changing_commands_without_asking(
    tmp_path: Path, claude_bin: str
) -> None:
    work = tmp_path / "work"
    script: list[Step] = [
        CallTool("Write", {"file_path": str(work / "a.txt"), "content": "no\n"}),
        CallTool("Bash", {"command": "touch made.txt", "description": "Make a file"}),
        CallTool("Bash", {"command": "ls", "description": "List"}),
        Answer("Could only look."),
    ]
    person = Person(ApprovalAnswer(True))
    async with FakeModelServer(script) as model:
        plan = build_plan(request_for(tmp_path, model, claude_bin, READ_ONLY))
        result = await launch(plan, person)

    assert result.text == "Could only look."
    assert not (work / "a.txt").exists()
    assert not (work / "made.txt").exists()
    write, touch, listing = results(model)
    assert "No such tool available: Write" in write
    assert "denied" in touch
    assert "denied" not in listing
    assert person.asked == []
    assert "Write" not in model.main_requests[0].tool_names


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed")
@pytest.mark.skipif(
    os.geteuid() != 0, reason="runs the Agent as a uid of its own, which needs root"
)
async def test_a_sandboxed_agent_of_another_uid_asks_through_the_socket_in_its_run_dir(
    tmp_path: Path, claude_bin: str
) -> None:
    settings = RuntimeSettings(name="perm", claude=claude_bin, work_dir=tmp_path / "runtime")
    answers = iter([ApprovalAnswer(True), ApprovalAnswer(False, REFUSAL)])
    asked: list[ApprovalRequest] = []

    async def person(request: ApprovalRequest) -> ApprovalAnswer:
        asked.append(request)
        return next(answers)

    async with FakeModelServer() as model:
        env = offline_env(tmp_path / "home", model.base_url)
        amux = (default_amux_executable(),)
        plan, request = sandboxed_launch(settings, "claude", env, ASK, amux)
        assert plan.approval_socket == request.run_dir / "approvals.sock"
        run_as = plan.run_as
        assert run_as is not None
        allowed = request.cwd / "allowed.txt"
        refused = request.cwd / "refused.txt"
        model.add_steps(
            [
                CallTool("Write", {"file_path": str(allowed), "content": "yes\n"}),
                CallTool("Write", {"file_path": str(refused), "content": "no\n"}),
                Answer("One of two."),
            ]
        )
        events = await collect(run(plan, person))

    assert isinstance(events[-1], Result), events
    assert [(r.tool, r.subject) for r in asked] == [
        ("Write", str(allowed)),
        ("Write", str(refused)),
    ]
    assert allowed.read_text() == "yes\n"
    assert allowed.stat().st_uid == run_as[0]
    assert not refused.exists()
    assert any(REFUSAL in text for text in results(model)), model.tool_results
