"""A worker starts and stops each turn's Agent through the launcher it was given: where an
Agent's process runs is one seam, whatever the provider."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.service.app import create_app
from hub.client import HubClient
from hub.config import HubSettings
from hub.rpc import HUB
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.providers import LOCAL, LaunchPlan
from runtime_bridge.worker import Worker
from tests.conftest import free_port, until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CAT = shutil.which("cat") or "/bin/cat"


class NotingLauncher:
    """This host's launcher, noting each process it starts and stops."""

    def __init__(self) -> None:
        self.started: list[tuple[Path, list[str]]] = []
        self.stopped: list[int] = []

    async def start(self, plan: LaunchPlan, argv: list[str]) -> asyncio.subprocess.Process:
        self.started.append((plan.cwd, argv))
        return await LOCAL.start(plan, argv)

    async def stop(self, process: asyncio.subprocess.Process) -> None:
        self.stopped.append(process.pid)
        await LOCAL.stop(process)

    async def reclaim(self) -> None:
        await LOCAL.reclaim()


async def test_a_workers_turn_runs_its_agent_through_the_launcher_it_was_given(
    tmp_path: Path,
) -> None:
    home = tmp_path / "amux-home"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # A generic Agent whose answer is its prompt; the Hub runs no worker of its own.
    app = create_app(HubSettings(home=home), RuntimeSettings(providers={"echo": CAT}))
    async with TestClient(TestServer(app, host="127.0.0.1", port=port)):
        hub = app[HUB]
        owner = hub.state.owner()
        assert owner is not None
        service = hub.state.add_principal("host-a", "service")
        token, _ = hub.state.issue_credential(service.id, "cli", label="host-a")
        settings = RuntimeSettings(
            name="host-a", slots=1, providers={"echo": CAT}, work_dir=tmp_path / "host-a"
        )
        launcher = NotingLauncher()
        client = HubClient(url, token, timeout=60)
        worker = Worker(client, url, settings, tmp_path / "host-a", launcher=launcher)
        stop = asyncio.Event()
        serving = asyncio.create_task(worker.run_forever(stop))
        try:
            execution, _ = await hub.executions.submit(
                principal_id=owner.id, submitted_by=owner.id, provider="echo", prompt="hello"
            )
            await until(lambda: hub.executions.describe(execution.id).finished, seconds=60)
            done = hub.executions.describe(execution.id)
            assert done.state == "succeeded", done.error
            assert done.result is not None and done.result.text == "hello"
            ((cwd, argv),) = launcher.started
            assert argv[0] == CAT
            assert cwd.is_relative_to(tmp_path / "host-a")
            assert len(launcher.stopped) == 1
        finally:
            stop.set()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            await client.close()
