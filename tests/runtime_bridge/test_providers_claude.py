"""The real ``claude`` CLI, launched through the adapter against the fake Anthropic API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime_bridge.memoryprotocol import merge_instructions, protocol_text
from runtime_bridge.providers import (
    LaunchRequest,
    MemoryAttachment,
    Result,
    build_plan,
    run,
)
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import (
    StubMcp,
    collect,
    offline_request,
    stub_search_call,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

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
