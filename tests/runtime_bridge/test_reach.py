"""An Agent CLI its uid cannot reach is named with the directory to fix, before the launch.

The whole service in-process with its in-process worker, as root: each Principal's Agents run as
an unprivileged uid of their own. The provider is a declared stand-in script installed under a
directory closed to others (0700), as an installation under ``/root`` or a ``mktemp -d`` is.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.service.app import create_app
from hub.config import HubSettings
from hub.rpc import HUB
from hub.services import Hub
from runtime_bridge.config import RuntimeSettings
from tests.conftest import free_port, until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="a root worker runs Agents as other uids"),
]

AGENT = "#!/bin/sh\necho answered\n"


def install(directory: Path) -> Path:
    directory.mkdir(parents=True, mode=0o755)
    agent = directory / "agent.sh"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    return agent


@asynccontextmanager
async def serving(tmp_path: Path, agent: Path, sandbox: str) -> AsyncIterator[Hub]:
    runtime = RuntimeSettings(
        providers={"stand-in": str(agent)}, sandbox=sandbox, work_dir=tmp_path / "runtime"
    )
    port = free_port()
    app = create_app(
        HubSettings(home=tmp_path / "amux-home"),
        runtime_settings=runtime,
        worker_url=f"http://127.0.0.1:{port}",
    )
    async with TestClient(TestServer(app, host="127.0.0.1", port=port)):
        yield app[HUB]


async def turn(hub: Hub) -> tuple[str, str | None, str | None]:
    """One turn of the owner's on the stand-in: its state, error and answer."""
    owner = hub.state.owner()
    assert owner is not None
    execution, _ = await hub.executions.submit(
        principal_id=owner.id, submitted_by=owner.id, provider="stand-in", prompt="hi"
    )
    await until(lambda: hub.executions.describe(execution.id).finished, seconds=60)
    done = hub.executions.describe(execution.id)
    return done.state, done.error, done.result.text if done.result is not None else None


async def test_an_agent_cli_under_a_closed_directory_is_refused_naming_it_without_the_sandbox(
    tmp_path: Path, shared_dir: Path
) -> None:
    closed = shared_dir / "closed"
    agent = install(closed / "bin")
    closed.chmod(0o700)
    async with serving(tmp_path, agent, "off") as hub:
        state, error, _ = await turn(hub)
        assert state == "failed"
        assert error is not None
        assert f"the stand-in executable {agent} cannot be run by the Agent's user" in error
        assert f"{closed} is not searchable by others" in error
        assert f"make it traversable (chmod o+x {closed}) or install the CLI elsewhere" in error
        assert "Permission denied" not in error

        closed.chmod(0o711)
        again = await turn(hub)
        assert again == ("succeeded", None, "answered"), again


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed")
async def test_in_the_sandbox_only_a_closed_directory_inside_the_installation_stops_the_agent(
    tmp_path: Path, shared_dir: Path
) -> None:
    # Above what the sandbox binds, bwrap makes the directories itself: a closed one there
    # stops nothing. The bound directory keeps its own permissions.
    above = shared_dir / "above"
    agent = install(above / "tool" / "bin")
    above.chmod(0o700)
    inside = agent.parent
    inside.chmod(0o700)
    async with serving(tmp_path, agent, "bwrap") as hub:
        state, error, _ = await turn(hub)
        assert state == "failed"
        assert error is not None
        assert f"{inside} is not searchable by others" in error, error
        assert "Permission denied" not in error

        inside.chmod(0o755)
        again = await turn(hub)
        assert again == ("succeeded", None, "answered"), again
