"""A sandboxed launch's network, tried as an attacker would, through a real `amux serve`.

The Agent is a stand-in (``tests/fakes/net_agent.py``) declared as a provider and launched by the
Hub's own worker in its sandbox, with a network namespace of its own. It looks for the
operator's model key, connects straight to a loopback server and to the Hub's port, and goes
through its doors: the model gateway (to a scripted model that sees the operator's key), the Hub,
and the egress proxy (a loopback server named on the allow-list, and others that are not).
"""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from runtime_bridge.doors import DOOR_CONNECTIONS
from runtime_bridge.network import EGRESS, EGRESS_SETTING, HUB, door_url
from tests.conftest import HubProcess, free_port, save_settings, stand_in, until
from tests.fakes.model_server import Answer, FakeModelServer
from tests.runtime_bridge.test_sandbox_e2e import add_principal

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
]

NET_AGENT = "net_agent.py"
OPERATOR_KEY = "sk-ant-operator-net-" + uuid.uuid4().hex[:12]
HUB_DOOR = door_url(HUB)
EGRESS_DOOR = door_url(EGRESS)


def start_hub(
    tmp_path: Path, model: FakeModelServer, allow: str, settings: Mapping[str, Any]
) -> HubProcess:
    save_settings(tmp_path / "amux-home", settings)
    agent_home = tmp_path / "agent-home"
    agent_home.mkdir(exist_ok=True)
    hub = HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={
            "HOME": str(agent_home),
            "AMUX_RUNTIME_PROVIDERS": json.dumps({"probe": str(stand_in(NET_AGENT))}),
            "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": OPERATOR_KEY,
            EGRESS_SETTING: allow,
        },
    )
    hub.start()
    return hub


class Site:
    """A loopback web server answering its own name: something to reach, or not."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.hits = 0
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Site:
        async def answer(request: web.Request) -> web.Response:
            self.hits += 1
            return web.Response(text=f"{self.name} answered")

        app = web.Application()
        app.router.add_get("/{tail:.*}", answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"


async def submit(hub: HubProcess, prompt: str, session_id: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"provider": "probe", "prompt": prompt}
    if session_id is not None:
        params["session_id"] = session_id
    status, body = await asyncio.to_thread(hub.rpc, "executions.submit", **params)
    assert status == 200, body
    return dict(body)


async def watch(hub: HubProcess, execution_id: str, after: int) -> dict[str, Any]:
    """The turn as it stands, with its events after ``after`` (a long poll)."""
    status, body = await asyncio.to_thread(
        hub.rpc, "executions.watch", execution_id=execution_id, after=after, wait_seconds=10
    )
    assert status == 200, body
    return dict(body)


async def follow(hub: HubProcess, execution_id: str, until_approval: bool = False) -> Any:
    """The turn's events until it finishes (its final state with every event), or until a
    pending approval (that approval) with ``until_approval``."""
    deadline = time.monotonic() + 150
    events: list[dict[str, Any]] = []
    while True:
        described = await watch(hub, execution_id, max((e["seq"] for e in events), default=0))
        events += described["events"]
        if until_approval:
            for event in described["events"]:
                approval = json.loads(event["text"]) if event["kind"] == "approval" else {}
                if approval and approval.get("decision") is None:
                    return approval
        if described["state"] in ("succeeded", "failed", "cancelled"):
            assert not until_approval, described
            return {**described, "events": events}
        assert time.monotonic() < deadline, described


async def finished(hub: HubProcess, execution_id: str) -> dict[str, Any]:
    return dict(await follow(hub, execution_id))


async def pending_approval(hub: HubProcess, execution_id: str) -> dict[str, Any]:
    return dict(await follow(hub, execution_id, until_approval=True))


def report(described: dict[str, Any], nonce: str) -> list[str]:
    assert described["state"] == "succeeded", (described.get("error"), described.get("result"))
    lines = str(described["result"]["text"]).splitlines()
    assert f"nonce {nonce}" in lines, lines
    return lines


def egress_events(described: dict[str, Any]) -> list[str]:
    return [str(e["text"]) for e in described["events"] if e["kind"] == "egress"]


@pytest.fixture
async def sites() -> AsyncIterator[tuple[Site, Site]]:
    async with Site("allowed") as allowed, Site("elsewhere") as elsewhere:
        yield allowed, elsewhere


async def test_an_isolated_agent_reaches_only_its_doors_and_the_allowed_host(
    tmp_path: Path, sites: tuple[Site, Site]
) -> None:
    allowed, elsewhere = sites
    async with FakeModelServer([Answer("fine")]) as model:
        hub = start_hub(
            tmp_path, model, f"127.0.0.1:{allowed.port}", {"agents.permissions": "auto"}
        )
        try:
            nonce = uuid.uuid4().hex
            prompt = "\n".join(
                (
                    f"nonce {nonce}",
                    f"secret {OPERATOR_KEY}",
                    f"connect 127.0.0.1 {elsewhere.port}",
                    f"connect 127.0.0.1 {hub.port}",
                    "connect 1.1.1.1 443",
                    f"rpc {HUB_DOOR}/rpc/v1/system.whoami",
                    "model",
                    f"proxied {allowed.url}",
                    f"proxied {elsewhere.url}",
                    "proxied http://169.254.169.254/latest/meta-data/",
                    "get https://github.com/",
                    "env HTTPS_PROXY",
                    "env NO_PROXY",
                    f"get {HUB_DOOR}/metrics",
                    f"get {HUB_DOOR}/readyz",
                )
            )
            submitted = await submit(hub, prompt + "\n")
            described = await finished(hub, submitted["execution"]["id"])
        finally:
            await asyncio.to_thread(hub.stop)
    lines = report(described, nonce)
    assert "secret-none" in lines
    # Straight connections go nowhere: the namespace has only its own loopback.
    assert lines[2].startswith("connect-failed"), lines
    assert lines[3].startswith("connect-failed"), lines
    assert lines[4].startswith("connect-failed"), lines
    # The doors: the Hub (its RPC, which wants a credential the probe lacks) and the model
    # (which saw the operator's key, not the placeholder).
    assert lines[5].startswith("rpc 401") and "unauthenticated" in lines[5], lines
    # Nothing else of the Hub: its metrics and readiness say nothing to an Agent.
    assert lines[-2].startswith("get 404 amux: the hub door passes only POST"), lines
    assert lines[-1].startswith("get 404 amux: the hub door passes only POST"), lines
    assert "model 200" in lines
    assert {r.credential() for r in model.requests} == {OPERATOR_KEY}
    assert "proxied 200 allowed answered" in lines, "\n".join(lines)
    assert allowed.hits == 1 and elsewhere.hits == 0
    refused = [line for line in lines if line.startswith("proxied 403")]
    assert len(refused) == 2, lines
    assert all(EGRESS_SETTING in line for line in refused)
    assert any(line.startswith("get 0") and "403" in line for line in lines), lines
    assert f"env HTTPS_PROXY={EGRESS_DOOR}" in lines
    assert "env NO_PROXY=127.0.0.1,localhost" in lines
    events = egress_events(described)
    assert any(f"127.0.0.1:{elsewhere.port}" in text for text in events), events
    assert any("169.254.169.254:80" in text for text in events), events
    assert any("github.com:443" in text for text in events), events
    assert len(events) == 3, events


async def test_under_ask_a_refused_host_is_asked_and_allowed_for_the_conversation(
    tmp_path: Path, sites: tuple[Site, Site]
) -> None:
    allowed, elsewhere = sites
    async with FakeModelServer() as model:
        hub = start_hub(tmp_path, model, "", {"agents.permissions": "ask"})
        try:
            nonce = uuid.uuid4().hex
            submitted = await submit(hub, f"nonce {nonce}\nproxied {allowed.url}\n")
            execution_id = submitted["execution"]["id"]
            approval = await pending_approval(hub, execution_id)
            assert approval["tool"] == "network"
            assert approval["subject"] == f"127.0.0.1:{allowed.port}"
            status, body = await asyncio.to_thread(
                hub.rpc,
                "executions.approve",
                execution_id=execution_id,
                request_id=approval["request_id"],
                decision="allow_session",
            )
            assert status == 200, body
            first = await finished(hub, execution_id)
            # The conversation's next turn passes without anyone being asked.
            again = uuid.uuid4().hex
            second = await submit(
                hub, f"nonce {again}\nproxied {allowed.url}\n", submitted["session"]["id"]
            )
            later = await finished(hub, second["execution"]["id"])
            # A host nobody allowed stays refused when nobody answers (denied at once here).
            other = uuid.uuid4().hex
            third = await submit(hub, f"nonce {other}\nproxied {elsewhere.url}\n")
            third_id = third["execution"]["id"]
            asked = await pending_approval(hub, third_id)
            status, body = await asyncio.to_thread(
                hub.rpc,
                "executions.approve",
                execution_id=third_id,
                request_id=asked["request_id"],
                decision="deny",
            )
            assert status == 200, body
            denied = await finished(hub, third_id)
        finally:
            await asyncio.to_thread(hub.stop)
    assert "proxied 200 allowed answered" in report(first, nonce)
    assert "proxied 200 allowed answered" in report(later, again)
    approvals = [json.loads(e["text"]) for e in later["events"] if e["kind"] == "approval"]
    assert approvals and all(a["via"] == "rule" for a in approvals), approvals
    assert allowed.hits == 2
    assert any(line.startswith("proxied 403") for line in report(denied, other))
    assert elsewhere.hits == 0
    assert egress_events(denied) and not egress_events(first) and not egress_events(later)


async def test_an_agent_flooding_its_hub_door_leaves_the_hub_answering_everyone_else(
    tmp_path: Path,
) -> None:
    async with FakeModelServer() as model:
        hub = start_hub(tmp_path, model, "", {"agents.permissions": "auto"})
        try:
            # systemd's default for a service: 1,024 files for the Hub, and as many for its
            # worker's process, which holds the doors.
            for pid in (hub.pid, *await until(hub.worker_pids, 30)):
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (1024, 1024))
            bob = await asyncio.to_thread(add_principal, hub, "bob")
            nonce = uuid.uuid4().hex
            flooding = await submit(hub, f"nonce {nonce}\nflood 1100\n")
            workspaces = tmp_path / "runtime" / "workspaces"
            marker = await until(lambda: next(iter(workspaces.glob("*/flooded")), None), 60)
            # While the Agent holds what its door lets it: the Hub answers, and another
            # person's turn runs to its end.
            assert all([await asyncio.to_thread(hub.healthy) for _ in range(3)])
            other = uuid.uuid4().hex
            prompt = f"nonce {other}\nrpc {HUB_DOOR}/rpc/v1/system.whoami\n"
            done = await asyncio.to_thread(
                hub.cli, "agent", "run", "--json", "--provider", "probe", prompt,
                env={"AMUX_TOKEN": bob}, timeout=60,
            )  # fmt: skip
            marker.with_name("release").touch()
            flooded = await finished(hub, flooding["execution"]["id"])
            assert await asyncio.to_thread(hub.healthy)
        finally:
            await asyncio.to_thread(hub.stop)
    assert done.returncode == 0, done.stderr
    answered = json.loads(done.stdout)
    assert answered["state"] == "succeeded", answered
    assert f"nonce {other}" in answered["text"]
    held = int(report(flooded, nonce)[1].split()[1])
    assert held <= DOOR_CONNECTIONS, report(flooded, nonce)
    # Refused a thousand times, logged once for each kind of refusal.
    refusals = [line for line in hub.log().splitlines() if "door refused" in line]
    assert 1 <= len(refusals) <= 2, (refusals, report(flooded, nonce))
