"""The real ``codex app-server``, driven through the adapter against the fake Responses API."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime_bridge.codex_rpc import CodexRpc
from runtime_bridge.memoryprotocol import merge_instructions, protocol_text
from runtime_bridge.providers import (
    LaunchPlan,
    LaunchRequest,
    MemoryAttachment,
    NativeMemoryUnconfirmed,
    Result,
    build_plan,
    run,
)
from runtime_bridge.providers.codex import (
    CLIENT_INFO,
    PLAN_TOOL,
    unconfirmed_memory_settings,
)
from runtime_bridge.providers.process import materialize, start, stop
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import (
    CREDENTIAL,
    StubMcp,
    collect,
    offline_request,
    stub_search_call,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


# The launch-local overrides each permission policy adds last, before ``app-server``.
POLICY_ARGS = {
    policy: ("-c", 'sandbox_mode="danger-full-access"', "-c", f'approval_policy="{config}"')
    for policy, config in (("auto", "never"), ("read-only", "never"), ("ask", "on-request"))
}


@pytest.mark.parametrize(
    ("permissions", "thread_policy"),
    [("auto", "never"), ("read-only", "never"), ("ask", "untrusted"), ("unknown", "untrusted")],
)
def test_each_policy_turns_off_codexs_sandbox_and_sets_its_approval_policy_after_the_operators(
    tmp_path: Path, permissions: str, thread_policy: str
) -> None:
    request = LaunchRequest(
        provider="codex",
        prompt="hi",
        cwd=tmp_path,
        run_dir=tmp_path / "run",
        extra_args=("-c", 'approval_policy="on-failure"', "-c", 'sandbox_mode="read-only"'),
        permissions=permissions,
    )
    plan = build_plan(request)
    config_policy = POLICY_ARGS.get(permissions, POLICY_ARGS["ask"])
    assert plan.argv == ("codex", *PLAN_TOOL, *request.extra_args, *config_policy, "app-server")
    assert plan.codex is not None and plan.codex.approval_policy == thread_policy
    assert plan.permissions == permissions
    shown = plan.to_json()
    assert shown["codex"]["approval_policy"] == thread_policy
    assert 'sandbox_mode="danger-full-access"' in shown["argv"]


def codex_config(tmp_path: Path, model: FakeModelServer) -> Path:
    """An operator's config.toml: the fake provider, and no plugin sync (it reaches outside)."""
    path = tmp_path / "operator-codex" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""model = "fake-model"
model_provider = "fake"

[model_providers.fake]
name = "fake"
base_url = "{model.base_url}/v1"
wire_api = "responses"
env_key = "OPENAI_API_KEY"

[features]
plugins = false
remote_plugin = false
"""
    )
    return path


def request_for(
    tmp_path: Path,
    model: FakeModelServer,
    executable: str,
    memory: MemoryAttachment | None,
    resume_id: str | None = None,
    prompt: str = "Which language do I prefer?",
    extra_args: tuple[str, ...] = (),
) -> LaunchRequest:
    return offline_request(
        tmp_path,
        model.base_url,
        "codex",
        executable,
        memory,
        resume_id=resume_id,
        prompt=prompt,
        extra_args=extra_args,
        state_dir=tmp_path / "state",
        developer_instructions="Answer briefly.",
        provider_home_source=codex_config(tmp_path, model),
    )


def thread_memory_mode(plan: LaunchPlan, thread_id: str) -> str:
    """The memory mode Codex persisted for a thread in its own state database."""
    home = Path(plan.env["CODEX_HOME"])
    (database,) = sorted(home.glob("state_*.sqlite"))
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        row = connection.execute(
            "SELECT memory_mode FROM threads WHERE id = ?", (thread_id,)
        ).fetchone()
    connection.close()
    assert row is not None, f"thread {thread_id} not in {database}"
    return str(row[0])


def developer_text(model: FakeModelServer) -> str:
    return model.main_requests[0].role_text("developer")


async def test_bound_codex_calls_the_memory_mcp_server_with_native_memory_off(
    tmp_path: Path,
    codex_bin: str,
    stub_mcp: StubMcp,
    attachment_for: Callable[..., MemoryAttachment],
) -> None:
    script: list[Step] = [
        CallTool("mcp__memory__amux_memory_search", {"query": "language preference"}),
        Answer("You prefer English."),
    ]
    async with FakeModelServer(script) as model:
        plan = build_plan(request_for(tmp_path, model, codex_bin, attachment_for(stub_mcp.argv)))
        events = await collect(run(plan))

    result = events[-1]
    assert isinstance(result, Result), events
    assert result.text == "You prefer English."
    assert result.native_session_id
    assert result.usage.get("totalTokens")
    assert stub_mcp.calls() == [stub_search_call("language preference")]
    assert any("STUB-MEMORY-HIT" in text for _, text in model.tool_results)
    merged = merge_instructions("Answer briefly.", protocol_text("mcp"))
    assert merged.strip() in developer_text(model)
    assert thread_memory_mode(plan, result.native_session_id) == "disabled"
    assert CREDENTIAL not in " ".join(plan.argv)


async def test_resumed_codex_thread_keeps_history_protocol_and_disabled_memory(
    tmp_path: Path,
    codex_bin: str,
    stub_mcp: StubMcp,
    attachment_for: Callable[..., MemoryAttachment],
) -> None:
    memory = attachment_for(stub_mcp.argv)
    async with FakeModelServer([Answer("First answer.")]) as model:
        first = await collect(run(build_plan(request_for(tmp_path, model, codex_bin, memory))))
        session = first[-1]
        assert isinstance(session, Result) and session.native_session_id
        model.add_steps([Answer("Second answer.")])
        plan = build_plan(
            request_for(
                tmp_path,
                model,
                codex_bin,
                memory,
                resume_id=session.native_session_id,
                prompt="And before?",
            )
        )
        second = await collect(run(plan))

    resumed = second[-1]
    assert isinstance(resumed, Result), second
    assert resumed.text == "Second answer."
    assert resumed.native_session_id == session.native_session_id
    last = model.main_requests[-1]
    assert "First answer." in str(last.body["input"])
    assert last.role_text("developer").count(protocol_text("mcp").strip()) == 1
    assert thread_memory_mode(plan, session.native_session_id) == "disabled"


async def test_unbound_codex_keeps_native_memory_policy_and_no_protocol(
    tmp_path: Path, codex_bin: str
) -> None:
    async with FakeModelServer([Answer("Plain answer.")]) as model:
        plan = build_plan(request_for(tmp_path, model, codex_bin, memory=None))
        events = await collect(run(plan))

    result = events[-1]
    assert isinstance(result, Result), events
    assert result.native_session_id
    assert plan.argv == (codex_bin, *PLAN_TOOL, *POLICY_ARGS["auto"], "app-server")
    developer = developer_text(model)
    assert "Answer briefly." in developer
    assert "amux.memory_search" not in developer
    assert thread_memory_mode(plan, result.native_session_id) == "enabled"


async def test_codex_that_reports_native_memory_on_fails_the_launch_naming_the_setting(
    tmp_path: Path,
    codex_bin: str,
    stub_mcp: StubMcp,
    attachment_for: Callable[..., MemoryAttachment],
) -> None:
    # A later override wins, so the effective config says use_memories=true.
    override = ("-c", "memories.use_memories=true")
    async with FakeModelServer([Answer("never reached")]) as model:
        plan = build_plan(
            request_for(
                tmp_path, model, codex_bin, attachment_for(stub_mcp.argv), extra_args=override
            )
        )
        with pytest.raises(NativeMemoryUnconfirmed, match=r"memories\.use_memories=true"):
            await collect(run(plan))
    assert model.main_requests == []
    assert stub_mcp.calls() == []


async def test_offline_probe_confirms_memory_settings_instructions_and_persisted_mode(
    tmp_path: Path,
    codex_bin: str,
    stub_mcp: StubMcp,
    attachment_for: Callable[..., MemoryAttachment],
) -> None:
    """Seed 000 §8's probe on the pinned Codex, then a resume that does not set the mode again."""
    async with FakeModelServer([Answer("First."), Answer("Second.")]) as model:
        plan = build_plan(request_for(tmp_path, model, codex_bin, attachment_for(stub_mcp.argv)))
        materialize(plan)
        assert plan.codex is not None and plan.codex.developer_instructions

        async def session() -> tuple[asyncio.subprocess.Process, CodexRpc]:
            process = await start(plan, list(plan.argv))
            assert process.stdout is not None and process.stdin is not None
            rpc = CodexRpc(process.stdout, process.stdin)
            await rpc.call(
                "initialize",
                {"clientInfo": CLIENT_INFO, "capabilities": {"experimentalApi": True}},
            )
            await rpc.notify("initialized")
            return process, rpc

        async def turn(rpc: CodexRpc, thread_id: str) -> None:
            await rpc.call(
                "turn/start", {"threadId": thread_id, "input": [{"type": "text", "text": "hi"}]}
            )
            async for note in rpc.notifications():
                if note.method == "turn/completed":
                    assert note.params["turn"]["status"] == "completed"
                    return

        process, rpc = await session()
        try:
            read = await rpc.call("config/read", {"includeLayers": False, "cwd": str(plan.cwd)})
            assert unconfirmed_memory_settings(read["config"]) == []
            assert read["config"]["features"]["memories"] is False
            assert read["config"]["memories"]["use_memories"] is False
            assert read["config"]["memories"]["generate_memories"] is False
            started = await rpc.call(
                "thread/start",
                {
                    "cwd": str(plan.cwd),
                    "developerInstructions": plan.codex.developer_instructions,
                    "approvalPolicy": "never",
                },
            )
            thread_id = started["thread"]["id"]
            assert (
                await rpc.call("thread/memoryMode/set", {"threadId": thread_id, "mode": "disabled"})
                == {}
            )
            # Persisted in native state before any model turn.
            assert thread_memory_mode(plan, thread_id) == "disabled"
            await turn(rpc, thread_id)
        finally:
            await rpc.close()
            await stop(process)

        process, rpc = await session()
        try:
            resumed = await rpc.call("thread/resume", {"threadId": thread_id, "cwd": str(plan.cwd)})
            assert resumed["thread"]["id"] == thread_id
            await turn(rpc, thread_id)
        finally:
            await rpc.close()
            await stop(process)

    assert thread_memory_mode(plan, thread_id) == "disabled"
    assert plan.codex.developer_instructions.strip() in model.main_requests[-1].role_text(
        "developer"
    )
