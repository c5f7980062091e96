"""Launch-time memory failures: the Agent still runs, without memory, and the user is told why.

"Hub unreachable for memory discovery" is provoked on the wire, not in our code: the remote
worker reaches the Hub through a loopback proxy that forwards every call except
``sessions.memory``, whose connection it drops, as a failing network path or a Hub restarting
under a load balancer would. Everything on both sides of the proxy is the real thing.

A turn stopped while its launch still waits on the Hub ends cancelled, and its worker lives on:
the proxy holds ``sessions.memory`` unanswered until the Stop has reached the worker.

(Binding mismatch after an isolation change and a missing CLI executable are covered in
``test_worker.py``.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from runtime_bridge.memoryprotocol import protocol_text
from tests.conftest import MEMORY_ON, until
from tests.fakes.model_server import Answer, FakeModelServer, Step
from tests.runtime_bridge.test_worker import agent_run, cli
from tests.runtime_bridge.test_worker_pi import start_pi_hub, upsert_by_bash
from tests.runtime_bridge.test_workers_remote import Cluster, cluster_for, finished, submit

__all__ = ["cluster_for"]  # the fixture, used by name below

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

FORWARDED_HEADERS = ("Authorization", "Content-Type", "X-Amux-Memory-Binding")


class HubPathProxy:
    """A loopback HTTP proxy to the Hub that drops the connection of chosen RPC methods, and
    holds the calls of others unanswered until ``release`` is set."""

    def __init__(
        self, upstream: str, dropping: set[str], holding: frozenset[str] = frozenset()
    ) -> None:
        self.upstream = upstream
        self.dropping = dropping
        self.dropped: list[str] = []
        self.holding = holding
        self.held: list[str] = []
        self.release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self.url = ""

    async def __aenter__(self) -> HubPathProxy:
        # Long polls (claim, watch) stay open for up to half a minute.
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/rpc/v1/{method}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None)
        assert sockets
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        body = await request.read()
        if method in self.dropping:
            self.dropped.append(method)
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if method in self.holding:
            self.held.append(method)
            await self.release.wait()
        assert self._client is not None
        headers = {k: request.headers[k] for k in FORWARDED_HEADERS if k in request.headers}
        async with self._client.post(
            f"{self.upstream}/rpc/v1/{method}", data=body, headers=headers
        ) as answer:
            payload = await answer.read()
            return web.Response(body=payload, status=answer.status, content_type="application/json")


async def test_an_unreachable_hub_at_discovery_warns_and_runs_the_agent_unbound_for_good(
    tmp_path: Path, cluster_for: Callable[..., Cluster]
) -> None:
    script: list[Step] = [
        # The Agent tries the memory CLI anyway: there must be nothing for it to reach.
        upsert_by_bash("topics/unsaved.md", "# Unsaved\n"),
        Answer("Ran without memory."),
    ]
    async with FakeModelServer(script) as model:
        cluster = cluster_for(model, settings=MEMORY_ON)
        async with HubPathProxy(cluster.hub.url, {"sessions.memory"}) as proxy:
            await asyncio.to_thread(cluster.start_worker, "w", proxy.url)
            done = await cli(
                cluster.hub, "agent", "run", "--provider", "pi", "Remember this", timeout=150
            )
            assert done.returncode == 0, (done.stderr, cluster.workers[0].text())
            assert proxy.dropped == ["sessions.memory"]
            assert done.stdout.strip() == "Ran without memory."
            warning = next(
                line for line in done.stderr.splitlines() if line.startswith("warning: ")
            )
            assert "amux memory is unavailable for this conversation" in warning
            assert "cannot reach the Hub" in warning
            assert "Traceback" not in done.stderr

            # No protocol, and the CLI the Agent tried reached no memory at all.
            first = model.main_requests[0]
            assert protocol_text("cli").strip() not in first.system_text
            assert '"revision"' not in model.tool_results[0][1]
            assert not (cluster.hub.home / "memory" / "global" / "topics").exists()
            missing = await cli(cluster.hub, "memory", "show", "--json", "topics/unsaved.md")
            assert missing.json()["exists"] is False
            # No temporary store or connection config was left on the worker's side.
            work_dir = tmp_path / "runtime-w"
            assert not [p for p in work_dir.rglob("*") if p.name in ("memory", "agent-config")]

            session_id = done.stderr.strip().splitlines()[-1].removeprefix("session: ")
            status, session = await asyncio.to_thread(
                cluster.hub.rpc, "sessions.get", session_id=session_id
            )
            assert status == 200, session
            assert (session["memory"], session["binding"]) == ("unbound", None)

            # Once the Hub is reachable again, the conversation stays without memory.
            proxy.dropping.clear()
            model.add_steps([Answer("Still without memory.")])
            again = await agent_run(
                cluster.hub, "--provider", "pi", "--session", session_id, "And now?"
            )
            assert again["state"] == "succeeded", again
            assert again["binding"] is None
            assert again["warnings"] == []
            assert protocol_text("cli").strip() not in model.main_requests[-1].system_text


async def test_with_memory_disabled_pi_runs_unbound_without_protocol_or_warning(
    tmp_path: Path,
) -> None:
    async with FakeModelServer([Answer("Plain answer.")]) as model:
        hub = start_pi_hub(tmp_path, model)
        try:
            done: dict[str, Any] = await agent_run(hub, "--provider", "pi", "Hello")
            assert done["state"] == "succeeded", done
            assert done["text"] == "Plain answer."
            assert done["binding"] is None
            assert done["warnings"] == []
            system = model.main_requests[0].system_text
            assert protocol_text("cli").strip() not in system
            assert "amux memory" not in json.dumps(model.main_requests[0].body)
        finally:
            hub.stop()


async def test_a_turn_stopped_while_its_launch_waits_on_the_hub_ends_and_its_worker_lives_on(
    tmp_path: Path, cluster_for: Callable[..., Cluster]
) -> None:
    async with FakeModelServer([Answer("Still here.")]) as model:
        cluster = cluster_for(model)
        async with HubPathProxy(cluster.hub.url, set(), frozenset({"sessions.memory"})) as proxy:
            worker = await asyncio.to_thread(cluster.start_worker, "w", proxy.url)
            execution_id = await submit(cluster.hub, "Stop me before I start")
            await until(lambda: proxy.held)
            status, body = await asyncio.to_thread(
                cluster.hub.rpc, "executions.cancel", execution_id=execution_id
            )
            assert status == 200, body
            described = await finished(cluster.hub, execution_id, within=30)
            assert described["state"] == "cancelled", (described, worker.text())
            # The worker did not go down with the launch it stopped: it takes the next turn.
            proxy.release.set()
            again = await finished(cluster.hub, await submit(cluster.hub, "Anyone left?"))
    assert again["state"] == "succeeded", (again, worker.text())
    assert again["result"]["text"] == "Still here."
    assert worker.proc.poll() is None
    assert "Traceback" not in worker.text()
    assert model.main_requests and len(model.main_requests) == 1
