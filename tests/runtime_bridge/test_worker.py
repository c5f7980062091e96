"""Managed turns end to end: `amux agent run` → Hub queue → in-process worker → real agent CLI.

The agent CLIs are real; only the model provider is a scripted fake on loopback. Memory calls go
from the agent through the real `amux mcp` (or the `amux` CLI for Pi) to the Hub with a
delegated credential, so a document appearing in the Hub proves the whole chain.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from runtime_bridge.memoryprotocol import protocol_text
from tests.conftest import MEMORY_ON, CliResult, HubProcess, wait_until
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import find_agent_cli, serve_agents

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

AUTO_MEMORY_MARK = "persistent file-based memory"


def start_hub(
    tmp_path: Path, model_url: str, *, settings: Mapping[str, Any] | None = None, **env: str
) -> HubProcess:
    """`amux serve` whose in-process worker launches the pinned Claude against ``model_url``."""
    claude = {
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "AMUX_RUNTIME_CLAUDE": find_agent_cli("claude"),
        "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
    }
    return serve_agents(tmp_path, {**claude, **env}, settings)


async def cli(hub: HubProcess, *args: str, **kwargs: Any) -> CliResult:
    # The fake model shares this event loop, so the blocking CLI runs in a thread.
    return await asyncio.to_thread(hub.cli, *args, **kwargs)


async def agent_run(hub: HubProcess, *args: str) -> dict[str, Any]:
    done = await cli(hub, "agent", "run", "--json", *args, timeout=150)
    assert done.stdout, done.stderr
    return dict(json.loads(done.stdout))


async def test_a_bound_claude_turn_saves_memory_through_the_hub_and_resumes_with_its_binding(
    tmp_path: Path,
) -> None:
    content = "# Review format\nconclusion, evidence, unresolved questions\n"
    script: list[Step] = [
        CallTool(
            "mcp__memory__amux_memory_upsert",
            {"path": "topics/review-format.md", "content": content, "expected_revision": "absent"},
        ),
        Answer("Saved to topics/review-format.md."),
    ]
    async with FakeModelServer(script) as model:
        hub = start_hub(tmp_path, model.base_url, settings=MEMORY_ON)
        try:
            first = await agent_run(hub, "--provider", "claude", "Remember our review format")
            assert first["state"] == "succeeded", first
            assert first["text"] == "Saved to topics/review-format.md."
            assert first["binding"] == "global"
            assert first["warnings"] == []

            shown = (await cli(hub, "memory", "show", "--json", "topics/review-format.md")).json()
            assert shown["content"] == content

            request = model.main_requests[0]
            assert protocol_text("mcp").strip() in request.system_text
            assert AUTO_MEMORY_MARK not in request.system_text
            assert "mcp__memory__amux_memory_upsert" in request.tool_names
            upsert_result = model.tool_results[0][1]
            assert '"revision"' in upsert_result

            # A resume reuses the native conversation and the frozen binding.
            model.add_steps([Answer("Still here.")])
            second = await agent_run(
                hub, "--provider", "claude", "--session", first["session_id"], "Anything else?"
            )
            assert second["state"] == "succeeded", second
            assert second["session_id"] == first["session_id"]
            assert second["binding"] == "global"
            last = model.main_requests[-1]
            assert "Remember our review format" in json.dumps(last.body["messages"])
            assert protocol_text("mcp").strip() in last.system_text
        finally:
            hub.stop()


async def test_with_memory_off_a_turn_runs_unbound_with_native_memory_and_no_warning(
    tmp_path: Path,
) -> None:
    async with FakeModelServer([Answer("Plain answer.")]) as model:
        hub = start_hub(tmp_path, model.base_url)
        try:
            done = await agent_run(hub, "--provider", "claude", "Hello")
            assert done["state"] == "succeeded", done
            assert done["text"] == "Plain answer."
            assert done["binding"] is None
            assert done["warnings"] == []
            system = model.main_requests[0].system_text
            assert protocol_text("mcp").strip() not in system
            # Ordinary native-memory policy: Claude's own auto-memory section is present.
            assert AUTO_MEMORY_MARK in system

            # Enabling memory later does not adopt the unbound conversation.
            await asyncio.to_thread(hub.enable_memory)
            model.add_steps([Answer("Second.")])
            again = await agent_run(
                hub, "--provider", "claude", "--session", done["session_id"], "Again"
            )
            assert again["state"] == "succeeded", again
            assert again["binding"] is None
            assert protocol_text("mcp").strip() not in model.main_requests[-1].system_text
        finally:
            hub.stop()


async def test_a_missing_agent_executable_fails_the_turn_with_a_clear_error(
    tmp_path: Path,
) -> None:
    async with FakeModelServer([]) as model:
        hub = start_hub(tmp_path, model.base_url, AMUX_RUNTIME_CLAUDE="/nonexistent/claude")
        try:
            done = await cli(hub, "agent", "run", "--provider", "claude", "Hello", timeout=120)
            assert done.returncode == 1
            assert "/nonexistent/claude" in done.stderr
            assert "not found" in done.stderr or "missing" in done.stderr
            assert "Traceback" not in done.stderr
            assert model.main_requests == []
        finally:
            hub.stop()


async def test_an_isolation_change_fails_the_old_bindings_memory_calls_without_fallback(
    tmp_path: Path,
) -> None:
    async with FakeModelServer([Answer("First.")]) as model:
        hub = start_hub(tmp_path, model.base_url, settings=MEMORY_ON)
        try:
            first = await agent_run(hub, "--provider", "claude", "Start")
            assert first["binding"] == "global"
            await asyncio.to_thread(hub.enable_memory, True)

            model.add_steps(
                [
                    CallTool("mcp__memory__amux_memory_search", {"query": "anything"}),
                    Answer("Could not read memory."),
                ]
            )
            second = await agent_run(
                hub, "--provider", "claude", "--session", first["session_id"], "Search memory"
            )
            assert second["state"] == "succeeded", second
            assert second["binding"] == "global"
            tool_output = model.tool_results[-1][1]
            assert "binding_mismatch" in tool_output
        finally:
            hub.stop()


async def test_a_turns_request_id_follows_it_to_the_worker_and_back(tmp_path: Path) -> None:
    async with FakeModelServer([Answer("Traced.")]) as model:
        hub = start_hub(tmp_path, model.base_url, AMUX_LOG_FORMAT="json")
        try:
            trace = "trace-7f3a9c"
            status, submitted = await asyncio.to_thread(
                hub.rpc,
                "executions.submit",
                headers={"X-Request-Id": trace},
                provider="claude",
                prompt="Hello",
            )
            assert status == 200, submitted
            execution_id = submitted["execution"]["id"]

            def finished() -> bool:
                _, state = hub.rpc("executions.watch", execution_id=execution_id)
                return bool(state["state"] == "succeeded")

            await asyncio.to_thread(wait_until, finished, 120)
            lines = [json.loads(line) for line in hub.log().splitlines() if line.startswith("{")]
            traced = {
                (line.get("path"), line.get("transport"))
                for line in lines
                if line.get("request_id") == trace
            }
            # The worker's own calls for this turn, over HTTP from its own process, carry the id
            # the turn was submitted with.
            assert {
                ("/rpc/v1/executions.submit", None),
                ("/rpc/v1/sessions.memory", None),
                ("/rpc/v1/executions.complete", None),
            } <= traced
        finally:
            hub.stop()


async def test_a_working_directory_must_exist_and_is_never_made_by_the_cli_or_the_worker(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nonexistent" / "dir"
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    async with FakeModelServer([]) as model:
        hub = start_hub(tmp_path, model.base_url)
        try:
            # The CLI refuses at once, in one line naming the path.
            for path, problem in ((missing, "does not exist"), (a_file, "is not a directory")):
                done = await cli(hub, "agent", "run", "--cwd", str(path), "hi")
                assert done.returncode == 1
                assert done.stderr == (
                    f"error: invalid_argument: --cwd {path} {problem}; name an existing directory\n"
                )
            # The Hub takes only an absolute path; whether it exists is the worker's to say.
            status, body = await asyncio.to_thread(
                hub.rpc, "executions.submit", provider="claude", prompt="hi", cwd="relative/dir"
            )
            assert status == 400 and body["error"]["code"] == "invalid_argument"
            # A turn submitted past the CLI fails with a clear error and leaves nothing behind.
            for path, problem in ((missing, "does not exist"), (a_file, "is not a directory")):
                status, body = await asyncio.to_thread(
                    hub.rpc, "executions.submit", provider="claude", prompt="hi", cwd=str(path)
                )
                assert status == 200, body
                execution_id = body["execution"]["id"]

                def finished(execution_id: str = execution_id) -> bool:
                    _, state = hub.rpc("executions.watch", execution_id=execution_id)
                    return bool(state["state"] == "failed")

                await asyncio.to_thread(wait_until, finished, 60)
                _, state = await asyncio.to_thread(
                    hub.rpc, "executions.watch", execution_id=execution_id
                )
                assert state["error"] == (
                    f"the working directory {path} {problem} on the worker's host; "
                    "name an existing directory"
                )
            assert not missing.parent.exists()
            assert a_file.read_text() == "not a directory\n"
            assert "Traceback" not in hub.log()
            assert model.main_requests == []
        finally:
            hub.stop()


async def test_agent_run_prints_the_agents_plan_and_steps_as_readable_lines(
    tmp_path: Path,
) -> None:
    todos = [
        {"content": "Inspect", "status": "completed", "activeForm": "Inspecting"},
        {"content": "Patch", "status": "in_progress", "activeForm": "Patching"},
    ]
    script: list[Step] = [
        CallTool("TodoWrite", {"todos": todos}),
        CallTool("Glob", {"pattern": "**/*.py"}),
        Answer("Planned."),
    ]
    async with FakeModelServer(script) as model:
        hub = start_hub(tmp_path, model.base_url)
        try:
            done = await cli(hub, "agent", "run", "Plan it", timeout=150)
            assert done.returncode == 0, done.stderr
            assert "plan: [x] Inspect; [>] Patch" in done.stderr
            assert "search: **/*.py" in done.stderr
            assert '{"step"' not in done.stderr and '{"action"' not in done.stderr
        finally:
            hub.stop()
