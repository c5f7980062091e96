"""Launches keep what the operator configured and what a bound conversation was promised.

- Codex: the ``developer_instructions`` of the operator's Codex config, then amux's own setting,
  then the memory protocol, all reach the model in that order.
- Claude: an MCP server the operator declares is callable beside amux memory.
- A bound conversation resumed while the Hub cannot be asked about its memory keeps the
  protocol and native-memory suppression, says so, and its memory calls fail as unavailable.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from runtime_bridge.memoryprotocol import protocol_text
from runtime_bridge.providers import LaunchRequest, MemoryAttachment, build_plan
from runtime_bridge.providers.codex import EFFECTIVE_CONFIG_SOURCE
from tests.conftest import AMUX, MEMORY_ON, free_port, stand_in
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import find_agent_cli
from tests.runtime_bridge.test_providers_codex import codex_config
from tests.runtime_bridge.test_worker import AUTO_MEMORY_MARK, agent_run, start_hub
from tests.runtime_bridge.test_worker_codex import start_codex_hub
from tests.runtime_bridge.test_workers_remote import Cluster
from tests.runtime_bridge.test_workers_remote import cluster_for as cluster_for  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

STUB_MCP = "stub_mcp.py"
OPERATOR_RULE = "OPERATOR-RULE-7: cite the file you changed."


async def test_codex_gets_the_operators_developer_instructions_then_amuxs_then_the_protocol(
    tmp_path: Path,
) -> None:
    async with FakeModelServer([Answer("Done.")]) as model:
        # The operator's config.toml with developer instructions of its own (a top-level key goes
        # before the tables).
        config = tmp_path / "operator-with-instructions" / "config.toml"
        config.parent.mkdir()
        base = codex_config(tmp_path, model).read_text()
        config.write_text(f"developer_instructions = {json.dumps(OPERATOR_RULE)}\n{base}")
        hub = start_codex_hub(
            tmp_path, model, AMUX_RUNTIME_CODEX_CONFIG=str(config), settings=MEMORY_ON
        )
        try:
            done = await agent_run(hub, "--provider", "codex", "Hello")
            assert done["state"] == "succeeded", done
            developer = model.main_requests[0].role_text("developer")
            operator_at = developer.index(OPERATOR_RULE)
            amux_at = developer.index("Answer briefly.")
            protocol_at = developer.index(protocol_text("mcp").strip()[:60])
            assert operator_at < amux_at < protocol_at
        finally:
            hub.stop()


def test_the_codex_plan_names_where_its_developer_instructions_come_from(
    tmp_path: Path,
) -> None:
    memory = MemoryAttachment("http://hub", "tok-secret", "global", ("amux", "mcp"))
    request = LaunchRequest(
        provider="codex",
        prompt="hi",
        cwd=tmp_path,
        run_dir=tmp_path / "run",
        developer_instructions="Answer briefly.",
        memory=memory,
    )
    shown = build_plan(request).to_json()["codex"]
    assert shown["developer_instructions_sources"] == [
        EFFECTIVE_CONFIG_SOURCE,
        "AMUX_RUNTIME_DEVELOPER_INSTRUCTIONS",
        "amux memory protocol",
    ]
    unbound = build_plan(LaunchRequest("codex", "hi", tmp_path, tmp_path / "run")).to_json()
    assert unbound["codex"]["developer_instructions_sources"] == []


async def test_an_operators_mcp_server_is_callable_beside_memory_in_a_bound_claude_launch(
    tmp_path: Path,
) -> None:
    servers = {
        "mcpServers": {
            "ops": {
                "type": "stdio",
                "command": sys.executable,
                "args": [str(stand_in(STUB_MCP))],
                # Relative: the server runs in the Agent's workspace, the one place it may write.
                "env": {"STUB_MCP_LOG": "ops-calls.jsonl"},
            }
        }
    }
    config = tmp_path / "operator-claude-mcp.json"
    config.write_text(json.dumps(servers))
    script: list[Step] = [
        CallTool("mcp__ops__amux_memory_search", {"query": "deploys"}),
        CallTool("mcp__memory__amux_memory_search", {"query": "deploys"}),
        Answer("Both answered."),
    ]
    async with FakeModelServer(script) as model:
        hub = start_hub(
            tmp_path, model.base_url, AMUX_RUNTIME_CLAUDE_MCP_CONFIG=str(config), settings=MEMORY_ON
        )
        try:
            done = await agent_run(hub, "--provider", "claude", "Search both")
            assert done["state"] == "succeeded", done
            names = model.main_requests[0].tool_names
            assert "mcp__ops__amux_memory_search" in names
            assert "mcp__memory__amux_memory_search" in names
            results = [text for _, text in model.tool_results]
            assert "STUB-MEMORY-HIT" in results[0]
            assert '"matches"' in results[1] and "STUB-MEMORY-HIT" not in results[1]
        finally:
            hub.stop()


class FlakyHop:
    """A loopback hop in front of the Hub that can refuse one RPC method, as a Hub that is
    restarting or an overloaded proxy would; everything else passes through unchanged."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.failing: set[str] = set()
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        method = request.path.rsplit("/", 1)[-1]
        if method in self.failing:
            body = {"error": {"code": "unavailable", "message": "the Hub is restarting"}}
            return web.json_response(body, status=503)
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                self.upstream + request.path_qs,
                headers=headers,
                data=await request.read(),
            ) as answer,
        ):
            return web.Response(
                status=answer.status,
                body=await answer.read(),
                content_type=answer.content_type,
            )


@asynccontextmanager
async def flaky_hop(upstream: str) -> AsyncIterator[FlakyHop]:
    hop = FlakyHop(upstream)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hop.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    hop.url = f"http://127.0.0.1:{port}"
    try:
        yield hop
    finally:
        await runner.cleanup()


async def test_a_bound_claude_conversation_keeps_its_protocol_when_the_hub_cannot_be_asked(
    tmp_path: Path,
    cluster_for: Any,  # noqa: F811
) -> None:
    script: list[Step] = [
        Answer("First."),
        CallTool("mcp__memory__amux_memory_search", {"query": "deploys"}),
        Answer("Second."),
    ]
    async with FakeModelServer(script) as model:
        cluster: Cluster = cluster_for(
            model,
            ANTHROPIC_BASE_URL=model.base_url,
            ANTHROPIC_API_KEY="sk-ant-test",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            AMUX_RUNTIME_CLAUDE=find_agent_cli("claude"),
            settings=MEMORY_ON,
        )
        async with flaky_hop(cluster.hub.url) as hop:
            await asyncio.to_thread(cluster.start_worker, "behind-hop", hop.url)
            first = await agent_run(cluster.hub, "--provider", "claude", "Hello")
            assert first["state"] == "succeeded" and first["binding"] == "global", first

            hop.failing.add("sessions.memory")
            again = await agent_run(
                cluster.hub, "--provider", "claude", "--session", first["session_id"], "Again"
            )
        assert again["state"] == "succeeded", again
        (warning,) = again["warnings"]
        assert "the conversation keeps its memory instructions" in warning
        resumed = model.main_requests[-1]
        assert protocol_text("mcp").strip() in resumed.system_text
        assert AUTO_MEMORY_MARK not in resumed.system_text
        # The memory tool is there, and answers why it cannot serve this turn.
        (_, answer), *_ = model.tool_results
        assert '"code":"unavailable"' in answer.replace(" ", "")
        assert "could not be asked" in answer
        # The Session stays bound: the next turn, with the Hub answering, has memory again.
        status, session = await asyncio.to_thread(
            cluster.hub.rpc, "sessions.get", session_id=first["session_id"]
        )
        assert status == 200 and session["memory"] == "bound", session


def test_an_agents_amux_cli_answers_unavailable_with_the_reason(tmp_path: Path) -> None:
    done = subprocess.run(
        [AMUX, "memory", "search", "deploys"],
        env={"AMUX_MEMORY_UNAVAILABLE": "the Hub could not be asked", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stderr.strip() == (
        "error: unavailable: amux memory is unavailable: the Hub could not be asked"
    )
