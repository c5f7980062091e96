"""The Claude adapter: its plans per permission policy, how it reads a permission request, and the
real ``claude`` CLI launched through it against the fake Anthropic API."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import TextContent

from runtime_bridge.approvals import (
    ASK,
    AUTO,
    COMMAND,
    DETAIL_CHARS,
    EDIT,
    READ_ONLY,
    SOCKET_ENV,
    SOCKET_NAME,
    TOOL,
    ApprovalAnswer,
    ApprovalRequest,
    ApprovalSocket,
    ask_over_socket,
)
from runtime_bridge.memoryprotocol import merge_instructions, protocol_text
from runtime_bridge.permission_shim import NO_SOCKET
from runtime_bridge.providers import (
    LaunchPlan,
    LaunchRequest,
    MemoryAttachment,
    Result,
    build_plan,
    run,
)
from runtime_bridge.providers.claude import (
    MCP_CONFIG,
    PERMISSION_SHIM,
    describe,
    permission_server,
)
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import (
    CREDENTIAL,
    StubMcp,
    collect,
    offline_request,
    stub_search_call,
)

# The heading of Claude's own auto-memory instructions, which a bound launch must suppress.
AUTO_MEMORY_MARK = "persistent file-based memory"


def request_for(
    tmp_path: Path,
    model: FakeModelServer,
    executable: str,
    memory: MemoryAttachment | None,
    resume_id: str | None = None,
    prompt: str = "Which language do I prefer?",
) -> LaunchRequest:
    return offline_request(
        tmp_path,
        model.base_url,
        "claude",
        executable,
        memory,
        resume_id=resume_id,
        prompt=prompt,
        append_instructions="Answer briefly.",
    )


@pytest.mark.e2e
@pytest.mark.timeout(90)
async def test_bound_claude_calls_the_memory_mcp_server_and_gets_the_protocol(
    tmp_path: Path,
    claude_bin: str,
    stub_mcp: StubMcp,
    attachment_for: Callable[..., MemoryAttachment],
) -> None:
    script: list[Step] = [
        CallTool("mcp__memory__amux_memory_search", {"query": "language preference"}),
        Answer("You prefer English."),
    ]
    async with FakeModelServer(script) as model:
        plan = build_plan(request_for(tmp_path, model, claude_bin, attachment_for(stub_mcp.argv)))
        events = await collect(run(plan))

    result = events[-1]
    assert isinstance(result, Result), events
    assert result.text == "You prefer English."
    assert result.native_session_id
    assert result.usage.get("output_tokens")

    assert stub_mcp.calls() == [stub_search_call("language preference")]
    assert any("STUB-MEMORY-HIT" in text for _, text in model.tool_results)

    first = model.main_requests[0]
    merged = merge_instructions("Answer briefly.", protocol_text("mcp"))
    assert merged.strip() in first.system_text
    assert first.system_text.count(protocol_text("mcp").strip()) == 1
    assert {"mcp__memory__amux_memory_search", "mcp__memory__amux_memory_upsert"} <= set(
        first.tool_names
    )
    assert AUTO_MEMORY_MARK not in first.system_text


@pytest.mark.e2e
@pytest.mark.timeout(90)
async def test_resumed_claude_keeps_the_conversation_protocol_and_suppression(
    tmp_path: Path,
    claude_bin: str,
    stub_mcp: StubMcp,
    attachment_for: Callable[..., MemoryAttachment],
) -> None:
    async with FakeModelServer([Answer("First answer.")]) as model:
        first = await collect(
            run(build_plan(request_for(tmp_path, model, claude_bin, attachment_for(stub_mcp.argv))))
        )
        session = first[-1]
        assert isinstance(session, Result) and session.native_session_id
        model.add_steps([Answer("Second answer.")])
        second = await collect(
            run(
                build_plan(
                    request_for(
                        tmp_path,
                        model,
                        claude_bin,
                        attachment_for(stub_mcp.argv),
                        resume_id=session.native_session_id,
                        prompt="And what did I ask before?",
                    )
                )
            )
        )

    resumed = second[-1]
    assert isinstance(resumed, Result), second
    assert resumed.text == "Second answer."
    last = model.main_requests[-1]
    assert "Which language do I prefer?" in str(last.body["messages"])
    assert "First answer." in str(last.body["messages"])
    assert protocol_text("mcp").strip() in last.system_text
    assert AUTO_MEMORY_MARK not in last.system_text


@pytest.mark.e2e
@pytest.mark.timeout(90)
async def test_unbound_claude_has_no_protocol_no_mcp_and_native_memory(
    tmp_path: Path, claude_bin: str
) -> None:
    async with FakeModelServer([Answer("Plain answer.")]) as model:
        plan = build_plan(request_for(tmp_path, model, claude_bin, memory=None))
        events = await collect(run(plan))

    assert isinstance(events[-1], Result), events
    system = model.main_requests[0].system_text
    assert "Answer briefly." in system
    assert "amux memory" not in system and "amux.memory_search" not in system
    assert AUTO_MEMORY_MARK in system
    assert "CLAUDE_CODE_DISABLE_AUTO_MEMORY" not in plan.env
    assert not any(name.startswith("mcp__") for name in model.main_requests[0].tool_names)


# -- plans per permission policy -------------------------------------------------------------

AMUX = "/opt/amux/bin/amux"


def plan_for(
    tmp_path: Path,
    permissions: str,
    memory: MemoryAttachment | None = None,
    amux_argv: tuple[str, ...] = (AMUX,),
    extra_args: tuple[str, ...] = (),
) -> LaunchPlan:
    return build_plan(
        LaunchRequest(
            provider="claude",
            prompt="Do the work.",
            cwd=tmp_path / "work",
            run_dir=tmp_path / "run",
            memory=memory,
            base_env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")},
            permissions=permissions,
            amux_argv=amux_argv,
            extra_args=extra_args,
        )
    )


def flag(plan: LaunchPlan, name: str) -> str | None:
    """The value of the last ``name`` in the plan's argv (the one Claude keeps)."""
    argv = list(plan.argv)
    places = [i for i, word in enumerate(argv) if word == name]
    return argv[places[-1] + 1] if places else None


def mcp_config(plan: LaunchPlan) -> dict[str, Any]:
    (config,) = [f for f in plan.files if f.path.name == MCP_CONFIG.name]
    servers: dict[str, Any] = json.loads(config.content)["mcpServers"]
    return servers


def test_auto_bypasses_claudes_permission_checks_and_asks_nobody(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, AUTO)

    assert flag(plan, "--permission-mode") == "bypassPermissions"
    # Claude refuses that mode to root without it; amux's sandbox is the sandbox it asks for.
    assert plan.env["IS_SANDBOX"] == "1"
    assert plan.permissions == AUTO
    assert plan.approval_socket is None
    assert "--permission-prompt-tool" not in plan.argv
    assert plan.files == ()


def test_ask_serves_the_permission_prompt_from_amux_and_plans_the_socket(
    tmp_path: Path, attachment_for: Callable[..., MemoryAttachment]
) -> None:
    plan = plan_for(tmp_path, ASK, memory=attachment_for())

    socket = tmp_path / "run" / SOCKET_NAME
    assert plan.approval_socket == socket
    assert plan.permissions == ASK
    assert flag(plan, "--permission-prompt-tool") == "mcp__amux__permission_prompt"
    assert "--strict-mcp-config" in plan.argv
    assert "--permission-mode" not in plan.argv and "IS_SANDBOX" not in plan.env
    servers = mcp_config(plan)
    # amux's own interpreter, isolated and without site packages: it starts in milliseconds.
    assert servers["amux"] == {
        "type": "stdio",
        "command": sys.executable,
        "args": ["-I", "-S", str(PERMISSION_SHIM)],
        "env": {SOCKET_ENV: str(socket), "AMUX_OWNER_TOKEN_FALLBACK": "false"},
    }
    assert CREDENTIAL not in json.dumps(servers["amux"])
    allowed = (flag(plan, "--allowedTools") or "").split(",")
    assert "mcp__memory__*" in allowed and "Read" in allowed
    # Allowing the prompt tool by name is not needed, and would make it look like a model tool.
    assert "mcp__amux__*" not in allowed
    shown = plan.to_json()
    assert shown["approval_socket"] == str(socket)
    assert "mcp__amux__permission_prompt" in shown["argv"]


def test_ask_without_an_amux_command_denies_what_would_be_asked_rather_than_hang(
    tmp_path: Path,
) -> None:
    plan = plan_for(tmp_path, ASK, amux_argv=())

    assert flag(plan, "--permission-prompts") == "none"
    assert "--permission-prompt-tool" not in plan.argv
    assert plan.approval_socket is None
    assert plan.files == ()


def test_read_only_removes_the_edit_tools_and_lets_nobody_be_asked(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, READ_ONLY)

    assert flag(plan, "--disallowedTools") == "Write,Edit,MultiEdit,NotebookEdit"
    assert flag(plan, "--permission-prompts") == "none"
    assert plan.approval_socket is None
    assert "--permission-mode" not in plan.argv
    assert "--permission-prompt-tool" not in plan.argv


def test_the_policy_comes_after_the_operators_arguments(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, AUTO, extra_args=("--permission-mode", "acceptEdits"))

    assert flag(plan, "--permission-mode") == "bypassPermissions"


def test_a_policy_amux_does_not_know_is_asked_about(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "readonly")

    assert flag(plan, "--permission-prompt-tool") == "mcp__amux__permission_prompt"
    assert plan.approval_socket == tmp_path / "run" / SOCKET_NAME


# -- what a person is asked --------------------------------------------------------------------


def test_a_shell_command_is_asked_as_its_exact_command_line() -> None:
    request = describe("Bash", {"command": "rm -rf build && make", "description": "Rebuild"})

    assert request == ApprovalRequest("Bash", COMMAND, "rm -rf build && make")


def test_a_write_is_an_edit_of_its_path_showing_the_new_content() -> None:
    request = describe("Write", {"file_path": "/w/a.txt", "content": "new\n"})

    assert request == ApprovalRequest("Write", EDIT, "/w/a.txt", "new\n")


def test_an_edit_is_shown_as_a_unified_diff_of_what_it_replaces() -> None:
    request = describe(
        "Edit", {"file_path": "/w/a.py", "old_string": "x = 1\ny = 2", "new_string": "x = 1\ny = 3"}
    )

    assert request is not None
    assert (request.tool, request.action, request.subject) == ("Edit", EDIT, "/w/a.py")
    assert request.detail.splitlines() == [
        "--- /w/a.py",
        "+++ /w/a.py",
        "@@ -1,2 +1,2 @@",
        " x = 1",
        "-y = 2",
        "+y = 3",
    ]


def test_a_multi_edit_shows_each_of_its_edits() -> None:
    edits = [
        {"old_string": "alpha", "new_string": "beta"},
        {"old_string": "gamma", "new_string": "delta"},
    ]
    request = describe("MultiEdit", {"file_path": "/w/b.txt", "edits": edits})

    assert request is not None and request.action == EDIT and request.subject == "/w/b.txt"
    assert "-alpha\n+beta\n" in request.detail and "-gamma\n+delta\n" in request.detail


def test_a_large_edit_is_diffed_whole_and_one_past_the_bound_is_denied_unasked() -> None:
    # The harmful line lies in the second edit, past the 7,000 characters once compared.
    edits = [
        {"old_string": "a = 1\n", "new_string": "b = 2\n" * 1200},
        {"old_string": "c = 3", "new_string": "os.system('rm -rf ~')"},
    ]
    request = describe("MultiEdit", {"file_path": "/w/b.py", "edits": edits})
    assert request is not None and request.refusal() is None
    assert "-c = 3\n+os.system('rm -rf ~')\n" in request.detail
    # Old and new text past what a person is shown whole: not diffed, and nobody asked.
    huge = {"file_path": "/w/b.py", "old_string": "x" * 40_000, "new_string": "y" * 40_000}
    refused = describe("Edit", huge)
    assert refused is not None
    answer = refused.refusal()
    assert answer is not None and not answer.allowed and "smaller edits" in answer.message


def test_a_notebook_edit_names_the_notebook_and_shows_the_new_cell() -> None:
    request = describe(
        "NotebookEdit",
        {"notebook_path": "/w/n.ipynb", "cell_id": "c1", "new_source": "print(1)"},
    )

    assert request == ApprovalRequest("NotebookEdit", EDIT, "/w/n.ipynb", "cell_id=c1\nprint(1)")


def test_another_tool_is_asked_with_its_input() -> None:
    request = describe("WebFetch", {"url": "https://example.com/x", "prompt": "Summarise"})

    assert request is not None
    assert (request.tool, request.action, request.subject) == (
        "WebFetch",
        TOOL,
        "https://example.com/x",
    )
    assert json.loads(request.detail) == {"url": "https://example.com/x", "prompt": "Summarise"}


@pytest.mark.parametrize(
    "tool", ["Read", "Glob", "Grep", "LS", "NotebookRead", "mcp__memory__amux_memory_search"]
)
def test_reads_searches_and_memory_need_nobody(tool: str) -> None:
    assert describe(tool, {"file_path": "/etc/hostname", "query": "x"}) is None


async def test_the_socket_masks_secrets_and_bounds_what_the_person_sees(
    tmp_path: Path, attachment_for: Callable[..., MemoryAttachment]
) -> None:
    plan = plan_for(tmp_path, ASK, memory=attachment_for())
    asked: list[ApprovalRequest] = []

    async def person(request: ApprovalRequest) -> ApprovalAnswer:
        asked.append(request)
        return ApprovalAnswer(False, "no")

    (tmp_path / "run").mkdir()
    socket = tmp_path / "run" / SOCKET_NAME
    async with ApprovalSocket(socket, person, describe, plan.mask):
        answer = await ask_over_socket(
            str(socket), "Bash", {"command": f"curl -H 'Authorization: {CREDENTIAL}' hub"}
        )
        # The whole new content is shown, masked to its end.
        content = "x" * 60_000 + CREDENTIAL + "\nrm -rf ~\n"
        await ask_over_socket(str(socket), "Write", {"file_path": "/w/big", "content": content})
        # More than a person is shown whole: nobody is asked.
        huge = {"file_path": "/w/big", "content": "y" * (DETAIL_CHARS + 1)}
        too_big = await ask_over_socket(str(socket), "Write", huge)
        free = await ask_over_socket(str(socket), "Read", {"file_path": "/w/a"})

    assert answer == ApprovalAnswer(False, "no")
    assert free == ApprovalAnswer(True)
    command, write = asked
    assert CREDENTIAL not in command.subject and "********" in command.subject
    assert CREDENTIAL not in write.detail
    assert write.detail == "x" * 60_000 + "********\nrm -rf ~\n"
    assert not too_big.allowed and "65,537 characters" in too_big.message
    assert "make the change in smaller edits" in too_big.message


# -- the permission prompt's answers, in Claude's contract -------------------------------------


async def prompt(server_socket: str | None, tool_input: dict[str, Any]) -> dict[str, Any]:
    """One call of the permission tool as Claude makes it, to the server started as the launch's
    MCP config says (``server_socket`` None: started without one); the decision it answers."""
    entry = permission_server(Path(server_socket or "/nowhere"))
    env = dict(entry["env"])
    if server_socket is None:
        del env[SOCKET_ENV]
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env)
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        (tool,) = (await session.list_tools()).tools
        assert tool.name == "permission_prompt"
        result = await session.call_tool(
            "permission_prompt",
            {"tool_name": "Write", "input": tool_input, "tool_use_id": "toolu_1"},
        )
    (content,) = result.content
    assert isinstance(content, TextContent) and not result.is_error
    decision: dict[str, Any] = json.loads(content.text)
    return decision


async def test_the_prompt_answers_allow_with_the_input_unchanged_or_deny_with_the_reason(
    tmp_path: Path,
) -> None:
    socket = tmp_path / SOCKET_NAME
    answers = iter([ApprovalAnswer(True), ApprovalAnswer(False, "not that file")])

    async def person(request: ApprovalRequest) -> ApprovalAnswer:
        return next(answers)

    tool_input = {"file_path": "/w/a.txt", "content": "hi\n"}
    async with ApprovalSocket(socket, person, describe):
        allowed = await prompt(str(socket), tool_input)
        denied = await prompt(str(socket), tool_input)

    assert allowed == {"behavior": "allow", "updatedInput": tool_input}
    assert denied == {"behavior": "deny", "message": "not that file"}


async def test_the_prompt_denies_when_nobody_can_be_asked(tmp_path: Path) -> None:
    tool_input = {"file_path": "/w/a.txt", "content": "hi\n"}

    assert await prompt(None, tool_input) == {"behavior": "deny", "message": NO_SOCKET}
    gone = await prompt(str(tmp_path / "absent.sock"), tool_input)
    assert gone["behavior"] == "deny" and "could not be asked" in gone["message"]
