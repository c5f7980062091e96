"""A worker's slots: several turns run at once, each claimed, kept and ended on its own.

The whole service in-process with its in-process worker (two slots); the Agent is the stand-in
``tests/fakes/turn_agent.sh``, which notes when its turn starts and waits for a gate file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.service.app import create_app
from hub.config import HubSettings
from hub.rpc import HUB
from hub.services import Hub
from runtime_bridge.config import RuntimeSettings, default_slots
from tests.conftest import free_port, stand_in, until

pytestmark = pytest.mark.timeout(120)

TURN_AGENT = "turn_agent.sh"


@dataclass
class Service:
    hub: Hub
    log: Path

    async def submit(self, label: str) -> str:
        owner = self.hub.state.owner()
        assert owner is not None
        execution, _ = await self.hub.executions.submit(
            principal_id=owner.id,
            submitted_by=owner.id,
            provider="turn",
            prompt=f"turn {self.log} {label}",
        )
        return execution.id

    def started(self) -> list[str]:
        return self.log.read_text().split()

    def open_gate(self, label: str) -> None:
        self.log.with_name(f"{self.log.name}.{label}").touch()

    def state(self, execution_id: str) -> str:
        return self.hub.executions.describe(execution_id).state


@asynccontextmanager
async def serving(tmp_path: Path, shared_dir: Path, slots: int) -> AsyncIterator[Service]:
    # Writable by all: a root worker runs each Principal's Agents as a uid of its own.
    log = shared_dir / "started"
    log.touch()
    log.chmod(0o666)
    runtime = RuntimeSettings(
        slots=slots,
        providers={"turn": str(stand_in(TURN_AGENT))},
        sandbox="off",
        work_dir=tmp_path / "runtime",
    )
    port = free_port()
    app = create_app(
        # Short leases: a slot hears of a cancel at its next heartbeat (a third of the lease).
        HubSettings(home=tmp_path / "amux-home", lease_seconds=3),
        runtime_settings=runtime,
        worker_url=f"http://127.0.0.1:{port}",
    )
    async with TestClient(TestServer(app, host="127.0.0.1", port=port)):
        yield Service(app[HUB], log)


async def test_two_slots_run_two_turns_at_once_and_a_cancel_stops_only_its_own(
    tmp_path: Path, shared_dir: Path
) -> None:
    async with serving(tmp_path, shared_dir, slots=2) as service:
        first, second, third = [await service.submit(label) for label in ("a", "b", "c")]
        await until(lambda: len(service.started()) == 2)
        assert sorted(service.started()) == ["a", "b"]
        assert service.state(third) == "queued"

        await service.hub.executions.cancel(second)
        await until(lambda: service.state(second) == "cancelled")
        # The freed slot takes the next turn; the other slot's turn runs on untouched.
        await until(lambda: "c" in service.started())
        assert service.state(first) == "running"

        service.open_gate("a")
        await until(lambda: service.state(first) == "succeeded")
        service.open_gate("c")
        await until(lambda: service.state(third) == "succeeded")
        result = service.hub.executions.describe(third).result
        assert result is not None and result.text == "done c"
        assert sorted(service.started()) == ["a", "b", "c"]


async def test_one_slot_runs_one_turn_at_a_time(tmp_path: Path, shared_dir: Path) -> None:
    async with serving(tmp_path, shared_dir, slots=1) as service:
        first, second = [await service.submit(label) for label in ("a", "b")]
        await until(lambda: service.started() == ["a"])
        assert service.state(second) == "queued"
        service.open_gate("a")
        await until(lambda: service.started() == ["a", "b"])
        assert service.state(first) == "succeeded"
        service.open_gate("b")
        await until(lambda: service.state(second) == "succeeded")


def test_unset_slots_follow_the_cpus_within_two_and_eight() -> None:
    assert [default_slots(cpus) for cpus in (1, 2, 4, 8, 64)] == [2, 2, 4, 8, 8]
    assert RuntimeSettings(slots=3).slot_count() == 3
    with pytest.raises(ValueError):
        RuntimeSettings(slots=0)
