"""Remote Runtime workers: `amux runtime worker` processes beside an `amux serve` without its own.

Workers are real processes with a service credential. Killing one mid-turn (SIGKILL: no chance to
clean up) must end in a retry on another worker or a visible failure once the retry is lost too;
a cancel from the Hub must stop the Agent's whole process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hub.executions import NO_WORKER
from tests.conftest import (
    AMUX,
    MEMORY_ON,
    HubProcess,
    processes_tagged,
    until,
)
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import serve_agents
from tests.runtime_bridge.test_worker import cli
from tests.runtime_bridge.test_worker_pi import pi_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# Short enough that a lost worker is noticed quickly, long enough that a loaded machine's
# heart-beats (every third of it) still arrive in time.
LEASE_SECONDS = "4"


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie awaiting its reaper is not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0


def descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        pid = parent_of(pid)
        if pid == ancestor:
            return True
    return False


def command_line(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def children(pid: int) -> list[int]:
    """The live direct children of ``pid``."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


@dataclass
class WorkerProcess:
    """One `amux runtime worker` process and its log."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(15)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Cluster:
    """A Hub without an in-process worker, and the worker processes started against it."""

    hub: HubProcess
    tmp_path: Path
    token: str = ""
    workers: list[WorkerProcess] = field(default_factory=list)
    orphans: list[int] = field(default_factory=list)

    def start_worker(self, name: str, hub_url: str | None = None) -> WorkerProcess:
        """Start a worker with the service token and wait until it has registered."""
        if not self.token:
            add = self.hub.cli("principal", "add", "runtime-remote", "--service")
            assert add.returncode == 0, add.stderr
            issued = self.hub.cli("token", "issue", "runtime-remote")
            assert issued.returncode == 0, issued.stderr
            self.token = issued.stdout.strip()
        log = self.tmp_path / f"worker-{name}.log"
        env = self.hub.env(
            AMUX_TOKEN=self.token,
            AMUX_RUNTIME_NAME=name,
            AMUX_RUNTIME_WORK_DIR=str(self.tmp_path / f"runtime-{name}"),
        )
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [AMUX, "runtime", "worker", "--hub", hub_url or self.hub.url],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.tmp_path,
            )
        worker = WorkerProcess(name, proc, log)
        self.workers.append(worker)
        deadline = time.monotonic() + 60
        while f"worker {name} serving" not in worker.text():
            assert proc.poll() is None, worker.text()
            assert time.monotonic() < deadline, worker.text()
            time.sleep(0.05)
        return worker

    def running_on(self) -> tuple[WorkerProcess, int] | None:
        """The worker whose Agent is running now, and the Agent's pid (its sandbox).

        Every worker also keeps its warm MCP host as a child: that one is not an Agent.
        """
        for worker in self.workers:
            if worker.proc.poll() is None:
                for child in children(worker.proc.pid):
                    if b"runtime_bridge.mcp_host" not in command_line(child):
                        return worker, child
        return None

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        # An Agent whose worker was SIGKILLed lives on in its own process group.
        for pid in self.orphans:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.hub.stop()


@pytest.fixture
def cluster_for(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Start a Hub (Pi against ``model``, no in-process worker) on demand; closed at the end."""
    started: list[Cluster] = []

    def start(
        model: FakeModelServer, *, settings: Mapping[str, Any] | None = None, **env: str
    ) -> Cluster:
        remote = {"AMUX_RUNTIME_IN_PROCESS": "false", "AMUX_LEASE_SECONDS": LEASE_SECONDS}
        hub = serve_agents(tmp_path, {**pi_env(tmp_path, model), **remote, **env}, settings)
        cluster = Cluster(hub, tmp_path)
        started.append(cluster)
        return cluster

    try:
        yield start
    finally:
        for cluster in started:
            cluster.close()


async def submit(hub: HubProcess, prompt: str) -> str:
    status, body = await asyncio.to_thread(
        hub.rpc, "executions.submit", provider="pi", prompt=prompt
    )
    assert status == 200, body
    return str(body["execution"]["id"])


async def watch(hub: HubProcess, execution_id: str) -> dict[str, Any]:
    status, body = await asyncio.to_thread(
        hub.rpc, "executions.watch", execution_id=execution_id, after=0
    )
    assert status == 200, body
    return dict(body)


async def finished(hub: HubProcess, execution_id: str, within: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        described = await watch(hub, execution_id)
        if described["state"] in ("succeeded", "failed", "cancelled"):
            return described
        assert time.monotonic() < deadline, described
        await asyncio.sleep(0.1)


def requests_reach(model: FakeModelServer, count: int) -> Callable[[], bool]:
    return lambda: len(model.main_requests) >= count


def event_texts(described: dict[str, Any]) -> list[str]:
    return [str(e["text"]) for e in described["events"]]


async def test_a_remote_worker_runs_a_turn_for_the_hub(
    tmp_path: Path, cluster_for: Callable[..., Cluster]
) -> None:
    async with FakeModelServer([Answer("From afar.")]) as model:
        cluster = cluster_for(model)
        worker = await asyncio.to_thread(cluster.start_worker, "far")
        done = await cli(cluster.hub, "agent", "run", "--provider", "pi", "Hello", timeout=150)
        assert done.returncode == 0, (done.stderr, worker.text())
        assert done.stdout.strip() == "From afar."
        # SIGTERM ends an idle worker's long poll at once, not when the poll would time out.
        worker.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.proc.wait, 10) == 0


async def test_a_turn_whose_worker_is_killed_is_retried_on_another_worker(
    tmp_path: Path, cluster_for: Callable[..., Cluster]
) -> None:
    release = asyncio.Event()
    # The retry is a fresh launch of the same prompt, so either step may answer it.
    script: list[Step] = [Answer("Done after retry.", hold=release)] * 2
    async with FakeModelServer(script) as model:
        cluster = cluster_for(model, settings=MEMORY_ON)
        try:
            await asyncio.to_thread(cluster.start_worker, "a")
            await asyncio.to_thread(cluster.start_worker, "b")
            execution_id = await submit(cluster.hub, "Survive a crash")
            await until(requests_reach(model, 1))
            first, agent = await until(cluster.running_on)
            cluster.orphans.append(agent)
            first.kill()

            # The lease runs out, the Hub requeues the turn, and the other worker takes it.
            await until(requests_reach(model, 2))
            second, _ = await until(cluster.running_on)
            assert second is not first
            release.set()
            described = await finished(cluster.hub, execution_id)
        finally:
            release.set()
    assert described["state"] == "succeeded", described
    assert described["attempts"] == 2
    assert described["result"]["text"] == "Done after retry."
    assert "the worker running this turn was lost; retrying" in event_texts(described)
    # Each launch had its own Agent credential; the killed worker's was revoked by the Hub,
    # since its Agent could outlive it.
    listed = await cli(cluster.hub, "token", "list", "--json")
    delegated = [c for c in listed.json() if c["kind"] == "delegated"]
    assert len(delegated) == 2
    assert all(c["revoked"] for c in delegated)


async def test_a_turn_that_loses_its_retry_too_fails_visibly(
    tmp_path: Path, cluster_for: Callable[..., Cluster]
) -> None:
    release = asyncio.Event()
    script: list[Step] = [Answer("never", hold=release)] * 2
    async with FakeModelServer(script) as model:
        cluster = cluster_for(model)
        try:
            await asyncio.to_thread(cluster.start_worker, "a")
            await asyncio.to_thread(cluster.start_worker, "b")
            follower = asyncio.create_task(
                cli(cluster.hub, "agent", "run", "--provider", "pi", "Doomed", timeout=150)
            )
            for expected in (1, 2):
                await until(requests_reach(model, expected))
                worker, agent = await until(cluster.running_on)
                cluster.orphans.append(agent)
                worker.kill()
            done = await follower
        finally:
            release.set()
    assert done.returncode == 1
    assert "status: the worker running this turn was lost; retrying" in done.stderr
    assert "status: failed: the worker was lost" in done.stderr
    assert "error: failed: the worker running this turn stopped responding" in done.stderr
    assert "Traceback" not in done.stderr


async def test_cancelling_a_running_turn_stops_the_agents_process_group(
    tmp_path: Path, cluster_for: Callable[..., Cluster]
) -> None:
    tag = f"amux-cancel-{uuid.uuid4().hex}"
    # Pi's bash tool runs the command in a process group of its own, and this one starts a
    # detached process besides: the cancel must take all of it down.
    command = f"setsid sh -c 'sleep 600; :' {tag} & sleep 600 # {tag}"
    script: list[Step] = [CallTool("bash", {"command": command}), Answer("unreachable")]
    async with FakeModelServer(script) as model:
        cluster = cluster_for(model)
        # A command that changes nothing the policy knows of: run it without asking anyone.
        await asyncio.to_thread(cluster.hub.set_permissions, "auto")
        worker = await asyncio.to_thread(cluster.start_worker, "solo")
        execution_id = await submit(cluster.hub, "Run something long")
        started = await until(lambda: len(processes_tagged(tag)) >= 2 and processes_tagged(tag))
        assert all(descends_from(pid, worker.proc.pid) for pid in started)

        status, body = await asyncio.to_thread(
            cluster.hub.rpc, "executions.cancel", execution_id=execution_id
        )
        assert status == 200, body
        described = await finished(cluster.hub, execution_id)
        assert described["state"] == "cancelled", described
        await until(lambda: not processes_tagged(tag), seconds=20)
        assert len(model.main_requests) == 1
        # The worker lives on and takes the next turn.
        assert worker.proc.poll() is None
        again = await finished(cluster.hub, await submit(cluster.hub, "And now?"))
        assert again["state"] == "succeeded", again


async def test_a_turn_without_a_worker_says_so_and_runs_when_one_connects(
    tmp_path: Path, cluster_for: Callable[..., Cluster]
) -> None:
    release = asyncio.Event()
    script: list[Step] = [Answer("Finally.", hold=release)] * 2
    async with FakeModelServer(script) as model:
        cluster = cluster_for(model)
        try:
            execution_id = await submit(cluster.hub, "Anyone there?")
            waiting = await watch(cluster.hub, execution_id)
            assert waiting["state"] == "queued"
            assert event_texts(waiting) == [NO_WORKER]

            # A worker takes it, and is lost with no other worker around: the user hears both.
            await asyncio.to_thread(cluster.start_worker, "a")
            await until(requests_reach(model, 1))
            worker, agent = await until(cluster.running_on)
            cluster.orphans.append(agent)
            worker.kill()
            deadline = time.monotonic() + 60
            while (texts := event_texts(await watch(cluster.hub, execution_id))).count(
                NO_WORKER
            ) < 2:
                assert time.monotonic() < deadline, texts
                await asyncio.sleep(0.1)
            assert texts == [
                NO_WORKER,
                "the worker running this turn was lost; retrying",
                NO_WORKER,
            ]

            await asyncio.to_thread(cluster.start_worker, "b")
            await until(requests_reach(model, 2))
            release.set()
            described = await finished(cluster.hub, execution_id)
        finally:
            release.set()
    assert described["state"] == "succeeded", described
    assert described["result"]["text"] == "Finally."


async def test_an_agent_does_not_outlive_its_killed_worker(
    tmp_path: Path, cluster_for: Callable[..., Cluster]
) -> None:
    release = asyncio.Event()
    async with FakeModelServer([Answer("late", hold=release)]) as model:
        cluster = cluster_for(model)
        try:
            await asyncio.to_thread(cluster.start_worker, "doomed")
            await submit(cluster.hub, "Outlive me")
            await until(requests_reach(model, 1))
            worker, agent = await until(cluster.running_on)
            cluster.orphans.append(agent)
            worker.kill()
            await until(lambda: not alive(agent), seconds=10)
        finally:
            release.set()
