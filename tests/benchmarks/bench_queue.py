"""The turn queue at scale: many submitters and many workers through one Hub, over HTTP.

TURNS turns are submitted by SUBMITTERS concurrent clients and claimed by WORKERS workers that
speak the worker protocol directly (executions.claim, one executions.event, executions.complete)
and answer at once, so what is measured is the queue, not an Agent. The Hub runs without its
in-process worker. Its CPU time comes from /proc/<pid>/stat of the `amux serve` process.

Baseline, same run: the durable floor of one turn in SQLite (WAL, synchronous=FULL, as the Hub
opens its state), i.e. three committed statements per turn (queue, claim, finish) in one loop.

Fair share: SLOTS workers whose turns take TURN_SECONDS each; one user queues a BURST-turn burst
at once, then a second user submits one turn. Reported: how long that turn waits from its submit
to its claim (target: the next free slot, about TURN_SECONDS, not the end of the burst), beside
two baselines of the same run: the same burst followed by one more turn of its own user (within a
user the queue stays first come, first served, so that turn waits for the whole burst), and one
turn on an empty queue. Median of REPEATS runs, with the fastest and slowest.

Then, with no workers: memory.search with a scope of DOCS and 10 x DOCS documents, and
executions.watch / executions.submit while WATCHES and 10 x WATCHES long polls are open.

The Hub runs without the queued-turns cap (turns.max_queued_per_principal 0): every burst here is
one user's.

Run: .venv/bin/python tests/benchmarks/bench_queue.py
Targets: 100 turns/s or more through the queue; claim p99 under 50 ms; a second user's turn
behind a burst claimed at the next free slot, about TURN_SECONDS, not at the burst's end.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.harness import header, hub_server

TURNS = 2000
SUBMITTERS = 50
WORKERS = 8
CLAIM_WAIT = 5.0
DOCS = 200
WATCHES = 20
SAMPLES = 40
SLOTS = 4
TURN_SECONDS = 0.2
BURST = 20
REPEATS = 5


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def ms(samples: list[float]) -> str:
    return (
        f"p50 {statistics.median(samples) * 1000:6.1f} ms, "
        f"p99 {percentile(samples, 0.99) * 1000:6.1f} ms"
    )


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` and all its threads so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of stat(5) (utime, stime); the split above starts at field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def durable_floor(path: Path, turns: int) -> float:
    """Turns/s when each turn is only its three durable commits, in one loop, no HTTP."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE q (id TEXT PRIMARY KEY, state TEXT, at REAL)")
    start = time.perf_counter()
    for _ in range(turns):
        turn = uuid.uuid4().hex
        db.execute("INSERT INTO q VALUES (?, 'queued', ?)", (turn, time.time()))
        db.execute("UPDATE q SET state = 'running' WHERE id = ?", (turn,))
        db.execute("UPDATE q SET state = 'succeeded' WHERE id = ?", (turn,))
    elapsed = time.perf_counter() - start
    db.close()
    return turns / elapsed


def token_for(home: Path, name: str = "bench-runtime", kind: str = "service") -> str:
    """A new Principal (the workers' service by default) and a token for it."""
    from hub.config import HubSettings
    from hub.state import State

    state = State(HubSettings(home=home).state_path)
    try:
        principal = state.add_principal(name, kind)
        token, _ = state.issue_credential(principal.id, "cli", label="bench")
    finally:
        state.close()
    return token


def without_queued_cap(home: Path) -> None:
    """Save the queued-turns cap off before the Hub starts: one user queues every burst here."""
    from hub.config import HubSettings
    from hub.state import State

    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    state = State(HubSettings(home=home).state_path)
    try:
        state.save_setting("turns.max_queued_per_principal", 0)
    finally:
        state.close()


async def run_workers(url: str, service: str) -> list[tuple[float, float, str]]:
    """WORKERS workers until TURNS turns are done: (asked, answered, execution id) per claim."""
    from hub.client import HubClient

    claims: list[tuple[float, float, str]] = []
    all_done = asyncio.Event()

    async def worker(number: int) -> None:
        async with HubClient(url, service, timeout=60) as hub:
            worker_id = (await hub.call("workers.register", name=f"bench-{number}"))["worker_id"]
            while not all_done.is_set():
                asked = time.monotonic()
                claim = await hub.call(
                    "executions.claim", worker_id=worker_id, wait_seconds=CLAIM_WAIT
                )
                answered = time.monotonic()
                if not claim:
                    continue
                execution_id = claim["execution"]["id"]
                await hub.call(
                    "executions.event",
                    execution_id=execution_id,
                    worker_id=worker_id,
                    kind="progress",
                    text="started",
                )
                await hub.call(
                    "executions.complete",
                    execution_id=execution_id,
                    worker_id=worker_id,
                    succeeded=True,
                    result={"text": claim["execution"]["prompt"]},
                )
                claims.append((asked, answered, execution_id))
                if len(claims) >= TURNS:
                    all_done.set()

    workers = [asyncio.create_task(worker(n)) for n in range(WORKERS)]
    await asyncio.wait_for(all_done.wait(), 600)
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    return claims


def worker_process(url: str, service: str, out: Connection) -> None:
    out.send(asyncio.run(run_workers(url, service)))
    out.close()


async def submit_turns(url: str, owner: str) -> tuple[list[float], dict[str, float]]:
    """TURNS submits from SUBMITTERS clients: latencies, and when each turn was acknowledged."""
    from hub.client import HubClient

    latency: list[float] = []
    acked: dict[str, float] = {}

    async def submitter(count: int) -> None:
        async with HubClient(url, owner, timeout=60) as hub:
            for _ in range(count):
                start = time.monotonic()
                answer = await hub.call("executions.submit", provider="echo", prompt="ping")
                done = time.monotonic()
                latency.append(done - start)
                acked[answer["execution"]["id"]] = done

    share, extra = divmod(TURNS, SUBMITTERS)
    await asyncio.gather(*(submitter(share + (1 if n < extra else 0)) for n in range(SUBMITTERS)))
    return latency, acked


def run_queue(url: str, owner: str, service: str, pid: int) -> dict[str, Any]:
    # The workers run in a process of their own, so neither side's client loop delays the
    # other's timings; time.monotonic() is one clock for both processes.
    receive, send = multiprocessing.Pipe(duplex=False)
    workers = multiprocessing.get_context("spawn").Process(
        target=worker_process, args=(url, service, send)
    )
    workers.start()
    time.sleep(2.0)  # the worker process has started and every worker waits in a claim
    cpu_before = cpu_seconds(pid)
    start = time.monotonic()
    submit_latency, acked = asyncio.run(submit_turns(url, owner))
    claims = receive.recv()
    finished = time.monotonic()
    cpu = cpu_seconds(pid) - cpu_before
    workers.join()
    return {
        "submit": submit_latency,
        # Claims asked before the first submit waited for work, not for the Hub.
        "claim": [answered - asked for asked, answered, _ in claims if asked >= start],
        "wait": [answered - acked[i] for _, answered, i in claims if i in acked],
        "rate": TURNS / (finished - start),
        "cpu": cpu / TURNS,
        "elapsed": finished - start,
    }


class Slots:
    """SLOTS workers whose every turn takes TURN_SECONDS; notes when each turn was claimed."""

    def __init__(self, url: str, service: str) -> None:
        self.url = url
        self.service = service
        self.claimed: dict[str, float] = {}
        self.finished: set[str] = set()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Slots:
        self._tasks = [asyncio.create_task(self._slot(n)) for n in range(SLOTS)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _slot(self, number: int) -> None:
        from hub.client import HubClient

        async with HubClient(self.url, self.service, timeout=60) as hub:
            worker_id = (await hub.call("workers.register", name=f"slot-{number}"))["worker_id"]
            while True:
                claim = await hub.call(
                    "executions.claim", worker_id=worker_id, wait_seconds=CLAIM_WAIT
                )
                if not claim:
                    continue
                execution_id = claim["execution"]["id"]
                self.claimed[execution_id] = time.monotonic()
                await asyncio.sleep(TURN_SECONDS)  # the Agent's work
                await hub.call(
                    "executions.complete",
                    execution_id=execution_id,
                    worker_id=worker_id,
                    succeeded=True,
                    result={"text": "done"},
                )
                self.finished.add(execution_id)
                self._changed.set()

    async def finish(self, ids: set[str]) -> None:
        while not ids <= self.finished:
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), 120)


async def queue_one(hub: Any, prompt: str) -> tuple[str, float]:
    """Submit a turn; its id and when the Hub acknowledged it."""
    answer = await hub.call("executions.submit", provider="echo", prompt=prompt)
    return answer["execution"]["id"], time.monotonic()


async def behind_a_burst(
    slots: Slots, first: Any, second: Any | None, prober: Any
) -> tuple[float, float]:
    """``first`` queues BURST turns at once (none when ``second`` is None), then ``prober`` one:
    seconds from that turn's ack to its claim, and to the claim of the burst's last turn."""
    burst: list[tuple[str, float]] = []
    if second is not None:
        burst = list(await asyncio.gather(*(queue_one(first, f"b{n}") for n in range(BURST))))
    probe, acked = await queue_one(prober, "probe")
    await slots.finish({probe, *(i for i, _ in burst)})
    last = max((slots.claimed[i] for i, _ in burst), default=slots.claimed[probe])
    return slots.claimed[probe] - acked, last - acked


async def fair_share(url: str, service: str, alice: str, bob: str) -> dict[str, list[float]]:
    from hub.client import HubClient

    figures: dict[str, list[float]] = {"second": [], "own": [], "burst_end": [], "empty": []}
    async with (
        Slots(url, service) as slots,
        HubClient(url, alice) as first,
        HubClient(url, bob) as other,
    ):
        await behind_a_burst(slots, first, None, other)  # every slot is polling
        for _ in range(REPEATS):
            second, end = await behind_a_burst(slots, first, other, other)
            figures["second"].append(second)
            figures["burst_end"].append(end)
            figures["own"].append((await behind_a_burst(slots, first, first, first))[0])
            figures["empty"].append((await behind_a_burst(slots, first, None, other))[0])
    return figures


def spread(samples: list[float]) -> str:
    return (
        f"{statistics.median(samples) * 1000:7.1f} ms "
        f"[{min(samples) * 1000:.1f}–{max(samples) * 1000:.1f}]"
    )


async def timed(work: Any, samples: int = SAMPLES) -> list[float]:
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        await work()
        out.append(time.perf_counter() - start)
    return out


async def search_scaling(url: str, owner: str, scope: Path) -> dict[int, list[float]]:
    from hub.client import HubClient

    body = "# Notes\n" + "release checklist, review format, on-call handover\n" * 40
    results: dict[int, list[float]] = {}
    async with HubClient(url, owner) as hub:
        written = 0
        for count in (DOCS, DOCS * 10):
            for n in range(written, count):
                path = scope / "notes" / f"{n // 100:03d}" / f"note-{n:05d}.md"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(body)
            written = count
            await asyncio.sleep(2.5)  # older than the content cache's recent-change window
            await hub.memory_search("handover checklist")
            results[count] = await timed(lambda: hub.memory_search("handover checklist"))
    return results


async def watch_scaling(url: str, owner: str) -> dict[int, tuple[list[float], list[float]]]:
    from hub.client import HubClient

    results: dict[int, tuple[list[float], list[float]]] = {}
    async with HubClient(url, owner) as hub:
        probe = (await hub.call("executions.submit", provider="echo", prompt="probe"))["execution"][
            "id"
        ]
        pollers: list[asyncio.Task[Any]] = []
        clients: list[HubClient] = []
        for count in (WATCHES, WATCHES * 10):
            while len(pollers) < count:
                client = HubClient(url, owner, timeout=120)
                clients.append(client)
                target = (await client.call("executions.submit", provider="echo", prompt="w"))[
                    "execution"
                ]["id"]
                pollers.append(
                    asyncio.create_task(
                        client.call("executions.watch", execution_id=target, wait_seconds=30)
                    )
                )
            await asyncio.sleep(1.0)
            watch = await timed(
                lambda: hub.call("executions.watch", execution_id=probe, after=1_000_000)
            )
            submit = await timed(
                lambda: hub.call("executions.submit", provider="echo", prompt="more")
            )
            results[count] = (watch, submit)
        for task in pollers:
            task.cancel()
        await asyncio.gather(*pollers, return_exceptions=True)
        for client in clients:
            await client.close()
    return results


def main() -> None:
    header(
        f"turn queue: {TURNS} turns, {SUBMITTERS} submitting clients, "
        f"{WORKERS} workers over HTTP answering at once (worker protocol, no Agent, no sandbox)"
    )
    with tempfile.TemporaryDirectory(prefix="amux-bench-") as tmp:
        base = Path(tmp)
        floor = durable_floor(base / "floor.sqlite3", 300)
        home = base / "home"
        from tests.benchmarks.harness import enable_memory_offline

        enable_memory_offline(home)
        without_queued_cap(home)
        environ = {
            "AMUX_RUNTIME_IN_PROCESS": "false",
            "AMUX_RUNTIME_PROVIDERS": '{"echo": "/bin/true"}',
        }
        with hub_server(home, **environ) as server:
            # After the start: the Hub issues the owner's token only into an empty database.
            service = token_for(home)
            queue = run_queue(server.url, server.token, service, server.pid)
            users = [token_for(home, name, "user") for name in ("bench-alice", "bench-bob")]
            shares = asyncio.run(fair_share(server.url, service, *users))
            searches = asyncio.run(search_scaling(server.url, server.token, server.scope))
            watches = asyncio.run(watch_scaling(server.url, server.token))
    print(f"durable floor (3 commits/turn, one loop, no HTTP): {floor:7.0f} turns/s")
    print(
        f"through the queue:  {queue['rate']:7.0f} turns/s  = {queue['rate'] / floor:.2f}x "
        f"the floor  ({queue['elapsed']:.1f} s)"
    )
    print(f"submit:             {ms(queue['submit'])}")
    print(f"claim (answered):   {ms(queue['claim'])}")
    print(f"submit ack → claimed: {ms(queue['wait'])}")
    print(f"Hub CPU per turn:   {queue['cpu'] * 1000:.2f} ms")
    print(
        f"fair share: {SLOTS} slots, {TURN_SECONDS * 1000:.0f} ms turns, a {BURST}-turn burst; "
        f"submit ack → claimed, median [min–max] of {REPEATS} runs:"
    )
    print(f"  a second user's turn behind the burst:   {spread(shares['second'])}")
    print(f"  baseline: the burst user's own next turn: {spread(shares['own'])}")
    print(f"  baseline: the burst's last turn:          {spread(shares['burst_end'])}")
    print(f"  baseline: a turn on an empty queue:       {spread(shares['empty'])}")
    for count, samples in searches.items():
        print(f"memory.search, {count:5d} docs: {ms(samples)}")
    for count, (watch, submit) in watches.items():
        print(f"{count:4d} open watches: executions.watch {ms(watch)}; submit {ms(submit)}")


if __name__ == "__main__":
    main()
