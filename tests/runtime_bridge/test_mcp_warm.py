"""The worker's warm MCP host: launches get a shim that starts fast and serves the same tools.

Each connection runs with its own launch's credential and binding; a host that is gone leaves
launches on the ordinary cold `amux mcp`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hub.config import OWNER_TOKEN_FILE
from runtime_bridge.mcp_launcher import WarmMcp
from tests.conftest import AMUX
from tests.runtime_bridge import test_mcp_server as cold
from tests.runtime_bridge.test_mcp_server import MemoryHub, error, mcp_session, ok

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# The same module-scoped Hub (memory and isolation on, two users) the cold server is tested with.
memory_hub = cold.memory_hub


@pytest.fixture
async def warm() -> AsyncIterator[WarmMcp]:
    host = WarmMcp(AMUX)
    await host.start()
    try:
        yield host
    finally:
        await host.stop()


async def test_launches_through_the_warm_host_serve_each_their_own_scope(
    memory_hub: MemoryHub, warm: WarmMcp, tmp_path: Path
) -> None:
    argv = list(warm.argv())
    assert argv[-1] == AMUX and "mcp_shim.py" in argv[3]
    log = tmp_path / "mcp.log"
    url = memory_hub.hub.url
    document = {"path": "notes/warm.md", "content": "alice only\n", "expected_revision": "absent"}
    async with mcp_session(log, url, memory_hub.tokens["alice"], command=argv) as alice:
        tools = await alice.list_tools()
        assert "amux.memory_search" in {tool.name for tool in tools.tools}
        await ok(alice, "amux.memory_upsert", **document)
        async with mcp_session(log, url, memory_hub.tokens["bob"], command=argv) as bob:
            seen_by_bob = await ok(bob, "amux.memory_get", path="notes/warm.md")
            assert seen_by_bob["exists"] is False
        seen_by_alice = await ok(alice, "amux.memory_get", path="notes/warm.md")
        assert seen_by_alice["content"] == "alice only\n"


async def test_a_connection_without_a_valid_credential_is_refused_like_a_cold_one(
    memory_hub: MemoryHub, warm: WarmMcp, tmp_path: Path
) -> None:
    log = tmp_path / "mcp.log"
    async with mcp_session(log, memory_hub.hub.url, "amux_forged", command=list(warm.argv())) as s:
        refused = await error(s, "amux.memory_get", path="MEMORY.md")
        assert refused["code"] == "unauthenticated"


async def test_the_shim_starts_much_faster_than_a_cold_server(
    memory_hub: MemoryHub, warm: WarmMcp, tmp_path: Path
) -> None:
    log = tmp_path / "mcp.log"

    async def ready_in(command: list[str]) -> float:
        started = time.perf_counter()
        async with mcp_session(
            log, memory_hub.hub.url, memory_hub.tokens["alice"], command=command
        ):
            return time.perf_counter() - started

    warm_seconds = min([await ready_in(list(warm.argv())) for _ in range(3)])
    cold_seconds = await ready_in([AMUX, "mcp"])
    # Not a timing target (that is the benchmark's job): the shim must skip the SDK import.
    assert warm_seconds < cold_seconds


async def test_without_the_host_launches_fall_back_to_the_cold_server(
    memory_hub: MemoryHub, tmp_path: Path
) -> None:
    host = WarmMcp(AMUX)
    assert host.argv() == (AMUX, "mcp")
    await host.start()
    shim = list(host.argv())
    await host.stop()
    assert host.argv() == (AMUX, "mcp")
    # A launch that was handed the shim just before the host went away still gets a server.
    log = tmp_path / "mcp.log"
    async with mcp_session(log, memory_hub.hub.url, memory_hub.tokens["alice"], command=shim) as s:
        got = await ok(s, "amux.memory_get", path="notes/never-written.md")
        assert got == {
            "path": "notes/never-written.md",
            "exists": False,
            "revision": "absent",
            "content": "",
            "truncated": False,
            "next_offset": None,
        }


async def test_a_connection_cannot_make_the_host_use_an_owner_token_it_can_read(
    memory_hub: MemoryHub, warm: WarmMcp, tmp_path: Path
) -> None:
    # An Agent that reaches the host's socket sends the settings it likes: the host runs outside
    # the Agent's sandbox and may read a Hub home with an owner token, so it must never fall back.
    hub_home = tmp_path / "hub-home"
    hub_home.mkdir()
    (hub_home / OWNER_TOKEN_FILE).write_text(memory_hub.tokens["alice"])
    log = tmp_path / "mcp.log"
    sneaky = {"AMUX_HOME": str(hub_home), "AMUX_OWNER_TOKEN_FALLBACK": "true"}
    async with mcp_session(log, memory_hub.hub.url, None, command=list(warm.argv()), **sneaky) as s:
        refused = await error(s, "amux.memory_get", path="MEMORY.md")
        assert refused["code"] == "unauthenticated", refused
