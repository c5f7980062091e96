"""`amux serve` runs its local worker as a process of its own, through the real command.

The worker launches each turn's Agent (a stand-in shell declared as a provider), so the Agent's
processes descend from the worker's process, never from the Hub's. The worker holds its own
credential and none of the bot's secrets; it is started again if it dies, and ends with the Hub
however the Hub ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    AMUX,
    HubProcess,
    free_port,
    parent_of,
    processes_tagged,
    stand_in,
    until,
)
from tests.runtime_bridge.test_workers_remote import alive

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
]

PROBE = "probe_agent.sh"
MCP_HOST = "runtime_bridge.mcp_host"
BOT_SECRET = "feishu-app-secret-" + uuid.uuid4().hex
OWNER_TOKEN = "amux_owner_" + uuid.uuid4().hex


def start(tmp_path: Path) -> HubProcess:
    hub = HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={
            "AMUX_RUNTIME_PROVIDERS": json.dumps({"probe": str(stand_in(PROBE))}),
            "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
            # Without an app id the bot stays off; the secret is still in the Hub's environment.
            "AMUX_FEISHU_APP_SECRET": BOT_SECRET,
            "AMUX_TOKEN": OWNER_TOKEN,
        },
    )
    hub.start()
    return hub


def ancestors(pid: int) -> list[int]:
    found = []
    parent = parent_of(pid)
    while parent is not None and parent > 1:
        found.append(parent)
        parent = parent_of(parent)
    return found


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in raw if b"=" in entry)


def command_line(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def finished(hub: HubProcess, execution_id: str) -> dict[str, Any] | None:
    status, described = hub.rpc("executions.watch", execution_id=execution_id, after=0)
    assert status == 200, described
    return dict(described) if described["state"] in ("succeeded", "failed") else None


async def held_turn(hub: HubProcess, tmp_path: Path) -> tuple[str, Path]:
    """A turn whose Agent has started and waits for its ``release`` file."""
    nonce = uuid.uuid4().hex
    status, submitted = await asyncio.to_thread(
        hub.rpc,
        "executions.submit",
        provider="probe",
        prompt=f"nonce {nonce}\nwrite holding\nhold\n",
    )
    assert status == 200, submitted
    workspaces = tmp_path / "runtime" / "workspaces"
    marker = await until(lambda: next(iter(workspaces.glob("*/holding")), None), 60)
    return submitted["execution"]["id"], marker


def agent_processes(marker: Path) -> list[int]:
    """The processes whose working directory is the held turn's workspace: its Agent."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == marker.parent:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_a_turns_agent_runs_under_the_workers_own_process_which_holds_no_bot_secret(
    tmp_path: Path,
) -> None:
    hub = start(tmp_path)
    try:
        workers = await until(hub.worker_pids, 30)
        execution_id, marker = await held_turn(hub, tmp_path)
        agents = await until(lambda: agent_processes(marker), 10)
        lineages = [ancestors(pid) for pid in agents]
        worker_env = environ(workers[0])
        worker_argv = command_line(workers[0])
        marker.with_name("release").touch()
        described = await until(lambda: finished(hub, execution_id), 60, 0.2)
    finally:
        await asyncio.to_thread(hub.stop)
    assert len(workers) == 1
    assert all(workers[0] in lineage for lineage in lineages), (workers, lineages)
    assert all(lineage.index(workers[0]) < lineage.index(hub.proc.pid) for lineage in lineages)
    assert described["state"] == "succeeded", described
    assert "held" in str(described["result"]["text"])
    assert "AMUX_FEISHU_APP_SECRET" not in worker_env and "AMUX_TOKEN" not in worker_env
    assert not any(BOT_SECRET in value or OWNER_TOKEN in value for value in worker_env.values())
    # Its credential came over a pipe: its command line names only the module.
    assert worker_argv[1:3] == [b"-m", b"bot.service.worker_process"], worker_argv


async def test_a_worker_that_dies_is_started_again_leaving_nothing_and_the_next_turn_runs(
    tmp_path: Path,
) -> None:
    hub = start(tmp_path)
    try:
        first = (await until(hub.worker_pids, 30))[0]
        # Its warm MCP host, listening in a private directory of the temporary directory.
        host = await until(lambda: [p for p in processes_tagged(MCP_HOST) if parent_of(p) == first])
        socket_path = Path(command_line(host[0])[-2].decode())
        await until(socket_path.exists, 30)
        os.kill(first, signal.SIGKILL)
        second = await until(lambda: [p for p in hub.worker_pids() if p != first], 30)
        # Killed outright, the worker removes nothing; its host, ended by its death signal, does.
        await until(lambda: not socket_path.parent.exists(), 15)
        execution_id, marker = await held_turn(hub, tmp_path)
        marker.with_name("release").touch()
        described = await until(lambda: finished(hub, execution_id), 60, 0.2)
    finally:
        await asyncio.to_thread(hub.stop)
    assert described["state"] == "succeeded", described
    assert len(second) == 1
    assert "the local worker ended (exit status -9)" in hub.log()


async def test_the_worker_and_its_agent_end_when_the_hub_is_killed(tmp_path: Path) -> None:
    hub = start(tmp_path)
    try:
        worker = (await until(hub.worker_pids, 30))[0]
        _, marker = await held_turn(hub, tmp_path)
        agents = await until(lambda: agent_processes(marker), 10)
        assert hub.proc is not None
        hub.proc.kill()
        await asyncio.to_thread(hub.proc.wait, 15)
        await until(lambda: not alive(worker), 15)
        await until(lambda: not any(alive(pid) for pid in agents), 15)
    finally:
        await asyncio.to_thread(hub.stop)


async def test_stopping_the_hub_stops_its_worker(tmp_path: Path) -> None:
    hub = start(tmp_path)
    worker = (await until(hub.worker_pids, 30))[0]
    await asyncio.to_thread(hub.stop)
    assert hub.proc is not None and hub.proc.returncode == 0, hub.log()
    assert not alive(worker)
    assert "did not stop" not in hub.log()


def test_a_worker_setting_it_refuses_stops_the_hubs_start_with_its_reason(tmp_path: Path) -> None:
    hub = HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={
            "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
            "AMUX_RUNTIME_RUN_AS": "no-such-user-here",
        },
    )
    done = subprocess.run(
        [AMUX, "serve", "--port", str(hub.port)],
        env=hub.env(),
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "error: invalid_argument: AMUX_RUNTIME_RUN_AS names no local user: no-such-user-here"
    ), done.stderr
    assert "Traceback" not in done.stderr
    assert not hub.healthy()
