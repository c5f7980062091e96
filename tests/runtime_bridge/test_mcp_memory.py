"""The MCP memory server in memory: the SDK's own client connected to ``build_server`` in-process,
its bridge calling a real Hub (``add_hub`` alone) served on loopback by aiohttp's test server.

These cover the tools' behaviour without starting a process; ``test_mcp_server`` runs the same
server as the ``amux mcp`` subprocess an Agent launches.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from mcp import Client
from mcp.types import CallToolResult, TextContent

from hub.client import HubClient
from hub.config import HubSettings
from hub.errors import InvalidArgument
from hub.server import add_hub
from hub.state import State
from runtime_bridge.mcp_paging import PAGE_BYTES, PageCache
from runtime_bridge.mcp_server import (
    MemoryBridge,
    build_server,
    client_went_away,
    judge_capabilities,
)


@dataclass
class InProcessHub:
    """A Hub in this process, on a loopback port, with two users and their CLI tokens."""

    url: str
    tokens: dict[str, str]

    @asynccontextmanager
    async def client(self, name: str = "alice", **bridge: Any) -> AsyncIterator[Client]:
        """An MCP client connected in memory to a server whose bridge uses ``name``'s token."""
        async with (
            MemoryBridge(HubClient(self.url, self.tokens[name]), **bridge) as memory,
            Client(build_server(memory)) as client,
        ):
            yield client


def prepared_home(home: Path, *, enabled: bool) -> dict[str, str]:
    """Settings and principals saved before the Hub opens, as an operator would prepare them."""
    state = State(HubSettings(home=home).state_path)
    try:
        state.save_setting("memory.enabled", enabled)
        state.save_setting("memory.isolation", "on")
        tokens = {}
        for name in ("alice", "bob"):
            principal = state.add_principal(name, "user", owner=False)
            tokens[name], _ = state.issue_credential(principal.id, "cli")
        return tokens
    finally:
        state.close()


async def start_hub(aiohttp_server: Any, home: Path, *, enabled: bool = True) -> InProcessHub:
    tokens = prepared_home(home, enabled=enabled)
    app = web.Application()
    add_hub(app, HubSettings(home=home))
    server = await aiohttp_server(app)
    return InProcessHub(str(server.make_url("")), tokens)


@pytest.fixture
async def hub(aiohttp_server: Any, tmp_path: Path) -> InProcessHub:
    return await start_hub(aiohttp_server, tmp_path / "amux-home")


def texts(result: CallToolResult) -> list[str]:
    blocks = []
    for block in result.content:
        assert isinstance(block, TextContent)
        blocks.append(block.text)
    return blocks


async def ok(client: Client, tool: str, **arguments: Any) -> Any:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, texts(result)
    [text] = texts(result)
    return json.loads(text)


async def error(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """The one error shape: ``{"error": {"code", "message", ...}}`` as an isError result."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, texts(result)
    [text] = texts(result)
    body = json.loads(text)
    assert set(body) == {"error"}, text
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


async def test_a_document_written_through_the_tools_is_found_read_and_forgotten(
    hub: InProcessHub,
) -> None:
    async with hub.client() as client:
        created = await ok(
            client,
            "amux.memory_upsert",
            path="notes/review.md",
            content="# Review\nconclusion, evidence\n",
            expected_revision="absent",
        )
        found = await ok(client, "amux.memory_search", query="evidence")
        assert [m["path"] for m in found["matches"]] == ["notes/review.md"]
        read = await ok(client, "amux.memory_get", path="notes/review.md", start_line=2)
        assert read["content"] == "conclusion, evidence\n"
        assert read["revision"] == created["revision"]
        gone = await ok(
            client,
            "amux.memory_forget",
            path="notes/review.md",
            expected_revision=created["revision"],
        )
        assert gone == {"path": "notes/review.md", "already_absent": False}


async def test_one_users_agent_never_sees_anothers_memory(hub: InProcessHub) -> None:
    async with hub.client("alice") as alice:
        await ok(
            alice,
            "amux.memory_upsert",
            path="prefs.md",
            content="alice likes brevity\n",
            expected_revision="absent",
        )
    async with hub.client("bob") as bob:
        assert (await ok(bob, "amux.memory_get", path="prefs.md"))["exists"] is False
        assert (await ok(bob, "amux.memory_search", query="brevity"))["matches"] == []


async def test_a_stale_revision_is_a_conflict_naming_the_observed_one(hub: InProcessHub) -> None:
    async with hub.client() as client:
        first = await ok(
            client, "amux.memory_upsert", path="a.md", content="one\n", expected_revision="absent"
        )
        stale = await error(
            client, "amux.memory_upsert", path="a.md", content="two\n", expected_revision="absent"
        )
    assert stale["code"] == "conflict"
    assert stale["observed_revision"] == first["revision"]


@pytest.mark.parametrize(
    ("tool", "arguments", "names"),
    [
        ("amux.memory_search", {"query": "x", "limit": "five"}, "limit"),
        ("amux.memory_search", {"query": 5}, "query"),
        ("amux.memory_get", {"path": "a.md", "start_line": [1]}, "start_line"),
        ("amux.memory_get", {}, "path"),
        ("amux.memory_upsert", {"path": "a.md", "content": {"x": 1}}, "content"),
        ("amux.result_continue", {"cursor": None}, "cursor"),
    ],
)
async def test_arguments_that_do_not_fit_a_tool_are_invalid_argument_in_the_one_error_shape(
    hub: InProcessHub, tool: str, arguments: dict[str, Any], names: str
) -> None:
    async with hub.client() as client:
        refused = await error(client, tool, **arguments)
    assert refused["code"] == "invalid_argument"
    assert refused["message"].startswith(f"invalid arguments for {tool}: ")
    assert f"{names}: " in refused["message"]


async def test_a_wrong_argument_names_every_offending_parameter_but_not_its_value(
    hub: InProcessHub,
) -> None:
    secret_like = "do-not-echo-this-value"
    async with hub.client() as client:
        refused = await error(
            client, "amux.memory_upsert", path="a.md", content=7, expected_revision=[secret_like]
        )
    assert "content: " in refused["message"]
    assert "expected_revision: " in refused["message"]
    assert secret_like not in refused["message"]


async def test_a_long_result_is_paged_and_the_parts_join_to_the_hubs_answer(
    hub: InProcessHub,
) -> None:
    content = "".join(f"line {n:04d}: {'数据' * 20} {'x' * 40}\n" for n in range(200))
    async with hub.client() as client:
        await ok(
            client, "amux.memory_upsert", path="big.md", content=content, expected_revision="absent"
        )
        result = await client.call_tool("amux.memory_get", {"path": "big.md"})
        parts = []
        while True:
            blocks = texts(result)
            assert sum(len(b.encode()) for b in blocks) <= PAGE_BYTES
            parts.append(blocks[0])
            if len(blocks) == 1:
                break
            cursor = blocks[1].split('cursor "', 1)[1].split('"', 1)[0]
            result = await client.call_tool("amux.result_continue", {"cursor": cursor})
    assert len(parts) >= 2
    read = json.loads("".join(parts))
    assert read["truncated"] is True and content.startswith(read["content"])


async def test_a_cursor_is_gone_once_its_pages_expire(hub: InProcessHub) -> None:
    now = [0.0]
    pages = PageCache(lambda: "r1", ttl=60.0)
    content = "y" * 7000 + "\n"
    async with hub.client(pages=pages, clock=lambda: now[0]) as client:
        await ok(
            client, "amux.memory_upsert", path="y.md", content=content, expected_revision="absent"
        )
        first = await client.call_tool("amux.memory_get", {"path": "y.md"})
        cursor = texts(first)[1].split('cursor "', 1)[1].split('"', 1)[0]
        now[0] = 61.0
        expired = await error(client, "amux.result_continue", cursor=cursor)
    assert expired["code"] == "not_found"


async def test_memory_disabled_on_the_hub_answers_every_data_tool_with_memory_disabled(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    hub = await start_hub(aiohttp_server, tmp_path / "amux-home", enabled=False)
    async with hub.client() as client:
        for tool, arguments in [
            ("amux.memory_search", {"query": "x"}),
            ("amux.memory_get", {"path": "MEMORY.md"}),
            ("amux.memory_upsert", {"path": "a.md", "content": "x", "expected_revision": "a"}),
            ("amux.memory_forget", {"path": "a.md", "expected_revision": "absent"}),
        ]:
            refused = await error(client, tool, **arguments)
            assert refused["code"] == "memory_disabled", tool


async def test_a_bridge_without_a_hub_lists_its_tools_and_each_answers_the_refusal() -> None:
    refusal = InvalidArgument("amux memory is not configured correctly: AMUX_TIMEOUT")
    async with (
        MemoryBridge(None, refusal=refusal) as memory,
        Client(build_server(memory)) as client,
    ):
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert "amux.memory_get" in tools
        refused = await error(client, "amux.memory_get", path="MEMORY.md")
    assert refused == {"code": "invalid_argument", "message": refusal.message}


def test_the_capability_verdict_needs_memory_methods_and_memory_enabled() -> None:
    methods = ["memory.search", "memory.get", "memory.upsert", "memory.forget"]
    assert judge_capabilities({"memory": {"enabled": True, "methods": methods}}).ready
    older = judge_capabilities({"version": "0.0.1"})
    assert not older.ready and older.error is not None
    assert older.error.code == "unavailable" and "does not offer" in older.error.message
    off = judge_capabilities({"memory": {"enabled": False, "methods": methods}})
    assert off.error is not None and off.error.code == "memory_disabled"


def test_the_feishu_tools_need_a_feishu_app_and_not_memory() -> None:
    methods = ["memory.search", "memory.get", "memory.upsert", "memory.forget"]
    feishu = {"available": True, "methods": ["feishu.read", "feishu.search"]}
    # Memory off refuses the memory tools only.
    off = judge_capabilities({"memory": {"enabled": False, "methods": methods}, "feishu": feishu})
    assert off.refusal(feishu=False) is not None and off.refusal(feishu=True) is None
    # No Feishu app beside the Hub, or a Hub from before the Feishu tools: they say so.
    for capabilities in (
        {"memory": {"enabled": True, "methods": methods}, "feishu": {**feishu, "available": False}},
        {"memory": {"enabled": True, "methods": methods}},
    ):
        verdict = judge_capabilities(capabilities)
        assert verdict.refusal(feishu=False) is None
        refusal = verdict.refusal(feishu=True)
        assert refusal is not None and refusal.code == "feishu_unavailable"


def test_only_a_closed_pipe_counts_as_the_client_going_away() -> None:
    assert client_went_away(BrokenPipeError())
    assert client_went_away(ExceptionGroup("stdio", [BrokenPipeError(), ConnectionResetError()]))
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [BrokenPipeError()])])
    assert client_went_away(nested)
    assert not client_went_away(ExceptionGroup("stdio", [BrokenPipeError(), ValueError()]))
    assert not client_went_away(RuntimeError("boom"))
