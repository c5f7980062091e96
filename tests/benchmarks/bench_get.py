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
SECONDS = 5.0
WARM_UP = 1.0
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


async def drive(url: str, token: str) -> tuple[float, int]:
    """Requests per second over SECONDS, after WARM_UP, with CLIENTS concurrent loops."""
    import aiohttp

    body = b'{"path":"topics/review-format.md"}'
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    counting = False
    done = 0
    failures = 0
    stop_at = time.monotonic() + WARM_UP + SECONDS

    async def loop(session: aiohttp.ClientSession) -> None:
        nonlocal done, failures
        while time.monotonic() < stop_at:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    failures += 1
                elif counting:
                    done += 1

    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.create_task(loop(session)) for _ in range(CLIENTS)]
        await asyncio.sleep(WARM_UP)
        counting = True
        started = time.monotonic()
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
    return done / elapsed, failures


def hub_rate(base: Path) -> tuple[float, int]:
    home = base / "home"
    doc = home / "memory" / "global" / "topics" / "review-format.md"
    doc.parent.mkdir(parents=True)
    doc.write_text(DOCUMENT)
    with hub_server(home) as server:
        return asyncio.run(drive(f"{server.url}/rpc/v1/memory.get", server.token))


def hello_rate(base: Path) -> tuple[float, int]:
    port = free_port()
    with (base / "hello.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", HELLO_WORLD, str(port)], stdout=log, stderr=subprocess.STDOUT
        )
    with stopping(proc):
        wait_healthy(f"http://127.0.0.1:{port}/healthz", proc)
        return asyncio.run(drive(f"http://127.0.0.1:{port}/rpc/v1/memory.get", "unused"))


def main() -> None:
    header(f"memory.get with {CLIENTS} concurrent clients for {SECONDS:.0f} s")
    with tempfile.TemporaryDirectory(prefix="amux-bench-") as tmp:
        base = Path(tmp)
        hello, hello_failures = hello_rate(base)
        hub, hub_failures = hub_rate(base)
        print(f"aiohttp hello-world: {hello:8.0f} requests/s  (non-200: {hello_failures})")
        print(
            f"Hub memory.get:      {hub:8.0f} requests/s  (non-200: {hub_failures})"
            f"  = {hub / hello:.0%} of hello-world"
        )


if __name__ == "__main__":
    main()
