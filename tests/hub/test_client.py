"""``HubClient``'s typed methods against a real Hub, over HTTP and over the in-process transport.

Every test runs once per transport: the in-process one must give the same results and the same
typed errors (a bad credential, a refusal, an unknown id) as a socket does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from hub.client import HubClient, Transport
from hub.config import HubSettings
from hub.contract import Approval, Claim, Execution, Session, TurnOutcome, TurnResult, WatchResult
from hub.errors import (
    AmuxError,
    Forbidden,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    Unauthenticated,
    Unavailable,
)
from hub.local_transport import LocalTransport
from hub.middleware import DRAIN
from hub.requestid import REQUEST_ID
from tests.hub.conftest import Served, ServeHub

Client = TestClient[Any, Any]
Connect = Callable[..., HubClient]
TRANSPORTS = ("http", "local")


@pytest.fixture
async def served(serve_hub: ServeHub) -> Served:
    return await serve_hub("owner", "alice", memory=True)


def connector(client: Client, transport: str) -> Connect:
    """A client of the served Hub over ``transport``; keyword arguments go to ``HubClient``."""

    def connect(token: str | None, **options: Any) -> HubClient:
        if transport == "http":
            return HubClient(str(client.make_url("")), token, **options)
        local: Transport = LocalTransport(client.server.app)
        return HubClient("http://in-process.invalid", token, transport=local, **options)

    return connect


@pytest.fixture(params=TRANSPORTS)
async def hub(
    request: pytest.FixtureRequest, served: tuple[Client, dict[str, str]]
) -> AsyncIterator[tuple[Connect, dict[str, str]]]:
    client, ids = served
    yield connector(client, request.param), ids


async def test_a_turn_from_submit_to_its_result(hub: tuple[Connect, dict[str, str]]) -> None:
    connect, ids = hub
    async with connect(ids["alice-token"]) as alice, connect(ids["runtime-token"]) as runtime:
        submitted = await alice.submit("claude", "edit a file")
        assert submitted.execution.state == "queued"
        assert submitted.session.principal_id == ids["alice"]
        assert await alice.session(submitted.session.id) == submitted.session

        registered = await runtime.register_worker("w")
        assert registered.worker_id and registered.lease_seconds > 0
        claim = await runtime.claim(registered.worker_id, wait_seconds=5)
        assert isinstance(claim, Claim)
        assert claim.execution_id == submitted.execution.id
        assert claim.prompt == "edit a file"
        assert claim.session.id == submitted.session.id

        beat = await runtime.heartbeat(claim.execution_id, registered.worker_id)
        assert beat.cancel_requested is False
        seq = await runtime.add_event(claim.execution_id, registered.worker_id, "progress", "hi")
        assert seq >= 1

        memory = await runtime.session_memory(
            claim.session.id, capable=True, execution_id=claim.execution_id
        )
        assert memory.bound and memory.memory == "bound"
        assert memory.binding and memory.token and memory.credential_id
        revoked = await runtime.revoke_credential(memory.credential_id)
        assert revoked.id == memory.credential_id and revoked.revoked

        done = await runtime.complete(
            claim.execution_id,
            registered.worker_id,
            TurnOutcome(True, TurnResult(text="done", provider="claude"), native_id="n1"),
        )
        assert isinstance(done, Execution)
        assert done.state == "succeeded" and done.result is not None
        assert done.result.text == "done"

        watched = await alice.watch(submitted.execution.id, after=0, wait_seconds=0)
        assert isinstance(watched, WatchResult)
        assert watched.execution.finished
        assert [e.text for e in watched.events if e.kind == "progress"] == ["hi"]
        assert (await alice.watch(submitted.execution.id, after=watched.last_seq)).events == ()


async def test_a_permission_request_asked_answered_and_waited_for(
    hub: tuple[Connect, dict[str, str]],
) -> None:
    connect, ids = hub
    async with connect(ids["alice-token"]) as alice, connect(ids["runtime-token"]) as runtime:
        submitted = await alice.submit("claude", "edit")
        worker = (await runtime.register_worker("w")).worker_id
        claim = await runtime.claim(worker, wait_seconds=5)
        assert claim is not None
        asked = await runtime.ask(
            claim.execution_id, worker, tool="Write", action="edit", subject="/w/a.md"
        )
        assert isinstance(asked, Approval) and asked.pending
        answered = await alice.approve(
            submitted.execution.id, asked.request_id, "allow_once", reason="fine"
        )
        assert answered.allowed and answered.decided_by == ids["alice"]
        settled = await runtime.decision(
            claim.execution_id, worker, asked.request_id, wait_seconds=0
        )
        assert settled == answered


async def test_a_waiting_heartbeat_answers_as_soon_as_the_turn_is_stopped(
    hub: tuple[Connect, dict[str, str]],
) -> None:
    connect, ids = hub
    async with connect(ids["alice-token"]) as alice, connect(ids["runtime-token"]) as runtime:
        worker = (await runtime.register_worker("w")).worker_id
        submitted = await alice.submit("claude", "run")
        claim = await runtime.claim(worker, wait_seconds=5)
        assert claim is not None
        # Nothing to tell: the beat answers when its wait is over.
        quiet = await runtime.heartbeat(claim.execution_id, worker, wait_seconds=0.2)
        assert quiet.cancel_requested is False
        # Told at once: far sooner than the 25 s the beat may wait.
        beat = asyncio.create_task(runtime.heartbeat(claim.execution_id, worker, wait_seconds=25))
        await alice.cancel(submitted.execution.id)
        told = await asyncio.wait_for(beat, 10)
        assert told.cancel_requested
        stopped = await runtime.complete(
            claim.execution_id, worker, TurnOutcome(False, None, "cancelled")
        )
        assert stopped.state == "cancelled" and stopped.cancelled_by == ids["alice"]


async def test_claim_cancel_and_unbind(hub: tuple[Connect, dict[str, str]]) -> None:
    connect, ids = hub
    async with connect(ids["alice-token"]) as alice, connect(ids["runtime-token"]) as runtime:
        worker = (await runtime.register_worker("w")).worker_id
        assert await runtime.claim(worker, wait_seconds=0) is None
        submitted = await alice.submit("claude", "run")
        claim = await runtime.claim(worker, wait_seconds=5)
        assert claim is not None
        cancelled = await alice.cancel(submitted.execution.id)
        assert isinstance(cancelled, Execution)
        assert (await runtime.heartbeat(claim.execution_id, worker)).cancel_requested

        fresh = await alice.submit("claude", "again")
        unbound = await runtime.unbind_session(fresh.session.id)
        assert isinstance(unbound, Session)
        assert unbound.id == fresh.session.id and unbound.memory == "unbound"


async def test_memory_methods(hub: tuple[Connect, dict[str, str]]) -> None:
    connect, ids = hub
    async with connect(ids["alice-token"], via="cli") as alice:
        written = await alice.memory_upsert("notes/a.md", "hello world\n", "absent")
        revision = written["revision"]
        got = await alice.memory_get("notes/a.md")
        assert got["content"] == "hello world\n" and got["revision"] == revision
        found = await alice.memory_search("hello")
        assert [hit["path"] for hit in found["matches"]] == ["notes/a.md"]
        changed = await alice.memory_upsert("notes/a.md", "changed\n", revision)
        history = await alice.memory_history("notes/a.md")
        assert len(history["entries"]) == 2
        restored = await alice.memory_restore("notes/a.md", revision, changed["revision"])
        assert (await alice.memory_get("notes/a.md"))["revision"] == restored["revision"]
        forgot = await alice.memory_forget("notes/a.md", restored["revision"])
        assert forgot == {"path": "notes/a.md", "already_absent": False}
        assert "documents_removed" in await alice.memory_erase()
        resolved = await alice.resolve_binding()
        assert resolved.principal_id == ids["alice"] and resolved.binding
    async with connect(ids["owner-token"]) as owner:
        assert "documents_removed" in await owner.memory_erase_principal(ids["alice"])
    async with connect(ids["runtime-token"]) as runtime:
        delegated = await runtime.delegate_credential(
            resolved.binding, principal_id=ids["alice"], ttl_seconds=60, label="t"
        )
        assert delegated.token and delegated.principal_id == ids["alice"]
        assert delegated.credential.kind == "delegated"
        assert delegated.credential.binding == resolved.binding


async def test_system_methods(hub: tuple[Connect, dict[str, str]]) -> None:
    connect, ids = hub
    async with connect(ids["owner-token"]) as owner:
        capabilities = await owner.capabilities()
        assert capabilities["memory"]["enabled"] is True
        assert (await owner.whoami())["principal"]["id"] == ids["owner"]
        described = await owner.config_get()
        assert "agents.permissions" in described
        saved = await owner.config_set("agents.permissions", "auto")
        assert saved["agents.permissions"]["running"] == "auto"
        assert await owner.restart() == {"restarting": True}


async def test_the_same_errors(hub: tuple[Connect, dict[str, str]]) -> None:
    connect, ids = hub
    async with connect("amux_" + "x" * 43) as stranger:
        with pytest.raises(Unauthenticated, match="invalid credential"):
            await stranger.whoami()
        # Authenticated first: an unknown method tells a stranger nothing either.
        with pytest.raises(Unauthenticated):
            await stranger.call("no.such.method")
    async with connect(ids["alice-token"]) as alice:
        with pytest.raises(Forbidden):
            await alice.config_set("agents.permissions", "auto")
        with pytest.raises(Forbidden):
            await alice.register_worker("w")
        with pytest.raises(NotFound) as missing:
            await alice.session("nope")
        assert missing.value.code == "not_found"
        with pytest.raises(NotFound, match="unknown RPC method"):
            await alice.call("no.such.method")
        with pytest.raises(InvalidArgument, match="unknown parameter"):
            await alice.call("system.whoami", extra=1)
    async with connect(None) as nobody:
        with pytest.raises(Unauthenticated, match="no Hub credential"):
            await nobody.whoami()


async def test_both_transports_answer_alike(served: tuple[Client, dict[str, str]]) -> None:
    client, ids = served

    async def outcomes(transport: str) -> list[object]:
        connect = connector(client, transport)
        seen: list[object] = []
        calls: list[tuple[str, Callable[[HubClient], Any]]] = [
            ("alice-token", lambda hub: hub.whoami()),
            ("alice-token", lambda hub: hub.session("nope")),
            ("alice-token", lambda hub: hub.config_set("memory.enabled", "false")),
            ("alice-token", lambda hub: hub.call("executions.watch", execution_id=7)),
            ("runtime-token", lambda hub: hub.heartbeat("nope", "nope")),
            ("owner-token", lambda hub: hub.memory_get("missing.md")),
        ]
        for token, work in calls:
            async with connect(ids[token]) as hub:
                try:
                    seen.append(await work(hub))
                except AmuxError as error:
                    seen.append((type(error), error.code, error.message, error.details))
        async with connect("amux_" + "y" * 43) as stranger:
            try:
                await stranger.capabilities()
            except AmuxError as error:
                seen.append((type(error), error.code, error.message, error.details))
        return seen

    over_http, in_process = await outcomes("http"), await outcomes("local")
    assert over_http == in_process
    assert isinstance(over_http[-1], tuple) and over_http[-1][0] is Unauthenticated


async def test_in_process_calls_keep_the_body_limit_and_the_drain(
    served: tuple[Client, dict[str, str]],
) -> None:
    client, ids = served
    connect = connector(client, "local")
    async with connect(ids["alice-token"]) as alice:
        limit = HubSettings(home=Path("/nonexistent")).max_request_bytes
        with pytest.raises(PayloadTooLarge):
            await alice.memory_upsert("big.md", "x" * (limit + 1), "absent")
        drain = client.server.app[DRAIN]
        waiting = asyncio.create_task(alice.watch("nope-but-slow", wait_seconds=0))
        with pytest.raises(NotFound):
            await waiting
        assert await drain.wait_idle(1.0)
        with pytest.raises(Unavailable, match="restarting"):
            await alice.whoami()


async def test_in_process_calls_get_the_access_lines_of_http_requests(
    served: tuple[Client, dict[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    client, ids = served
    REQUEST_ID.set("trace-local-1")
    with caplog.at_level(logging.DEBUG, logger="aiohttp.access"):
        async with connector(client, "local")(ids["alice-token"]) as alice:
            await alice.whoami()
            with pytest.raises(NotFound):
                await alice.session("nope")
    lines = [r for r in caplog.records if getattr(r, "transport", None) == "local"]
    assert [(r.name, r.levelno, r.getMessage(), r.request_id) for r in lines] == [
        ("aiohttp.access", logging.INFO, "POST /rpc/v1/system.whoami 200", "trace-local-1"),
        ("aiohttp.access", logging.INFO, "POST /rpc/v1/sessions.get 404", "trace-local-1"),
    ]
    assert [(r.path, r.status) for r in lines] == [
        ("/rpc/v1/system.whoami", 200),
        ("/rpc/v1/sessions.get", 404),
    ]
