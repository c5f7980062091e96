"""The worker's side of a launch's doors, driven over their real Unix sockets: the hub door makes
the TLS connection of an https Hub (the Agent speaks plain HTTP to it), and every door is the
Agent's uid's alone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import stat
import subprocess
from pathlib import Path

import pytest
from aiohttp import web

from runtime_bridge.doors import DOOR_CONNECTIONS, LaunchDoors
from runtime_bridge.egress import HEAD_SECONDS, Egress, splice
from runtime_bridge.network import AllowList, launch_doors
from tests.conftest import free_port


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with the openssl command."""
    cert, key = tmp_path / "hub.pem", tmp_path / "hub.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def nothing(host: str, port: int, reason: str) -> None:
    return None


async def ask(socket_path: Path, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(request)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def test_the_hub_door_speaks_tls_to_an_https_hub_and_plain_http_to_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path)
    # The worker trusts the Hub's certificate as it would its operator's CA.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    seen: list[str] = []

    async def whoami(request: web.Request) -> web.Response:
        seen.append(request.scheme)
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/rpc/v1/system.whoami", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=served).start()
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    doors = launch_doors(run_dir)
    try:
        async with LaunchDoors(
            doors,
            gateway_url="http://127.0.0.1:9",
            hub_url=f"https://127.0.0.1:{port}",
            egress=Egress(AllowList(), nothing),
        ):
            modes = {d.name: stat.S_IMODE(os.lstat(d.socket).st_mode) for d in doors}
            answer = await ask(
                run_dir / "hub.sock",
                b"POST /rpc/v1/system.whoami HTTP/1.1\r\nHost: 127.0.0.1:7802\r\n"
                b"Content-Length: 2\r\n\r\n{}",
            )
        left = sorted(p.name for p in run_dir.iterdir())
    finally:
        await runner.cleanup()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert answer.endswith(b'{"status": "ok"}')
    assert seen == ["https"]
    # Owner-only from the first instant, and gone with the launch.
    assert modes == {"model": 0o600, "hub": 0o600, "egress": 0o600}
    assert left == []


def nowhere_doors(run_dir: Path) -> LaunchDoors:
    """A launch's doors in ``run_dir`` whose gateway and Hub listen nowhere, egress allowing
    nothing."""
    return LaunchDoors(
        launch_doors(run_dir),
        gateway_url="http://127.0.0.1:9",
        hub_url="http://127.0.0.1:9",
        egress=Egress(AllowList(), nothing),
    )


async def test_the_egress_door_refuses_what_is_not_a_proxy_request(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    async with nowhere_doors(run_dir):
        origin = await ask(run_dir / "egress.sock", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        https = await ask(run_dir / "egress.sock", b"GET https://x/ HTTP/1.1\r\n\r\n")
    assert origin.startswith(b"HTTP/1.1 400 Bad Request")
    assert b"a proxy request is CONNECT host:port or http://" in origin
    assert https.startswith(b"HTTP/1.1 400 Bad Request")


async def test_opening_doors_leaves_what_else_the_worker_makes_meanwhile_its_own_mode(
    tmp_path: Path,
) -> None:
    # The worker runs launches side by side: a launch's directories and a Hub's memory files
    # are made while another launch opens its sockets, and must keep their modes.
    run_dirs = [tmp_path / f"run-{n}" for n in range(3)]
    made = tmp_path / "made"
    made.mkdir()
    opened = asyncio.Event()
    before = os.umask(0o022)
    os.umask(before)

    for run_dir in run_dirs:
        run_dir.mkdir(mode=0o700)

    async def open_doors(run_dir: Path) -> None:
        doors = launch_doors(run_dir)
        async with nowhere_doors(run_dir):
            assert {stat.S_IMODE(os.lstat(d.socket).st_mode) for d in doors} == {0o600}
            opened.set()

    async def make_directories() -> None:
        n = 0
        while not opened.is_set() or n < 20:
            os.mkdir(made / f"d{n}", mode=0o755)
            n += 1
            await asyncio.sleep(0)

    await asyncio.gather(make_directories(), *(open_doors(r) for r in run_dirs))
    modes = {stat.S_IMODE(d.stat().st_mode) for d in made.iterdir()}
    after = os.umask(before)
    assert after == before
    assert modes == {0o755 & ~before}


class StandInHub:
    """A loopback server answering every path as the Hub would, recording each request and
    counting each connection that reaches it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.seen: list[tuple[str, str, bytes]] = []
        self.connections = 0
        self._runner: web.AppRunner | None = None
        self._counter: asyncio.Server | None = None
        # Connections still open when the test ends are closed with the stand-in, not left for
        # the garbage collector to find after their loop is gone.
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> StandInHub:
        async def anything(request: web.Request) -> web.Response:
            self.seen.append((request.method, request.path, await request.read()))
            return web.json_response({"path": request.path})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", anything)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        inner = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", inner).start()

        async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            upstream = await asyncio.open_connection("127.0.0.1", inner)
            self._writers |= {writer, upstream[1]}
            try:
                await splice((reader, writer), upstream)
            finally:
                writer.close()
                upstream[1].close()

        self._counter = await asyncio.start_server(count, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None and self._counter is not None
        self._counter.close()
        for writer in self._writers:
            writer.close()
        for writer in self._writers:
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
        await self._runner.cleanup()


def hub_doors(run_dir: Path, hub: StandInHub) -> LaunchDoors:
    return LaunchDoors(
        launch_doors(run_dir),
        gateway_url="http://127.0.0.1:9",
        hub_url=f"http://127.0.0.1:{hub.port}",
        egress=Egress(AllowList(), nothing),
        label="launch-1",
    )


def rpc(method: str, body: bytes = b"{}") -> bytes:
    return (
        f"POST /rpc/v1/{method} HTTP/1.1\r\nHost: 127.0.0.1:7802\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def test_the_hub_door_passes_only_rpc_requests_and_nothing_that_follows_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="amux.worker")
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    door = run_dir / "hub.sock"
    async with StandInHub() as hub, hub_doors(run_dir, hub):
        passed = await ask(door, rpc("memory.search", b'{"query": "x"}'))
        refused = {
            request: await ask(door, request + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            for request in (
                b"GET /metrics",
                b"GET /readyz",
                b"GET /healthz",
                b"POST /metrics",
                b"GET /rpc/v1/system.whoami",
                b"POST /rpc/v1/../metrics",
                b"POST /rpc/v1/memory.search?x=/metrics",
            )
        }
        # A second request on the same connection would pass unchecked: it never reaches the Hub.
        pipelined = await ask(door, rpc("system.whoami") + b"GET /metrics HTTP/1.1\r\n\r\n")
        chunked = await ask(
            door,
            b"POST /rpc/v1/system.whoami HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        )
    assert passed.startswith(b"HTTP/1.1 200"), passed
    assert passed.endswith(b'{"path": "/rpc/v1/memory.search"}')
    for request, answer in refused.items():
        assert answer.startswith(b"HTTP/1.1 404"), (request, answer)
        assert b"passes only POST /rpc/v1/<method>" in answer
    assert pipelined.startswith(b"HTTP/1.1 200") and pipelined.count(b"HTTP/1.1") == 1
    assert chunked.startswith(b"HTTP/1.1 411")
    assert hub.seen == [
        ("POST", "/rpc/v1/memory.search", b'{"query": "x"}'),
        ("POST", "/rpc/v1/system.whoami", b"{}"),
    ]
    # Seven paths refused, one line: the first of them.
    (path_refusal,) = [
        r.getMessage() for r in caplog.records if "not POST /rpc/v1" in r.getMessage()
    ]
    assert "launch launch-1: its hub door refused" in path_refusal
    assert "first 'GET /metrics'" in path_refusal


async def closed(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the door closes this connection within ``seconds``."""
    try:
        return await asyncio.wait_for(reader.read(), seconds) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def test_a_door_holds_at_most_its_bound_and_closes_requests_that_never_finish(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    door = str(run_dir / "hub.sock")
    caplog.set_level("WARNING", logger="amux.worker")
    async with StandInHub() as hub, hub_doors(run_dir, hub):
        held = [await asyncio.open_unix_connection(door) for _ in range(DOOR_CONNECTIONS)]
        for _, writer in held:
            writer.write(b"POST /rpc/v1/system.whoami HTTP/1.1\r\nHost: x\r\n")
        # Every connection past the bound is closed at once, whatever it sends.
        more = [await asyncio.open_unix_connection(door) for _ in range(100)]
        assert all(await asyncio.gather(*(closed(reader, 2) for reader, _ in more)))
        started = asyncio.get_running_loop().time()
        # The incomplete ones are closed once their head is overdue; then requests pass again.
        assert all(await asyncio.gather(*(closed(reader, HEAD_SECONDS + 3) for reader, _ in held)))
        waited = asyncio.get_running_loop().time() - started
        after = await ask(run_dir / "hub.sock", rpc("system.whoami"))
        for _, writer in held + more:
            writer.close()
    assert waited <= HEAD_SECONDS + 2
    assert after.startswith(b"HTTP/1.1 200"), after
    # Nothing incomplete ever reached the Hub: it answered the one request that was whole.
    assert hub.connections == 1
    refusals = [r.getMessage() for r in caplog.records if "door refused" in r.getMessage()]
    assert len(refusals) == 2, refusals
    assert any(f"past {DOOR_CONNECTIONS} at once" in text for text in refusals)
    assert any(f"not complete within {HEAD_SECONDS:g}s" in text for text in refusals)
