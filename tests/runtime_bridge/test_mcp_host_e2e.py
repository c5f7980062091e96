"""The worker's warm MCP host, tried as an attacker would, through a real `amux serve` as root.

The Agent is a stand-in for Claude (``tests/fakes/mcp_flood_agent.py``) launched in its sandbox
with memory on, so its MCP config names the host's socket, bound into the sandbox. It connects
to that socket hundreds of times: the host's children must stay few, and be the launch's, held
by its bounds and ended with it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from runtime_bridge.mcp_host import CONNECTIONS_PER_LAUNCH
from tests.conftest import (
    MEMORY_ISOLATED,
    HubProcess,
    free_port,
    parent_of,
    processes_tagged,
    save_settings,
    stand_in,
    until,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="what a root worker's Agents run as"),
]

FLOOD_AGENT = "mcp_flood_agent.py"
TASKS_MAX = 64
CGROUPS = Path("/sys/fs/cgroup")


def host_children() -> list[int]:
    """The live children of every warm MCP host on this machine whose host is this test's."""
    hosts = processes_tagged("runtime_bridge.mcp_host")
    children: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and parent_of(int(entry.name)) in hosts:
            children.append(int(entry.name))
    return children


def host_socket(pid: int) -> Path:
    """The socket the host ``pid`` listens on (its last argument)."""
    return Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2].decode())


def bounding_groups(pid: int) -> set[str]:
    """The groups that bound ``pid``'s memory and tasks (v1: one per hierarchy; v2: one)."""
    v1, v2 = set(), set()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if {"memory", "pids"} & set(controllers.split(",")):
            v1.add(path)
        elif line.startswith("0::"):
            v2.add(path)
    # A v1 host's unified hierarchy (0::) holds no controller.
    return v1 or v2


def launch_tasks(execution_id: str) -> int:
    """The tasks the launch's group counts (v2, else the v1 pids hierarchy)."""
    for group in (CGROUPS / "amux" / execution_id, CGROUPS / "pids" / "amux" / execution_id):
        if (group / "pids.current").exists():
            return int((group / "pids.current").read_text())
    raise AssertionError(f"no group of launch {execution_id}")


async def test_an_agent_connecting_300_times_to_the_mcp_host_gets_a_few_servers_in_its_bounds(
    tmp_path: Path,
) -> None:
    save_settings(tmp_path / "amux-home", MEMORY_ISOLATED)
    hub = HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={
            "AMUX_RUNTIME_CLAUDE": str(stand_in(FLOOD_AGENT)),
            "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
            "AMUX_RUNTIME_TASKS_MAX": str(TASKS_MAX),
        },
    )
    hub.start()
    try:
        # The host is the worker's child; the worker is a child of `amux serve`.
        host = await until(lambda: [p for p in processes_tagged("runtime_bridge.mcp_host")
                                    if parent_of(p) in hub.worker_pids()], 30)  # fmt: skip
        # The host is warm before the turn (it listens): the launch gets the shim.
        await until(lambda: host_socket(host[0]).exists(), 30)
        status, submitted = await asyncio.to_thread(
            hub.rpc, "executions.submit", provider="claude", prompt="mcpflood 300\n"
        )
        assert status == 200, submitted
        execution_id = submitted["execution"]["id"]
        workspaces = tmp_path / "runtime" / "workspaces"
        marker = await until(
            lambda: next(iter(workspaces.glob("*/flooded")), None) or finished(hub, execution_id),
            60,
        )
        assert isinstance(marker, Path), (marker.get("error"), marker.get("result"))
        children = [p for p in host_children() if parent_of(p) in host]
        groups = set().union(*(bounding_groups(pid) for pid in children))
        tasks = launch_tasks(execution_id)
        marker.with_name("release").touch()
        described = await until(lambda: finished(hub, execution_id), 60, 0.2)
        # The launch's end ends its servers too.
        await until(lambda: not [p for p in host_children() if parent_of(p) in host], 10)
    finally:
        await asyncio.to_thread(hub.stop)
    assert 0 < len(children) <= CONNECTIONS_PER_LAUNCH, len(children)
    assert groups == {f"/amux/{execution_id}"}, groups
    assert tasks <= TASKS_MAX
    assert described["state"] == "succeeded", described
    held = int(str(described["result"]["text"]).split()[1])
    assert held <= CONNECTIONS_PER_LAUNCH, described["result"]
    refusals = [line for line in hub.log().splitlines() if "warm MCP host" in line]
    assert len(refusals) == 1, refusals


def finished(hub: HubProcess, execution_id: str) -> dict[str, object] | None:
    status, described = hub.rpc("executions.watch", execution_id=execution_id, after=0)
    assert status == 200, described
    return dict(described) if described["state"] in ("succeeded", "failed") else None
