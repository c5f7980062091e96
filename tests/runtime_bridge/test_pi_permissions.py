"""Pi's permission policies with the real ``pi`` against the fake model.

Pi asks nobody by itself; under ``ask`` amux's extension stops each changing tool call and asks
the worker over the launch's approval socket, which an in-test approver answers. The model's
tool results (recorded by the fake) show what Pi was told.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime_bridge import approvals
from runtime_bridge.approvals import ApprovalAnswer, ApprovalRequest
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.launch_env import DEFAULT_PASS_ENV
from runtime_bridge.providers import (
    Event,
    LaunchPlan,
    LaunchRequest,
    MemoryAttachment,
    Result,
    build_plan,
    run,
)
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import StubCli, collect, offline_env, sandboxed_launch
from tests.runtime_bridge.test_providers_pi import PI_ARGS, pi_agent_source, request_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DENIAL = "Not now: the reviewer wants tests first."


class Recorder:
    """An approver that records each request and gives one answer to all."""

    def __init__(self, allow: bool, message: str = "") -> None:
        self.answer = ApprovalAnswer(allow, message)
        self.requests: list[ApprovalRequest] = []

    async def __call__(self, request: ApprovalRequest) -> ApprovalAnswer:
        self.requests.append(request)
        return self.answer


def outputs(model: FakeModelServer) -> list[str]:
    return [text for _, text in model.tool_results]


WRITE_A = CallTool("write", {"path": "a.txt", "content": "written by pi\n"})
LIST = CallTool("bash", {"command": "ls"})


async def launch(
    tmp_path: Path,
    pi_bin: str,
    permissions: str,
    script: list[Step],
    approver: Recorder,
    memory: MemoryAttachment | None = None,
) -> tuple[list[Event], FakeModelServer, LaunchPlan]:
    async with FakeModelServer(script) as model:
        request = request_for(
            tmp_path, model, pi_bin, memory, prompt="Do the work", permissions=permissions
        )
        plan = build_plan(request)
        events = await collect(run(plan, approver))
    return events, model, plan


async def test_auto_runs_writes_and_commands_without_asking(tmp_path: Path, pi_bin: str) -> None:
    script: list[Step] = [
        WRITE_A,
        CallTool("bash", {"command": "echo hi > b.txt && cat b.txt"}),
        Answer("Both written."),
    ]
    approver = Recorder(allow=False, message="must not be asked")
    events, model, plan = await launch(tmp_path, pi_bin, approvals.AUTO, script, approver)

    assert isinstance(events[-1], Result), events
    assert (plan.cwd / "a.txt").read_text() == "written by pi\n"
    assert (plan.cwd / "b.txt").read_text() == "hi\n"
    # The command's output reached the model.
    assert outputs(model)[1].strip() == "hi"
    assert approver.requests == []
    assert plan.approval_socket is None


async def test_ask_runs_an_allowed_write_after_one_request(tmp_path: Path, pi_bin: str) -> None:
    script: list[Step] = [WRITE_A, LIST, Answer("Written.")]
    approver = Recorder(allow=True)
    events, model, plan = await launch(tmp_path, pi_bin, approvals.ASK, script, approver)

    assert isinstance(events[-1], Result), events
    assert (plan.cwd / "a.txt").read_text() == "written by pi\n"
    # One request, for the write; ``ls`` only reads and was never asked.
    assert approver.requests == [
        ApprovalRequest("write", approvals.EDIT, "a.txt", "written by pi\n")
    ]
    assert outputs(model)[1].strip() == "a.txt"
    assert plan.approval_socket is not None and not plan.approval_socket.exists()


async def test_ask_denied_leaves_no_file_and_tells_the_model_why(
    tmp_path: Path, pi_bin: str
) -> None:
    script: list[Step] = [
        WRITE_A,
        CallTool("bash", {"command": "echo hi > b.txt"}),
        LIST,
        Answer("I was not allowed."),
    ]
    approver = Recorder(allow=False, message=DENIAL)
    events, model, plan = await launch(tmp_path, pi_bin, approvals.ASK, script, approver)

    assert isinstance(events[-1], Result), events
    assert not (plan.cwd / "a.txt").exists()
    assert not (plan.cwd / "b.txt").exists()
    assert approver.requests == [
        ApprovalRequest("write", approvals.EDIT, "a.txt", "written by pi\n"),
        ApprovalRequest("bash", approvals.COMMAND, "echo hi > b.txt"),
    ]
    written, echoed, listed = outputs(model)
    assert DENIAL in written and DENIAL in echoed
    # ``ls`` ran unasked, and found nothing the denied calls would have made.
    assert "a.txt" not in listed and "b.txt" not in listed


# Commands that look like reads and each make a file: the shell runs what they hide.
DISGUISED = [
    # The unquoted first here-document's body is expanded, its substitution run.
    "cat <<A <<'B'\n$(touch made-by-heredoc)\nA\nx\nB",
    # ``$_`` is the last word echoed; ``@P`` expands it as a prompt, running it.
    "echo '$(touch made-by-prompt)'; echo ${_@P}",
    # ``>&`` before a word that is no descriptor number writes a file of that name.
    "echo hi >&2made-by-redirect",
]


async def test_ask_asks_about_commands_that_hide_a_write_and_a_denial_runs_none(
    tmp_path: Path, pi_bin: str
) -> None:
    script: list[Step] = [*(CallTool("bash", {"command": c}) for c in DISGUISED), LIST]
    script.append(Answer("Refused."))
    approver = Recorder(allow=False, message=DENIAL)
    events, model, plan = await launch(tmp_path, pi_bin, approvals.ASK, script, approver)

    assert isinstance(events[-1], Result), events
    assert approver.requests == [
        ApprovalRequest("bash", approvals.COMMAND, command) for command in DISGUISED
    ]
    *refused, listed = outputs(model)
    assert all(DENIAL in text for text in refused), refused
    # ``ls`` ran unasked and found none of the files the refused commands would have made.
    assert "made-by" not in listed
    assert sorted(p.name for p in plan.cwd.iterdir()) == []


async def test_ask_lets_amux_memory_calls_run_without_asking(
    tmp_path: Path,
    pi_bin: str,
    stub_cli: StubCli,
    attachment_for: Callable[..., MemoryAttachment],
) -> None:
    script: list[Step] = [
        CallTool("bash", {"command": "amux memory search language"}),
        CallTool("bash", {"command": "amux agent run hello"}),
        Answer("Searched."),
    ]
    approver = Recorder(allow=False, message=DENIAL)
    memory = attachment_for(cli_dir=stub_cli.directory)
    events, model, _ = await launch(tmp_path, pi_bin, approvals.ASK, script, approver, memory)

    assert isinstance(events[-1], Result), events
    assert [call["argv"] for call in stub_cli.calls()] == [["memory", "search", "language"]]
    assert "STUB-CLI-HIT" in outputs(model)[0]
    # Only ``amux memory`` is memory: any other amux command is asked, and here refused.
    assert approver.requests == [ApprovalRequest("bash", approvals.COMMAND, "amux agent run hello")]
    assert DENIAL in outputs(model)[1]


async def answer_garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readline()
    writer.write(b'{"allow": "yes"}\n')
    await writer.drain()
    writer.close()


@pytest.mark.parametrize("served", [False, True], ids=["no-socket", "bad-answer"])
async def test_ask_blocks_every_changing_call_when_no_clear_answer_comes(
    tmp_path: Path, pi_bin: str, served: bool
) -> None:
    script: list[Step] = [WRITE_A, Answer("Blocked.")]
    async with FakeModelServer(script) as model:
        plan = build_plan(
            request_for(tmp_path, model, pi_bin, None, prompt="Write", permissions=approvals.ASK)
        )
        socket = plan.approval_socket
        assert socket is not None
        # The runner serves no socket: the extension finds none, or one answering nonsense.
        unserved = dataclasses.replace(plan, approval_socket=None)
        if served:
            socket.parent.mkdir(parents=True, exist_ok=True)
            server = await asyncio.start_unix_server(answer_garbage, path=str(socket))
            async with server:
                events = await collect(run(unserved))
        else:
            events = await collect(run(unserved))

    assert isinstance(events[-1], Result), events
    assert not (plan.cwd / "a.txt").exists()
    (written,) = outputs(model)
    expected = "gave no answer" if served else "could not be asked for permission"
    assert expected in written, written


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed")
async def test_inside_the_sandbox_the_extension_and_the_socket_are_reachable(
    tmp_path: Path, pi_bin: str
) -> None:
    script: list[Step] = [WRITE_A, LIST, CallTool("bash", {"command": "rm a.txt"}), Answer("ok")]
    approver = Recorder(allow=True)
    async with FakeModelServer(script) as model:
        plan, request = sandboxed_plan(tmp_path, model, pi_bin)
        assert plan.sandbox and plan.approval_socket is not None
        assert plan.run_as is not None or os.geteuid() != 0
        events = await collect(run(plan, approver))

    assert isinstance(events[-1], Result), (events, outputs(model))
    assert approver.requests == [
        ApprovalRequest("write", approvals.EDIT, "a.txt", "written by pi\n"),
        ApprovalRequest("bash", approvals.COMMAND, "rm a.txt"),
    ]
    written, listed, _removed = outputs(model)
    assert "Successfully wrote" in written, written
    assert listed.strip() == "a.txt"
    assert not (request.cwd / "a.txt").exists()
    # The extension was read from the run directory, where the plan wrote it.
    assert any(str(request.run_dir) in word for word in plan.argv)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed")
async def test_read_only_offers_no_edit_tool_and_its_commands_meet_a_read_only_workspace(
    tmp_path: Path, pi_bin: str
) -> None:
    script: list[Step] = [
        WRITE_A,
        CallTool("bash", {"command": "echo hi > b.txt"}),
        LIST,
        Answer("Nothing changed."),
    ]
    approver = Recorder(allow=False, message="must not be asked")
    async with FakeModelServer(script) as model:
        plan, request = sandboxed_plan(tmp_path, model, pi_bin, approvals.READ_ONLY)
        (request.cwd / "kept.txt").write_text("already here\n")
        events = await collect(run(plan, approver))

    assert isinstance(events[-1], Result), (events, outputs(model))
    offered = model.main_requests[0].tool_names
    assert "read" in offered and "bash" in offered
    assert "write" not in offered and "edit" not in offered
    written, echoed, listed = outputs(model)
    assert "Tool write not found" in written
    assert "Read-only file system" in echoed, echoed
    assert listed.strip() == "kept.txt"
    assert sorted(p.name for p in request.cwd.iterdir()) == ["kept.txt"]
    assert approver.requests == []


def sandboxed_plan(
    tmp_path: Path, model: FakeModelServer, pi_bin: str, permissions: str = approvals.ASK
) -> tuple[LaunchPlan, LaunchRequest]:
    """A launch as a worker builds it: the Agent's own uid on a root host, inside bwrap."""
    settings = RuntimeSettings(
        name="test",
        pi=pi_bin,
        pi_args=list(PI_ARGS),
        pi_agent_dir=pi_agent_source(tmp_path, model),
        pass_env=[*DEFAULT_PASS_ENV, "PI_OFFLINE"],
        work_dir=tmp_path / "runtime",
        sandbox="bwrap",
    )
    env = offline_env(tmp_path / "home", model.base_url)
    return sandboxed_launch(settings, "pi", env, permissions)


def test_the_shipped_extension_is_javascript_node_parses_and_reads_the_socket_variable(
    tmp_path: Path,
) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    extension = Path(__file__).parents[2] / "runtime_bridge" / "providers" / "pi_permissions.js"
    module = tmp_path / "check.mjs"
    module.write_text(extension.read_text())
    done = subprocess.run([node, "--check", str(module)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f'"{approvals.SOCKET_ENV}"' in extension.read_text()


async def test_ask_reaches_a_socket_whose_path_is_longer_than_a_socket_address(
    tmp_path: Path, pi_bin: str
) -> None:
    """A deep run directory puts the socket beyond the 107 bytes an address holds; the extension
    reaches it through its directory."""
    requests: list[dict[str, object]] = []

    async def allow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(json.loads(await reader.readline()))
        writer.write(b'{"allow": true, "message": ""}\n')
        await writer.drain()
        writer.close()

    script: list[Step] = [WRITE_A, Answer("Written.")]
    async with FakeModelServer(script) as model:
        request = request_for(tmp_path, model, pi_bin, None, prompt="Write", permissions="ask")
        deep = tmp_path / ("d" * 60) / ("e" * 60)
        plan = build_plan(dataclasses.replace(request, run_dir=deep))
        socket = plan.approval_socket
        assert socket is not None and len(str(socket)) > 108
        deep.mkdir(parents=True)
        directory = os.open(deep, os.O_PATH | os.O_DIRECTORY)
        try:
            # The test's own server binds the same way, for the same reason.
            address = f"/proc/self/fd/{directory}/{socket.name}"
            async with await asyncio.start_unix_server(allow, path=address):
                events = await collect(run(dataclasses.replace(plan, approval_socket=None)))
        finally:
            os.close(directory)

    assert isinstance(events[-1], Result), (events, outputs(model))
    assert requests == [{"tool": "write", "input": {"path": "a.txt", "content": "written by pi\n"}}]
    assert (plan.cwd / "a.txt").read_text() == "written by pi\n"
