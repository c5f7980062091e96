"""memory.get requests per second with 32 concurrent clients, against an aiohttp hello-world.

Both servers run as subprocesses on loopback and are driven by the same client code. The
hello-world logs each request at INFO like `amux serve` does, so both pay for an access log.

Run: .venv/bin/python tests/benchmarks/bench_get.py
Target: memory.get at 50% or more of the hello-world's rate.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.harness import free_port, header, hub_server, stopping, wait_healthy

CLIENTS = 32
SLICE = 1.0
ROUNDS = 5
WARM_UP = 0.5
DOCUMENT = "# Review format\n" + "conclusion, evidence, unresolved questions; 发布流程\n" * 20

HELLO_WORLD = """
import logging, sys
from aiohttp import web

async def hello(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"hello": "world"})

async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
app = web.Application()
app.router.add_post("/rpc/v1/memory.get", hello)
app.router.add_get("/healthz", health)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


async def drive(url: str, token: str, seconds: float) -> tuple[int, int]:
    """Completed and failed requests in ``seconds`` from CLIENTS concurrent loops."""
    import aiohttp

    body = b'{"path":"topics/review-format.md"}'
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    done = 0
    failures = 0
    stop_at = time.monotonic() + seconds

    async def loop(session: aiohttp.ClientSession) -> None:
        nonlocal done, failures
        while time.monotonic() < stop_at:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status == 200:
                    done += 1
                else:
                    failures += 1

    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(loop(session) for _ in range(CLIENTS)))
    return done, failures


async def alternate(targets: dict[str, tuple[str, str]]) -> dict[str, tuple[float, int]]:
    """Requests/s per target, driving them in turn for SLICE seconds each, ROUNDS times.

    Other work on the machine comes and goes; taking turns lets it hit every target alike.
    """
    totals = dict.fromkeys(targets, 0)
    failures = dict.fromkeys(targets, 0)
    for url, token in targets.values():
        await drive(url, token, WARM_UP)
    for _ in range(ROUNDS):
        for name, (url, token) in targets.items():
            done, failed = await drive(url, token, SLICE)
            totals[name] += done
            failures[name] += failed
    return {name: (totals[name] / (SLICE * ROUNDS), failures[name]) for name in targets}


def main() -> None:
    header(
        f"memory.get with {CLIENTS} concurrent clients, "
        f"{ROUNDS} alternating slices of {SLICE:.0f} s each"
    )
    with tempfile.TemporaryDirectory(prefix="amux-bench-") as tmp:
        base = Path(tmp)
        home = base / "home"
        doc = home / "memory" / "global" / "topics" / "review-format.md"
        doc.parent.mkdir(parents=True)
        doc.write_text(DOCUMENT)
        port = free_port()
        with (base / "hello.log").open("ab") as log:
            hello = subprocess.Popen(
                [sys.executable, "-c", HELLO_WORLD, str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        with stopping(hello), hub_server(home) as server:
            hello_url = f"http://127.0.0.1:{port}"
            wait_healthy(f"{hello_url}/healthz", hello)
            rates = asyncio.run(
                alternate(
                    {
                        "hello": (f"{hello_url}/rpc/v1/memory.get", "unused"),
                        "hub": (f"{server.url}/rpc/v1/memory.get", server.token),
                    }
                )
            )
    (hello_rate, hello_failed), (hub_rate, hub_failed) = rates["hello"], rates["hub"]
    print(f"aiohttp hello-world: {hello_rate:8.0f} requests/s  (non-200: {hello_failed})")
    print(
        f"Hub memory.get:      {hub_rate:8.0f} requests/s  (non-200: {hub_failed})"
        f"  = {hub_rate / hello_rate:.0%} of hello-world"
    )


if __name__ == "__main__":
    main()
