"""Managed Codex turns end to end: `amux agent run` → Hub → in-process worker → `codex app-server`.

The scripted model calls the memory tool through Codex's MCP client, which starts the real
`amux mcp` with the delegated credential and binding; the document appearing in the Hub proves
the chain. Codex reads its model provider from the operator's config.toml, provisioned into each
launch's own CODEX_HOME.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from runtime_bridge.memoryprotocol import protocol_text
from tests.conftest import MEMORY_ON, HubProcess
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import find_agent_cli, serve_agents
from tests.runtime_bridge.test_providers_codex import codex_config
from tests.runtime_bridge.test_worker import agent_run, cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def start_codex_hub(
    tmp_path: Path,
    model: FakeModelServer,
    *,
    settings: Mapping[str, Any] | None = None,
    **env: str,
) -> HubProcess:
    """`amux serve` whose in-process worker launches the pinned Codex against the fake model."""
    codex = {
        "OPENAI_API_KEY": "sk-openai-test",
        "AMUX_RUNTIME_CODEX": find_agent_cli("codex"),
        "AMUX_RUNTIME_CODEX_CONFIG": str(codex_config(tmp_path, model)),
        "AMUX_RUNTIME_DEVELOPER_INSTRUCTIONS": "Answer briefly.",
        "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
    }
    return serve_agents(tmp_path, {**codex, **env}, settings)


async def test_a_bound_codex_turn_saves_memory_over_mcp_and_resumes_with_its_binding(
    tmp_path: Path,
) -> None:
    content = "# Deploys\nfreeze on Fridays\n"
    script: list[Step] = [
        CallTool(
            "mcp__memory__amux_memory_upsert",
            {"path": "topics/deploys.md", "content": content, "expected_revision": "absent"},
        ),
        Answer("Saved to topics/deploys.md."),
    ]
    async with FakeModelServer(script) as model:
        hub = start_codex_hub(tmp_path, model, settings=MEMORY_ON)
        try:
            first = await agent_run(hub, "--provider", "codex", "Remember our deploy rule")
            assert first["state"] == "succeeded", (first, model.tool_results)
            assert first["text"] == "Saved to topics/deploys.md."
            assert first["binding"] == "global"
            assert first["warnings"] == []

            shown = (await cli(hub, "memory", "show", "--json", "topics/deploys.md")).json()
            assert shown["content"] == content
            assert (hub.home / "memory" / "global" / "topics" / "deploys.md").is_file()

            request = model.main_requests[0]
            developer = request.role_text("developer")
            assert protocol_text("mcp").strip() in developer
            assert "Answer briefly." in developer
            assert "mcp__memory__amux_memory_upsert" in request.tool_names
            assert shown["revision"] in model.tool_results[0][1]

            model.add_steps([Answer("Still here.")])
            second = await agent_run(
                hub, "--provider", "codex", "--session", first["session_id"], "Anything else?"
            )
            assert second["state"] == "succeeded", second
            assert second["session_id"] == first["session_id"]
            assert second["binding"] == "global"
            last = model.main_requests[-1]
            # The native thread was resumed: the first turn is in the conversation.
            assert "Remember our deploy rule" in json.dumps(last.body["input"])
            assert protocol_text("mcp").strip() in last.role_text("developer")
        finally:
            hub.stop()


def migrated_at(codex_home: Path) -> datetime:
    """When Codex's state database in ``codex_home`` had its first migration applied (UTC)."""
    (database,) = sorted(codex_home.glob("state_*.sqlite"))
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        (first,) = connection.execute("SELECT MIN(installed_on) FROM _sqlx_migrations").fetchone()
    connection.close()
    return datetime.fromisoformat(str(first)).replace(tzinfo=UTC)


def seed_made(seed: Path) -> bool:
    """Codex's databases made ahead and checkpointed (no write-ahead log left)."""
    return any(seed.glob("*.sqlite")) and not any(seed.glob("*.sqlite-wal"))


async def test_a_later_new_codex_conversation_starts_with_databases_made_before_its_turn(
    tmp_path: Path,
) -> None:
    async with FakeModelServer([Answer("One."), Answer("Two.")]) as model:
        hub = start_codex_hub(tmp_path, model)
        try:
            first = await agent_run(hub, "--provider", "codex", "First conversation")
            assert first["state"] == "succeeded", first
            seed = tmp_path / "runtime" / "codex-seed" / "home"
            deadline = time.monotonic() + 60
            while not seed_made(seed):
                assert time.monotonic() < deadline, "the worker made no Codex databases"
                await asyncio.sleep(0.05)

            second = await agent_run(hub, "--provider", "codex", "Second conversation")
            assert second["state"] == "succeeded", second
            assert second["text"] == "Two."
            assert second["session_id"] != first["session_id"]
            home = tmp_path / "runtime" / "sessions" / second["session_id"] / "codex-home"
            # Made ahead: Codex did not spend the new conversation's first turn making them.
            assert migrated_at(home) == migrated_at(seed)
        finally:
            hub.stop()
