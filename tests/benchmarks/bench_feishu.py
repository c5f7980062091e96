"""Feishu webhook ack latency under a burst, and outbound message rate through the real client.

Run: .venv/bin/python tests/benchmarks/bench_feishu.py
Target: p99 ack < 50 ms with 200 concurrent signed events.

Ack latency: 200 events, each signed and encrypted as Feishu does (distinct event ids), posted at
once to the real ``create_app`` with Feishu on, set up as ``amux serve`` sets it up (request ids,
access log at INFO to a file, the heap startup built frozen). Two kinds of traffic:
  - group chatter: group messages that do not mention the bot (parsed, de-duplicated, ignored);
  - private ``/amux``: every event is answered after the ack with a card, so the replies to the
    fake Feishu server run behind the acks being measured.
The baseline is an aiohttp handler that reads the body and answers 200 at once, loaded by the same
client at the same concurrency. The server under test runs on its own event loop thread, the fake
Feishu on another, and the load generator on the main one, so no side waits for another's work.

Outbound: ``FeishuClient.send_text`` against the fake, many chats at once; once with the client's
own pacing (50 calls/s app-wide, 5/s per chat: the designed ceiling), once with pacing lifted (the
raw path: the client's pooled session), and one chat alone (the per-chat pace).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp
from aiohttp import web
from pydantic import SecretStr

from bot.service.heap import freeze_startup_heap
from tests.benchmarks.harness import header, ratio
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import FeishuSigner

EVENTS = 200
ROUNDS = 5
OUTBOUND = 300
ONE_CHAT = 20
APP_ID = "cli_bench"
signer = FeishuSigner(encrypt_key="ek_bench", verification_token="vt_bench", app_id=APP_ID)
T = TypeVar("T")


class LoopThread:
    """An event loop of its own in a daemon thread; ``run`` waits for a coroutine there."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(work, self.loop)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


# -- servers ---------------------------------------------------------------------------------


def feishu_settings(fake_url: str, **extra: Any) -> Any:
    from bot.config import FeishuSettings

    return FeishuSettings(
        app_id=APP_ID,
        app_secret=SecretStr("secret"),
        encrypt_key=SecretStr(signer.encrypt_key),
        verification_token=SecretStr(signer.verification_token),
        domain=fake_url,
        language="en_us",
        **extra,
    )


async def start_amux(home: Path, fake_url: str) -> tuple[web.AppRunner, str]:
    """The service as `amux serve` builds it (request ids, access log), on a loopback port."""
    from bot.service.app import create_app
    from bot.service.feishu_app import FEISHU
    from bot.service.logs import AccessLogger
    from hub.config import HubSettings

    app = create_app(HubSettings(home=home), feishu_settings=feishu_settings(fake_url))
    runner = web.AppRunner(
        app, handle_signals=False, shutdown_timeout=1.0, access_log_class=AccessLogger
    )
    await runner.setup()
    freeze_startup_heap()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    await asyncio.wait_for(app[FEISHU].identity_known.wait(), 30)
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def start_baseline() -> tuple[web.AppRunner, str]:
    async def ack(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"msg": "success"})

    from bot.service.logs import AccessLogger

    app = web.Application()
    app.router.add_post("/feishu/events", ack)
    runner = web.AppRunner(
        app, handle_signals=False, shutdown_timeout=1.0, access_log_class=AccessLogger
    )
    await runner.setup()
    freeze_startup_heap()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


class ServerTimes(logging.Handler):
    """Collects the server's own time per webhook request from the access log records."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "path", "") == "/feishu/events":
            self.seconds.append(float(getattr(record, "duration_ms", 0.0)) / 1000)

    def take(self) -> list[float]:
        taken, self.seconds = self.seconds, []
        return taken


def pending_handlers(runner: web.AppRunner) -> int:
    from bot.service.feishu_app import FEISHU

    return runner.app[FEISHU].dispatcher.pending


# -- load ------------------------------------------------------------------------------------

Signed = tuple[bytes, dict[str, str]]


def group_chatter(n: int) -> list[Signed]:
    """Group messages that do not mention the bot, from ``n`` people."""
    return [
        signer.sign(
            signer.message(
                f"chatter {i}",
                chat_type="group",
                chat_id="oc_bench_group",
                sender_open_id=f"ou_{i}",
            )
        )
        for i in range(n)
    ]


def private_commands(fake: FakeFeishu, n: int) -> list[Signed]:
    """``/amux`` from ``n`` people, each in their private chat with the bot."""
    events = []
    for i in range(n):
        stored = fake.add_message(f"oc_p2p_b{i}", "/amux")
        message = signer.message(
            "/amux",
            chat_id=stored.chat_id,
            message_id=stored.message_id,
            sender_open_id=f"ou_b{i}",
            sender_union_id=f"on_b{i}",
            sender_user_id=None,
        )
        events.append(signer.sign(message))
    return events


async def _bursts(conn: Connection) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        while True:
            job = await asyncio.to_thread(conn.recv)
            if job is None:
                return
            url, events = job

            async def one(body: bytes, headers: dict[str, str], url: str = url) -> float:
                start = time.perf_counter()
                async with http.post(f"{url}/feishu/events", data=body, headers=headers) as answer:
                    await answer.read()
                    if answer.status != 200:
                        raise RuntimeError(f"status {answer.status}: {await answer.text()}")
                return time.perf_counter() - start

            conn.send(list(await asyncio.gather(*(one(b, h) for b, h in events))))


def load_generator(conn: Connection) -> None:
    """The client, in its own process so it takes no CPU time from the server's interpreter.

    Its heap is frozen like the servers': a full collection over the modules this script imports
    would otherwise stall a whole burst on the client side.
    """
    freeze_startup_heap()
    asyncio.run(_bursts(conn))


class Load:
    """Bursts of signed events sent by the load-generator process, keeping its connections."""

    def __init__(self) -> None:
        self._conn, child = multiprocessing.get_context("spawn").Pipe()
        self._process = multiprocessing.get_context("spawn").Process(
            target=load_generator, args=(child,), daemon=True
        )
        self._process.start()

    async def burst(self, url: str, events: list[Signed]) -> list[float]:
        """Post every event at once; seconds from sending each to its complete answer."""
        self._conn.send((url, events))
        latencies: list[float] = await asyncio.to_thread(self._conn.recv)
        return latencies

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(10)


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def describe(samples: list[float]) -> str:
    p50, p99 = percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
    return f"p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  max {max(samples) * 1000:6.1f} ms"


async def until_idle(runner: web.AppRunner, seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while pending_handlers(runner):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"handlers still running after {seconds}s")
        await asyncio.sleep(0.01)


async def ack_latency(base: Path, fake: FakeFeishu, load: Load) -> None:
    client: dict[str, list[float]] = {}
    server: dict[str, list[float]] = {}
    times = ServerTimes()
    logging.getLogger("aiohttp.access").addHandler(times)

    async def rounds(key: str, url: str, make: Callable[[], list[Signed]], n: int) -> None:
        client[key] = []
        for _ in range(n):
            client[key] += await load.burst(url, make())
        server[key] = times.take()

    runner, url = await start_baseline()
    try:
        await load.burst(url, group_chatter(EVENTS))  # warm-up: opens the connections
        times.take()
        await rounds("baseline", url, lambda: group_chatter(EVENTS), ROUNDS)
    finally:
        await runner.cleanup()

    runner, url = await start_amux(base / "amux-home", fake.url)
    try:
        await load.burst(url, group_chatter(EVENTS))  # warm-up
        times.take()
        await rounds("chatter", url, lambda: group_chatter(EVENTS), ROUNDS)

        # First contact: each sender is enrolled as a new Principal behind the ack.
        replies_before = len(fake.calls("POST", "/reply"))
        start = time.perf_counter()
        await rounds("first", url, lambda: private_commands(fake, EVENTS), 1)
        await until_idle(runner, 120)
        drained = [time.perf_counter() - start]
        client["commands"], server["commands"] = [], []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            client["commands"] += await load.burst(url, private_commands(fake, EVENTS))
            server["commands"] += times.take()
            await until_idle(runner, 120)
            drained.append(time.perf_counter() - start)
            times.take()
        replies = len(fake.calls("POST", "/reply")) - replies_before
    finally:
        await runner.cleanup()
        logging.getLogger("aiohttp.access").removeHandler(times)

    base_p99 = percentile(client["baseline"], 99)
    print(f"webhook ack, bursts of {EVENTS} concurrent signed events, seen by the client:")
    print(f"  {'baseline (answers 200)':<30} {describe(client['baseline'])}")
    labels = (
        ("chatter", "group chatter (ignored)"),
        ("first", "/amux, first contact (1 burst)"),
        ("commands", "/amux, enrolled (card reply)"),
    )
    for key, label in labels:
        samples = client[key]
        verdict = "meets" if percentile(samples, 99) < 0.050 else "MISSES"
        print(
            f"  {label:<30} {describe(samples)}  "
            f"p99 {ratio(percentile(samples, 99), base_p99)} of baseline; {verdict} 50 ms"
        )
    print("the same requests, time inside the server (access log duration):")
    for key, label in (("baseline", "baseline (answers 200)"), *labels):
        print(f"  {label:<30} {describe(server[key])}")
    print(
        f"  /amux: {replies} card replies posted; each burst's replies all sent within "
        f"median {statistics.median(drained):.2f} s (client pacing: 50 calls/s app-wide)"
    )


# -- outbound --------------------------------------------------------------------------------


async def outbound_rate(fake: FakeFeishu) -> None:
    from bot.feishu.client import FeishuClient
    from bot.feishu.ratelimit import Pacer, SlidingWindow

    settings = feishu_settings(fake.url)
    unpaced = Pacer(SlidingWindow(1_000_000, 1.0), SlidingWindow(1_000_000, 1.0))
    print(f"outbound FeishuClient.send_text against the fake ({OUTBOUND} messages):")
    for label, pacer, chats, count in (
        ("many chats, client pacing", None, OUTBOUND, OUTBOUND),
        ("many chats, pacing lifted", unpaced, OUTBOUND, OUTBOUND),
        ("one chat, client pacing", None, 1, ONE_CHAT),
    ):
        client = FeishuClient(settings, pacer=pacer)
        try:
            await client.send_text("oc_warm", "warm-up")  # token fetch and connection
            start = time.perf_counter()
            await asyncio.gather(
                *(client.send_text(f"oc_out_{i % chats}", f"message {i}") for i in range(count))
            )
            elapsed = time.perf_counter() - start
        finally:
            await client.close()
        print(f"  {label:<27} {count / elapsed:7.1f} messages/s ({count} in {elapsed:.2f} s)")


async def main() -> None:
    header("Feishu webhook ack latency and outbound rate")
    load = Load()
    fake_thread = LoopThread("bench-fake-feishu")
    fake = FakeFeishu(app_id=APP_ID)
    await fake_thread.run(fake.__aenter__())
    with tempfile.TemporaryDirectory(prefix="amux-bench-feishu-") as tmp:
        base = Path(tmp)
        log = (base / "serve.log").open("a", encoding="utf-8")
        from bot.service.logs import LogSettings, configure

        configure(LogSettings(format="json", level="INFO"), stream=log)
        try:
            await ack_latency(base, fake, load)
            await outbound_rate(fake)
        finally:
            load.close()
            logging.getLogger().handlers.clear()
            log.close()
            await fake_thread.run(fake.__aexit__())
            fake_thread.close()


if __name__ == "__main__":
    asyncio.run(main())
