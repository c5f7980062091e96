"""memory.get requests per second with 32 concurrent clients, against an aiohttp hello-world.

Both servers run as subprocesses on loopback and are driven by the same client code. The
hello-world logs each request at INFO like `amux serve` does, so both pay for an access log.

Each round drives the hello-world and then the Hub for one slice; a round's ratio is the Hub's
rate over the hello-world's, and the summary is the median of the rounds with their min–max.

Run: .venv/bin/python tests/benchmarks/bench_get.py
Target: memory.get at 65% or more of the hello-world's rate.
"""

from __future__ import annotations

import asyncio
import statistics
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
ROUNDS = 7
TARGET = 0.65
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


async def alternate(targets: dict[str, tuple[str, str]]) -> dict[str, list[tuple[float, int]]]:
    """Requests/s and failures per target in each of ROUNDS rounds, driving the targets in turn
    for SLICE seconds each.

    Other work on the machine comes and goes; taking turns lets it hit every target alike.
    """
    rounds: dict[str, list[tuple[float, int]]] = {name: [] for name in targets}
    for url, token in targets.values():
        await drive(url, token, WARM_UP)
    for _ in range(ROUNDS):
        for name, (url, token) in targets.items():
            done, failed = await drive(url, token, SLICE)
            rounds[name].append((done / SLICE, failed))
    return rounds


def spread(values: list[float], form: str) -> str:
    return f"{statistics.median(values):{form}} ({min(values):{form}}–{max(values):{form}})"


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
            rounds = asyncio.run(
                alternate(
                    {
                        "hello": (f"{hello_url}/rpc/v1/memory.get", "unused"),
                        "hub": (f"{server.url}/rpc/v1/memory.get", server.token),
                    }
                )
            )
    hello_rates = [rate for rate, _ in rounds["hello"]]
    hub_rates = [rate for rate, _ in rounds["hub"]]
    ratios = [hub / hello for hub, hello in zip(hub_rates, hello_rates, strict=True)]
    verdict = "met" if statistics.median(ratios) >= TARGET else "missed"
    print(
        f"aiohttp hello-world: {spread(hello_rates, '.0f')} requests/s"
        f"  (non-200: {sum(failed for _, failed in rounds['hello'])})"
    )
    print(
        f"Hub memory.get:      {spread(hub_rates, '.0f')} requests/s"
        f"  (non-200: {sum(failed for _, failed in rounds['hub'])})"
    )
    print(
        f"Hub / hello-world:   {spread(ratios, '.0%')}"
        f"  target >= {TARGET:.0%} of hello-world: {verdict}"
    )


if __name__ == "__main__":
    main()
