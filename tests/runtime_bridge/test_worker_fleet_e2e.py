"""A fleet of workers as Kubernetes scaling treats it: pods lost and pods drained mid-turn.

An `amux serve` without a worker of its own, three `amux runtime worker` processes started as an
operator starts them (two slots each, as the chart's default), and a batch of turns larger than
the fleet runs at once. While the first turns run, one worker is SIGKILLed (a node lost) and
another gets SIGTERM (a scale-down or a rolling upgrade). The stand-in Agent
``tests/fakes/fleet_agent.sh`` notes every run as it starts, with the worker whose working
directory it runs in, and waits for a gate file, so the test decides when each turn ends.

What an operator relies on: every turn completes exactly once at the Hub; the lost worker's turns
run again elsewhere and its half-done runs never report; the drained worker finishes the turns it
holds, takes no more, and exits 0; no Agent outlives its killed worker.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import AMUX, HubProcess, free_port, save_settings, stand_in, until
from tests.runtime_bridge.test_workers_remote import WorkerProcess, alive

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FLEET_AGENT = "fleet_agent.sh"
WORKERS = ("w1", "w2", "w3")
SLOTS = 2
TURNS = 10  # more than the fleet's 6 slots: some wait for a slot to free
# Short, so a lost worker's turns are re-queued within seconds; long enough that a loaded
# machine's heart-beats (every third of it) still arrive in time.
LEASE_SECONDS = 6
# What the test allows a drained worker, counted from SIGTERM (the chart's
# terminationGracePeriodSeconds plays this part in a cluster).
GRACE_SECONDS = 60.0


@dataclass
class Run:
    """One run of a turn's Agent, as the stand-in noted it."""

    label: str
    pid: int
    worker: str
    ended: bool = False


@dataclass
class Fleet:
    hub: HubProcess
    tmp_path: Path
    log: Path
    token: str
    workers: dict[str, WorkerProcess] = field(default_factory=dict)

    def start_workers(self, names: tuple[str, ...]) -> None:
        """Start the workers together and wait until each has registered."""
        for name in names:
            log = self.tmp_path / f"worker-{name}.log"
            env = self.hub.env(
                AMUX_TOKEN=self.token,
                AMUX_RUNTIME_NAME=name,
                AMUX_RUNTIME_WORK_DIR=str(self.work_dir(name)),
            )
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    [AMUX, "runtime", "worker", "--hub", self.hub.url],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self.tmp_path,
                )
            self.workers[name] = WorkerProcess(name, proc, log)
        deadline = time.monotonic() + 90
        for name, worker in self.workers.items():
            while f"worker {name} serving" not in worker.text():
                assert worker.proc.poll() is None, worker.text()
                assert time.monotonic() < deadline, worker.text()
                time.sleep(0.05)

    def work_dir(self, name: str) -> Path:
        return self.tmp_path / f"runtime-{name}"

    def runs(self) -> list[Run]:
        """Every run so far, in the order they started."""
        runs: dict[tuple[str, int], Run] = {}
        for line in self.log.read_text().splitlines():
            label, pid, rest = line.split(" ", 2)
            if rest == "end":
                runs[label, int(pid)].ended = True
                continue
            owner = next(name for name in WORKERS if Path(rest).is_relative_to(self.work_dir(name)))
            runs[label, int(pid)] = Run(label, int(pid), owner)
        return list(runs.values())

    def runs_on(self, worker: str) -> list[Run]:
        return [run for run in self.runs() if run.worker == worker]

    def open_gate(self, label: str) -> None:
        self.log.with_name(f"{self.log.name}.{label}").touch()

    def submit(self, label: str) -> str:
        status, body = self.hub.rpc(
            "executions.submit", provider="turn", prompt=f"turn {self.log} {label}"
        )
        assert status == 200, body
        return str(body["execution"]["id"])

    def watch(self, execution_id: str) -> dict[str, Any]:
        status, body = self.hub.rpc("executions.watch", execution_id=execution_id, after=0)
        assert status == 200, body
        return dict(body)

    def completions(self) -> dict[str, float]:
        """The Hub's count of ``executions.complete`` calls, by HTTP status (its /metrics)."""
        with urllib.request.urlopen(f"{self.hub.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        pattern = re.compile(
            r'^amux_rpc_request_duration_seconds_count\{method="executions\.complete",'
            r'status="(\d+)"\} (\S+)$',
            re.MULTILINE,
        )
        return {status: float(count) for status, count in pattern.findall(text)}


@pytest.fixture
async def fleet(tmp_path: Path, shared_dir: Path) -> AsyncIterator[Fleet]:
    home = tmp_path / "amux-home"
    # The whole batch is submitted at once, by one Principal.
    save_settings(home, {"turns.max_queued_per_principal": TURNS})
    hub = HubProcess(
        home,
        free_port(),
        extra_env={
            "AMUX_RUNTIME_IN_PROCESS": "false",
            "AMUX_LEASE_SECONDS": str(LEASE_SECONDS),
            "AMUX_RUNTIME_PROVIDERS": json.dumps({"turn": str(stand_in(FLEET_AGENT))}),
            "AMUX_RUNTIME_SANDBOX": "off",
            "AMUX_RUNTIME_SLOTS": str(SLOTS),
        },
    )
    await asyncio.to_thread(hub.start)
    fleet: Fleet | None = None
    try:
        add = await asyncio.to_thread(hub.cli, "principal", "add", "fleet", "--service")
        assert add.returncode == 0, add.stderr
        issued = await asyncio.to_thread(hub.cli, "token", "issue", "fleet")
        assert issued.returncode == 0, issued.stderr
        # Made here, writable by all: each Principal's Agents may run as a uid of its own.
        log = shared_dir / "runs"
        log.touch()
        log.chmod(0o666)
        fleet = Fleet(hub, tmp_path, log, issued.stdout.strip())
        yield fleet
    finally:
        if fleet is not None:
            fleet.log.with_name(f"{fleet.log.name}.all").touch()
            for worker in fleet.workers.values():
                await asyncio.to_thread(worker.stop)
        await asyncio.to_thread(hub.stop)


async def test_a_fleet_loses_and_drains_workers_mid_turn_and_every_turn_completes_once(
    fleet: Fleet,
) -> None:
    await asyncio.to_thread(fleet.start_workers, WORKERS)
    labels = [f"t{n:02d}" for n in range(TURNS)]
    ids = {label: await asyncio.to_thread(fleet.submit, label) for label in labels}

    # Every slot of the fleet holds a turn; the rest wait.
    await until(lambda: len(fleet.runs()) == len(WORKERS) * SLOTS, seconds=60)
    killed, drained, survivor = (fleet.workers[name] for name in WORKERS)
    lost = {run.label: run for run in fleet.runs_on(killed.name)}
    held = {run.label: run for run in fleet.runs_on(drained.name)}
    assert len(lost) == len(held) == SLOTS

    # A node is lost: no chance for the worker to clean up or report.
    killed.proc.send_signal(signal.SIGKILL)
    # A pod scaled down: it finishes what it holds and takes nothing more.
    drained.proc.send_signal(signal.SIGTERM)
    terminated_at = time.monotonic()
    # Its log tells whoever stopped it that it drains, and how much.
    said = f"worker {drained.name} stopping: it claims no new turn and finishes the {SLOTS} turns"
    await until(lambda: said in drained.text(), seconds=15)

    # The killed worker's Agents do not live on beside the retries of their turns.
    await until(lambda: not any(alive(run.pid) for run in lost.values()), seconds=15)

    def state(label: str) -> str:
        return str(fleet.watch(ids[label])["state"])

    # The drained worker waits for the turns it holds: it neither stops them nor hands them back.
    assert drained.proc.poll() is None, drained.text()
    assert all(state(label) == "running" for label in held)
    # They end while turns still wait for a slot and the survivor's slots are busy: the drained
    # worker's freed slots take none of them, and it exits 0 within its grace.
    for label in held:
        fleet.open_gate(label)
    remaining = GRACE_SECONDS - (time.monotonic() - terminated_at)
    assert await asyncio.to_thread(drained.proc.wait, max(remaining, 1)) == 0, drained.text()
    assert "Traceback" not in drained.text()
    assert {run.label for run in fleet.runs_on(drained.name)} == set(held)
    assert all(state(label) == "succeeded" for label in held)
    waiting = [label for label in labels if state(label) == "queued"]
    assert len(waiting) >= TURNS - len(WORKERS) * SLOTS, waiting

    # The rest, the lost turns among them, run on the survivor.
    for label in labels:
        if label not in held:
            fleet.open_gate(label)
    finished_states = ("succeeded", "failed", "cancelled")
    await until(lambda: all(state(label) in finished_states for label in labels), seconds=60)
    assert survivor.proc.poll() is None

    described = {label: await asyncio.to_thread(fleet.watch, ids[label]) for label in labels}
    runs = fleet.runs()
    for label, execution in described.items():
        assert execution["state"] == "succeeded", execution
        tries = [run for run in runs if run.label == label]
        # The run whose answer the Hub kept is the one that finished.
        (finished,) = [run for run in tries if run.ended]
        assert execution["result"]["text"] == f"done {label} {finished.pid}"
        if label in lost:
            # Run again elsewhere once the lease lapsed; the first run never ended, never reported.
            assert [run.pid for run in tries] == [lost[label].pid, finished.pid]
            assert finished.worker == survivor.name
            assert execution["attempts"] == 2
            texts = [str(event["text"]) for event in execution["events"]]
            assert "the worker running this turn was lost; retrying" in texts
        else:
            assert tries == [finished]
            assert execution["attempts"] == 1
        if label in held:
            assert finished.worker == drained.name
    # One completion per turn reached the Hub, none refused (a late one from a lost lease).
    assert fleet.completions() == {"200": float(TURNS)}
