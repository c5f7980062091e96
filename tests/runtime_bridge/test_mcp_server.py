"""`amux mcp` as a real subprocess, driven by the mcp SDK's stdio client, against a live Hub."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, TextContent

from hub.config import HubSettings
from hub.state import State
from runtime_bridge.mcp_paging import PAGE_BYTES
from tests.conftest import AMUX, REPO, HubProcess, free_port

pytestmark = pytest.mark.e2e

TOOLS = {
    "amux.memory_search": ({"query", "path_prefix", "limit"}, {"query"}),
    "amux.memory_get": ({"path", "start_line", "end_line", "offset"}, {"path"}),
    "amux.memory_upsert": (
        {"path", "content", "expected_revision"},
        {"path", "content", "expected_revision"},
    ),
    "amux.memory_forget": ({"path", "expected_revision"}, {"path", "expected_revision"}),
    "amux.feishu_read": ({"document", "kind", "offset", "range"}, {"document"}),
    "amux.feishu_search": ({"query", "limit"}, {"query"}),
    "amux.feishu_comment": ({"document", "text"}, {"document", "text"}),
    "amux.result_continue": ({"cursor"}, {"cursor"}),
}
MODULE_COMMAND = [sys.executable, "-m", "runtime_bridge.mcp_server"]


@dataclass
class MemoryHub:
    """A Hub with memory on and isolation on, two users, a Runtime service, and their tokens."""

    hub: HubProcess
    tokens: dict[str, str]
    ids: dict[str, str]

    def binding(self, name: str) -> str:
        return f"principal:{self.ids[name]}"

    def delegate(self, name: str, binding: str) -> str:
        return str(self.delegation(name, binding)["token"])

    def delegation(self, name: str, binding: str) -> dict[str, Any]:
        status, body = self.hub.rpc(
            "credentials.delegate",
            token=self.tokens["runtime"],
            principal_id=self.ids[name],
            binding=binding,
        )
        assert status == 200, body
        return dict(body)


def seeded_hub(home: Path, *, enabled: bool = True, isolation: bool = True) -> MemoryHub:
    """A Hub (not yet started) whose state an operator prepared: settings, principals, tokens.

    Seeding the state before the first start saves a restart per Hub.
    """
    state = State(HubSettings(home=home).state_path)
    try:
        state.save_setting("memory.enabled", enabled)
        state.save_setting("memory.isolation", "on" if isolation else "off")
        tokens: dict[str, str] = {}
        ids: dict[str, str] = {}
        for name, kind in [("alice", "user"), ("bob", "user"), ("runtime", "service")]:
            principal = state.add_principal(name, kind, owner=False)
            ids[name] = principal.id
            tokens[name], _ = state.issue_credential(principal.id, "cli")
        tokens["alice-expired-agent"], _ = state.issue_credential(
            ids["alice"],
            "delegated",
            binding=f"principal:{ids['alice']}" if isolation else "global",
            expires_at=time.time() - 60,
            issued_by=ids["runtime"],
        )
    finally:
        state.close()
    # No Runtime worker inside the Hub: these tests need none, and a worker's long poll would hold
    # up every stop for the whole drain.
    hub = HubProcess(home, free_port(), extra_env={"AMUX_RUNTIME_IN_PROCESS": "false"})
    return MemoryHub(hub, tokens, ids)


@pytest.fixture(scope="module")
def memory_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryHub]:
    world = seeded_hub(tmp_path_factory.mktemp("mcp-hub") / "amux-home")
    world.hub.start()
    try:
        yield world
    finally:
        world.hub.stop()


@pytest.fixture
def mcp_log(tmp_path: Path) -> Path:
    return tmp_path / "mcp-stderr.log"


@asynccontextmanager
async def mcp_session(
    log: Path,
    hub_url: str,
    token: str | None = None,
    binding: str | None = None,
    command: list[str] = MODULE_COMMAND,
    **extra_env: str,
) -> AsyncIterator[ClientSession]:
    """Launch the server as an Agent would: connection settings in AMUX_* variables only."""
    # An empty AMUX_HOME, so no owner-token file on this host can stand in for the credential.
    home = log.parent / "agent-home"
    home.mkdir(exist_ok=True)
    env = {"AMUX_HUB_URL": hub_url, "AMUX_HOME": str(home), **extra_env}
    if token is not None:
        env["AMUX_TOKEN"] = token
    if binding is not None:
        env["AMUX_MEMORY_BINDING"] = binding
    params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=REPO)
    with log.open("a", encoding="utf-8") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def logged(log: Path) -> str:
    """What the servers wrote on stderr (their log)."""
    return log.read_text(encoding="utf-8")


def texts(result: CallToolResult) -> list[str]:
    blocks = []
    for block in result.content:
        assert isinstance(block, TextContent)
        blocks.append(block.text)
    return blocks


async def whole_text(session: ClientSession, result: CallToolResult) -> str:
    """Follow amux.result_continue cursors and join the parts, checking each page's size."""
    parts: list[str] = []
    while True:
        assert not result.is_error, texts(result)
        blocks = texts(result)
        assert sum(len(b.encode()) for b in blocks) <= PAGE_BYTES
        parts.append(blocks[0])
        if len(blocks) == 1:
            return "".join(parts)
        cursor = blocks[1].split('cursor "', 1)[1].split('"', 1)[0]
        result = await session.call_tool("amux.result_continue", {"cursor": cursor})


async def ok(session: ClientSession, tool: str, **arguments: Any) -> Any:
    result = await session.call_tool(tool, arguments)
    return json.loads(await whole_text(session, result))


async def error(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert result.is_error, texts(result)
    [text] = texts(result)
    body = json.loads(text)
    assert set(body) == {"error"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


async def test_tools_keep_their_names_parameters_and_bytes_across_launches(
    memory_hub: MemoryHub, mcp_log: Path
) -> None:
    listings = []
    for _ in range(2):
        async with mcp_session(mcp_log, memory_hub.hub.url, memory_hub.tokens["alice"]) as s:
            listings.append((await s.list_tools()).tools)
    first, second = listings
    assert [t.model_dump_json() for t in first] == [t.model_dump_json() for t in second]
    by_name = {tool.name: tool for tool in first}
    assert set(by_name) == set(TOOLS)
    for name, (params, required) in TOOLS.items():
        schema = by_name[name].input_schema
        assert set(schema["properties"]) == params, name
        assert set(schema.get("required", ())) == required, name
        assert by_name[name].description
        # No structured output: the model reads the Hub's JSON as plain text.
        assert by_name[name].output_schema is None


async def test_search_get_upsert_forget_round_trip(memory_hub: MemoryHub, mcp_log: Path) -> None:
    async with mcp_session(mcp_log, memory_hub.hub.url, memory_hub.tokens["alice"]) as s:
        content = "# Review format\nconclusion first, then evidence; 中文也可以\n"
        created = await ok(
            s,
            "amux.memory_upsert",
            path="rt/review.md",
            content=content,
            expected_revision="absent",
        )
        assert created["path"] == "rt/review.md"
        revision = created["revision"]

        read = await ok(s, "amux.memory_get", path="rt/review.md")
        assert read["exists"] is True
        assert read["content"] == content and read["revision"] == revision

        lines = await ok(s, "amux.memory_get", path="rt/review.md", start_line=2, end_line=2)
        assert lines["content"] == "conclusion first, then evidence; 中文也可以\n"

        found = await ok(s, "amux.memory_search", query="EVIDENCE 中文", path_prefix="rt")
        assert [m["path"] for m in found["matches"]] == ["rt/review.md"]
        assert found["matches"][0]["revision"] == revision

        gone = await ok(s, "amux.memory_forget", path="rt/review.md", expected_revision=revision)
        assert gone == {"path": "rt/review.md", "already_absent": False}
        missing = await ok(s, "amux.memory_get", path="rt/review.md")
        assert missing["exists"] is False and missing["revision"] == "absent"
        again = await ok(s, "amux.memory_forget", path="rt/review.md", expected_revision="absent")
        assert again["already_absent"] is True


async def test_a_stale_revision_is_a_conflict_carrying_the_observed_revision(
    memory_hub: MemoryHub, mcp_log: Path
) -> None:
    async with mcp_session(mcp_log, memory_hub.hub.url, memory_hub.tokens["alice"]) as s:
        first = await ok(
            s, "amux.memory_upsert", path="cf/a.md", content="one\n", expected_revision="absent"
        )
        stale = await error(
            s, "amux.memory_upsert", path="cf/a.md", content="two\n", expected_revision="absent"
        )
        assert stale["code"] == "conflict"
        assert stale["observed_revision"] == first["revision"]
        wrong = "0" * 64
        refused = await error(s, "amux.memory_forget", path="cf/a.md", expected_revision=wrong)
        assert refused["code"] == "conflict"
        assert refused["observed_revision"] == first["revision"]


async def test_a_large_get_is_paged_and_its_parts_join_to_the_hubs_answer(
    memory_hub: MemoryHub, mcp_log: Path
) -> None:
    content = "".join(f"line {n:04d}: {'数据' * 20} {'x' * 40}\n" for n in range(200))
    alice = memory_hub.tokens["alice"]
    async with mcp_session(mcp_log, memory_hub.hub.url, alice) as s:
        await ok(
            s, "amux.memory_upsert", path="big/doc.md", content=content, expected_revision="absent"
        )
        first = await s.call_tool("amux.memory_get", {"path": "big/doc.md"})
        assert len(texts(first)) == 2, "an 8 KiB Hub page must not fit one 6 KiB MCP page"
        assert "amux.result_continue" in texts(first)[1]
        paged = json.loads(await whole_text(s, first))
    status, direct = memory_hub.hub.rpc("memory.get", token=alice, path="big/doc.md")
    assert status == 200
    assert paged == direct
    assert paged["truncated"] is True and content.startswith(paged["content"])


async def test_a_large_search_is_paged_through_result_continue(
    memory_hub: MemoryHub, mcp_log: Path
) -> None:
    async with mcp_session(mcp_log, memory_hub.hub.url, memory_hub.tokens["bob"]) as s:
        for n in range(20):
            body = f"# note {n}\n{'needle ' * 60}\n"
            await ok(
                s,
                "amux.memory_upsert",
                path=f"many/{n:02d}.md",
                content=body,
                expected_revision="absent",
            )
        first = await s.call_tool("amux.memory_search", {"query": "needle", "limit": 20})
        assert len(texts(first)) == 2
        found = json.loads(await whole_text(s, first))
    assert len(found["matches"]) >= 15
    assert all(m["path"].startswith("many/") for m in found["matches"])


async def test_an_unknown_cursor_is_a_clear_error(memory_hub: MemoryHub, mcp_log: Path) -> None:
    async with mcp_session(mcp_log, memory_hub.hub.url, memory_hub.tokens["alice"]) as s:
        failed = await error(s, "amux.result_continue", cursor="nope.2")
    assert failed["code"] == "not_found"
    assert "repeat the original tool call" in failed["message"]


async def test_path_tricks_are_refused_as_invalid_paths(
    memory_hub: MemoryHub, mcp_log: Path
) -> None:
    tricks = ["../escape.md", "/etc/passwd.md", ".hidden/a.md", "a/../../b.md", "a\\b.md"]
    async with mcp_session(mcp_log, memory_hub.hub.url, memory_hub.tokens["alice"]) as s:
        for path in tricks:
            read = await error(s, "amux.memory_get", path=path)
            assert read["code"] == "invalid_path", path
            write = await error(
                s, "amux.memory_upsert", path=path, content="x", expected_revision="absent"
            )
            assert write["code"] == "invalid_path", path


async def test_a_bad_token_is_unauthenticated_and_never_logged(
    memory_hub: MemoryHub, mcp_log: Path
) -> None:
    forged = "amux_forged-token-value-0123456789"
    async with mcp_session(mcp_log, memory_hub.hub.url, forged) as s:
        for tool, arguments in [
            ("amux.memory_search", {"query": "x"}),
            ("amux.memory_upsert", {"path": "a.md", "content": "x", "expected_revision": "absent"}),
        ]:
            refused = await error(s, tool, **arguments)
            assert refused["code"] == "unauthenticated"
    assert forged not in logged(mcp_log)


async def test_no_credential_at_all_is_unauthenticated(
    memory_hub: MemoryHub, mcp_log: Path
) -> None:
    async with mcp_session(mcp_log, memory_hub.hub.url) as s:
        refused = await error(s, "amux.memory_get", path="MEMORY.md")
    assert refused["code"] == "unauthenticated"
    assert "AMUX_TOKEN" in refused["message"]


async def test_a_delegated_credential_works_only_with_its_binding_and_only_in_its_scope(
    memory_hub: MemoryHub, mcp_log: Path
) -> None:
    url = memory_hub.hub.url
    alice_binding = memory_hub.binding("alice")
    agent = memory_hub.delegate("alice", alice_binding)
    async with mcp_session(mcp_log, url, agent, alice_binding) as s:
        saved = await ok(
            s,
            "amux.memory_upsert",
            path="prefs/tone.md",
            content="alice likes brevity\n",
            expected_revision="absent",
        )
    # Alice's own CLI token sees the Agent's write; Bob sees nothing by any path.
    async with mcp_session(mcp_log, url, memory_hub.tokens["alice"]) as s:
        read = await ok(s, "amux.memory_get", path="prefs/tone.md")
        assert read["revision"] == saved["revision"]
    async with mcp_session(mcp_log, url, memory_hub.tokens["bob"]) as s:
        assert (await ok(s, "amux.memory_get", path="prefs/tone.md"))["exists"] is False
        assert (await ok(s, "amux.memory_search", query="brevity"))["matches"] == []

    for binding in [memory_hub.binding("bob"), None]:
        async with mcp_session(mcp_log, url, agent, binding) as s:
            refused = await error(s, "amux.memory_get", path="prefs/tone.md")
            assert refused["code"] == "binding_mismatch", binding
    assert agent not in logged(mcp_log)


async def test_expired_and_revoked_agent_credentials_are_unauthenticated(
    memory_hub: MemoryHub, mcp_log: Path
) -> None:
    binding = memory_hub.binding("alice")
    revoked = memory_hub.delegation("alice", binding)
    status, body = memory_hub.hub.rpc(
        "credentials.revoke", token=memory_hub.tokens["runtime"], id=revoked["id"]
    )
    assert status == 200, body
    for token in [memory_hub.tokens["alice-expired-agent"], revoked["token"]]:
        async with mcp_session(mcp_log, memory_hub.hub.url, token, binding) as s:
            refused = await error(s, "amux.memory_search", query="anything")
        assert refused["code"] == "unauthenticated"


async def test_memory_disabled_answers_every_tool_with_a_clear_error(
    tmp_path: Path, mcp_log: Path
) -> None:
    calls = [
        ("amux.memory_search", {"query": "x"}),
        ("amux.memory_get", {"path": "MEMORY.md"}),
        ("amux.memory_upsert", {"path": "a.md", "content": "x", "expected_revision": "absent"}),
        ("amux.memory_forget", {"path": "a.md", "expected_revision": "absent"}),
    ]
    world = seeded_hub(tmp_path / "amux-home", enabled=False)
    world.hub.start()
    try:
        async with mcp_session(mcp_log, world.hub.url, world.tokens["alice"]) as s:
            assert {t.name for t in (await s.list_tools()).tools} == set(TOOLS)
            for tool, arguments in calls:
                refused = await error(s, tool, **arguments)
                assert refused["code"] == "memory_disabled", tool
                assert "disabled on this Hub" in refused["message"]
    finally:
        world.hub.stop()


async def test_a_hub_that_is_down_gives_a_quick_clear_error_and_later_calls_reach_it_again(
    tmp_path: Path, mcp_log: Path
) -> None:
    world = seeded_hub(tmp_path / "amux-home", isolation=False)
    hub = world.hub
    async with mcp_session(mcp_log, hub.url, world.tokens["alice"]) as s:
        assert {t.name for t in (await s.list_tools()).tools} == set(TOOLS)
        started = time.monotonic()
        down = await error(s, "amux.memory_search", query="anything")
        assert time.monotonic() - started < 5.0
        assert down["code"] == "unavailable"
        assert f"cannot reach the Hub at {hub.url}" in down["message"]

        # The start-up check failing is not final: the Hub coming up serves the next call.
        hub.start()
        try:
            found = await ok(s, "amux.memory_search", query="anything")
        finally:
            hub.stop()
    assert found["matches"] == []


@pytest.fixture
def stalled_hub() -> Iterator[str]:
    """A port that accepts connections (kernel backlog) but never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


async def test_a_stalled_hub_is_cut_off_at_the_call_timeout(
    stalled_hub: str, mcp_log: Path
) -> None:
    async with mcp_session(mcp_log, stalled_hub, "amux_any", AMUX_TIMEOUT="1.5") as s:
        started = time.monotonic()
        stalled = await error(s, "amux.memory_get", path="MEMORY.md")
        elapsed = time.monotonic() - started
    assert stalled["code"] == "unavailable"
    assert "did not answer within 1.5 s" in stalled["message"]
    assert elapsed < 4.0


@pytest.mark.parametrize(
    ("hub_url", "extra", "code", "says"),
    [
        ("http://127.0.0.1:9", {"AMUX_TIMEOUT": "soon"}, "invalid_argument", "AMUX_TIMEOUT"),
        ("no-scheme-or-host", {}, "invalid_argument", "AMUX_HUB_URL: must be an http(s) URL"),
    ],
)
async def test_broken_settings_still_start_the_server_and_every_tool_says_what_is_wrong(
    mcp_log: Path, hub_url: str, extra: dict[str, str], code: str, says: str
) -> None:
    secret = "amux_do-not-print-me"
    async with mcp_session(mcp_log, hub_url, secret, **extra) as s:
        assert {t.name for t in (await s.list_tools()).tools} == set(TOOLS)
        refused = await error(s, "amux.memory_get", path="MEMORY.md")
    assert refused["code"] == code
    assert says in refused["message"]
    assert secret not in refused["message"] and secret not in logged(mcp_log)


async def test_the_amux_mcp_command_serves_the_same_tools(
    memory_hub: MemoryHub, mcp_log: Path
) -> None:
    token = memory_hub.tokens["alice"]
    async with mcp_session(mcp_log, memory_hub.hub.url, token, command=[AMUX, "mcp"]) as s:
        assert {t.name for t in (await s.list_tools()).tools} == set(TOOLS)
        read = await ok(s, "amux.memory_get", path="MEMORY.md")
    assert read["exists"] is False


def test_a_client_that_closes_its_pipes_ends_the_server_quietly(
    memory_hub: MemoryHub, tmp_path: Path
) -> None:
    home = tmp_path / "agent-home"
    home.mkdir()
    env = {
        "AMUX_HUB_URL": memory_hub.hub.url,
        "AMUX_TOKEN": memory_hub.tokens["alice"],
        "AMUX_HOME": str(home),
    }
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "gone", "version": "1"},
        },
    }
    log = tmp_path / "stderr.log"
    with log.open("wb") as errlog:
        server = subprocess.Popen(
            MODULE_COMMAND,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            env=env,
            cwd=REPO,
        )
        assert server.stdin is not None and server.stdout is not None
        # The client is gone before the reply to its request: nobody reads it any more.
        server.stdout.close()
        server.stdin.write(json.dumps(initialize).encode() + b"\n")
        server.stdin.close()
        status = server.wait(30)
    text = log.read_text()
    assert status == 0, text
    assert "Traceback" not in text and "ERROR" not in text, text
