"""The worker's side of a launch's doors, driven over their real Unix sockets: the hub door makes
the TLS connection of an https Hub (the Agent speaks plain HTTP to it), and every door is the
Agent's uid's alone."""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
import subprocess
from pathlib import Path

import pytest
from aiohttp import web

from runtime_bridge.doors import LaunchDoors
from runtime_bridge.egress import Egress
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

    async def healthz(request: web.Request) -> web.Response:
        seen.append(request.scheme)
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
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
                b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:7802\r\nConnection: close\r\n\r\n",
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
