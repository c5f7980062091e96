"""Managed Pi turns end to end: `amux agent run` → Hub → in-process worker → real `pi`.

Pi has no MCP: the scripted model has Pi's bash tool run `amux memory upsert …`, which finds the
per-run wrapper the worker materialised first on PATH, so a document appearing in the Hub proves
the wrapper, its connection config and the delegated credential all worked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from runtime_bridge.launch_env import DEFAULT_PASS_ENV
from runtime_bridge.memoryprotocol import protocol_text
from tests.conftest import MEMORY_ISOLATED, MEMORY_ON, HubProcess
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import find_agent_cli, serve_agents
from tests.runtime_bridge.test_providers_pi import pi_agent_source
from tests.runtime_bridge.test_worker import agent_run, cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PI_ARGS = ["--provider", "fake", "--model", "fake-model"]


def pi_env(tmp_path: Path, model: FakeModelServer) -> dict[str, str]:
    """What a Hub or a worker needs to launch the pinned Pi offline against ``model``."""
    return {
        "PI_OFFLINE": "1",
        "AMUX_RUNTIME_PI": find_agent_cli("pi"),
        "AMUX_RUNTIME_PI_ARGS": json.dumps(PI_ARGS),
        "AMUX_RUNTIME_PI_AGENT_DIR": str(pi_agent_source(tmp_path, model)),
        "AMUX_RUNTIME_PASS_ENV": json.dumps([*DEFAULT_PASS_ENV, "PI_OFFLINE"]),
    }


def start_pi_hub(
    tmp_path: Path,
    model: FakeModelServer,
    *,
    settings: Mapping[str, Any] | None = None,
    **env: str,
) -> HubProcess:
    """`amux serve` whose in-process worker launches the pinned Pi against the fake model."""
    pi = {**pi_env(tmp_path, model), "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime")}
    return serve_agents(tmp_path, {**pi, **env}, settings)


def upsert_by_bash(path: str, content: str) -> CallTool:
    """The model asks Pi's bash tool to create a document with the amux CLI."""
    quoted = content.replace("'", "'\\''")
    return CallTool(
        "bash",
        {
            "command": f"printf '%s' '{quoted}' | "
            f"amux memory upsert {path} --expected-revision absent"
        },
    )


def tool_outputs(model: FakeModelServer) -> str:
    return "\n".join(text for _, text in model.tool_results)


async def test_a_bound_pi_turn_saves_memory_through_the_cli_and_resumes_with_its_binding(
    tmp_path: Path,
) -> None:
    content = "# Build\nrun make check before pushing\n"
    script: list[Step] = [
        upsert_by_bash("topics/build.md", content),
        Answer("Saved to topics/build.md."),
    ]
    async with FakeModelServer(script) as model:
        hub = start_pi_hub(tmp_path, model, settings=MEMORY_ON)
        try:
            first = await agent_run(hub, "--provider", "pi", "Remember how we build")
            assert first["state"] == "succeeded", (first, tool_outputs(model))
            assert first["text"] == "Saved to topics/build.md."
            assert first["binding"] == "global"
            assert first["warnings"] == []

            shown = (await cli(hub, "memory", "show", "--json", "topics/build.md")).json()
            assert shown["content"] == content
            assert (hub.home / "memory" / "global" / "topics" / "build.md").read_text() == content
            # The CLI answered the bash tool with the new revision.
            assert shown["revision"] in tool_outputs(model)
            # The change log names the turn, and that Pi's save came through the amux CLI.
            logged = (await cli(hub, "memory", "history", "--json", "topics/build.md")).json()
            [saved] = logged["entries"]
            assert (saved["via"], saved["session_id"], saved["execution_id"]) == (
                "cli",
                first["session_id"],
                first["execution_id"],
            )

            request = model.main_requests[0]
            assert protocol_text("cli").strip() in request.system_text
            assert "amux.memory_upsert" not in request.system_text

            model.add_steps([Answer("Still here.")])
            second = await agent_run(
                hub, "--provider", "pi", "--session", first["session_id"], "Anything else?"
            )
            assert second["state"] == "succeeded", second
            assert second["session_id"] == first["session_id"]
            assert second["binding"] == "global"
            last = model.main_requests[-1]
            # The native session was resumed: the first turn is in the conversation.
            assert "Remember how we build" in json.dumps(last.body["messages"])
            assert protocol_text("cli").strip() in last.system_text
            # The per-run wrapper and its credential went away with the run.
            assert not list((tmp_path / "runtime" / "runs").glob("*/agent-config"))
        finally:
            hub.stop()


async def test_with_isolation_on_pi_writes_into_the_principals_own_directory(
    tmp_path: Path,
) -> None:
    content = "# Private\nonly mine\n"
    script: list[Step] = [
        upsert_by_bash("topics/private.md", content),
        Answer("Saved privately."),
    ]
    async with FakeModelServer(script) as model:
        hub = start_pi_hub(tmp_path, model, settings=MEMORY_ISOLATED)
        try:
            done = await agent_run(hub, "--provider", "pi", "Remember this privately")
            assert done["state"] == "succeeded", (done, tool_outputs(model))
            principal_id = (await cli(hub, "system", "whoami", "--json")).json()["principal"]["id"]
            assert done["binding"] == f"principal:{principal_id}"

            digest = hashlib.sha256(principal_id.encode("utf-8")).hexdigest()
            private = hub.home / "memory" / "users" / digest / "topics" / "private.md"
            assert private.read_text() == content
            assert not (hub.home / "memory" / "global" / "topics" / "private.md").exists()
            shown: dict[str, Any] = (
                await cli(hub, "memory", "show", "--json", "topics/private.md")
            ).json()
            assert shown["content"] == content
        finally:
            hub.stop()
