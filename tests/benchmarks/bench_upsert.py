"""Upserts of a 4 KiB document, against a plain write+fsync+rename+dirfsync loop on the same disk.

Over the Hub RPC with memory history on (the default: each overwritten body is kept, durably, and
the change logged) and off (``memory.history_days`` 0: only the change is logged).

Also timed in the same slices: one bare HTTP round trip to the same Hub (``GET /healthz``) and
one durable SQLite commit of a row (WAL, ``synchronous=FULL``, as the Hub's state database is
opened). The floor under a durable write over the RPC is the three together: the round trip, the
plain write and the commit of its change-log row. Each slice gives a ratio of the floor's time to
the RPC's; the summary is their median with the min–max.

Run: .venv/bin/python tests/benchmarks/bench_upsert.py
Target: over the RPC, 85% or more of the floor's rate.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp

from tests.benchmarks.harness import header, hub_server

HISTORY_DAYS = 30
TARGET = 0.85

WRITES = 400
SLICE = 20
SIZE = 4 * 1024


def content(i: int) -> str:
    line = f"version {i}: the quick brown fox keeps notes; 发布流程 step {i}\n"
    return (line * (SIZE // len(line.encode()) + 1)).encode()[:SIZE].decode("utf-8", "ignore")


class Plain:
    """The bare durable-replace recipe with no checks at all: the baseline."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        self.count = 0

    def write(self, text: str) -> None:
        self.count += 1
        temp = f".tmp-{self.count}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=self.dir_fd)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, "doc.md", src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        os.fsync(self.dir_fd)

    def close(self) -> None:
        os.close(self.dir_fd)


class Commits:
    """One durable SQLite commit of one row per call, the database opened as the Hub's is."""

    def __init__(self, path: Path) -> None:
        from hub.sqlite import connect

        self.db = connect(path, durable=True)
        self.db.execute("CREATE TABLE IF NOT EXISTS log (id INTEGER PRIMARY KEY, path, revision)")

    def commit(self, count: int) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("INSERT INTO log (path, revision) VALUES (?, ?)", ("bench/doc.md", count))
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()


def save_history_days(home: Path, days: int) -> None:
    """Saved before the Hub starts, so it runs with this retention and no restart."""
    from hub.config import HubSettings
    from hub.state import State

    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    state = State(HubSettings(home=home).state_path)
    state.save_setting("memory.history_days", days)
    state.close()


Slices = dict[str, list[float]]


async def bench(base: Path) -> Slices:
    """Seconds each way spent on each slice of SLICE writes, the ways taking turns slice by slice.

    Other work on the machine comes and goes; alternating slices lets it hit all of them alike.
    """
    from hub.client import HubClient
    from hub.store import MemoryStore

    plain = Plain(base / "plain")
    commits = Commits(base / "floor.db")
    store = MemoryStore(base / "store")
    store.open()
    ways = ("plain", "commit", "store", "rpc", "rpc_no_history", "round_trip")
    spent: Slices = {way: [] for way in ways}
    store_revision = rpc_revision = bare_revision = "absent"
    save_history_days(base / "home", HISTORY_DAYS)
    save_history_days(base / "bare", 0)
    try:
        with hub_server(base / "home") as server, hub_server(base / "bare") as bare_server:
            async with (
                HubClient(server.url, server.token) as hub,
                HubClient(bare_server.url, bare_server.token) as bare,
                aiohttp.ClientSession() as http,
            ):
                await hub.memory_get("bench/doc.md")
                await bare.memory_get("bench/doc.md")
                for first in range(0, WRITES, SLICE):
                    texts = [content(i) for i in range(first, first + SLICE)]
                    marks = [time.perf_counter()]
                    for text in texts:
                        plain.write(text)
                    marks.append(time.perf_counter())
                    for count in range(first, first + SLICE):
                        commits.commit(count)
                    marks.append(time.perf_counter())
                    for text in texts:
                        written = await store.upsert("global", "bench/doc.md", text, store_revision)
                        store_revision = written.revision
                    marks.append(time.perf_counter())
                    for text in texts:
                        saved = await hub.memory_upsert("bench/doc.md", text, rpc_revision)
                        rpc_revision = saved["revision"]
                    marks.append(time.perf_counter())
                    for text in texts:
                        saved = await bare.memory_upsert("bench/doc.md", text, bare_revision)
                        bare_revision = saved["revision"]
                    marks.append(time.perf_counter())
                    for _ in texts:
                        async with http.get(f"{server.url}/healthz") as answer:
                            await answer.read()
                    marks.append(time.perf_counter())
                    for way, start, end in zip(ways, marks[:-1], marks[1:], strict=True):
                        spent[way].append(end - start)
    finally:
        plain.close()
        commits.close()
        store.close()
    return spent


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0%} ({min(values):.0%}–{max(values):.0%})"


def main() -> None:
    header(f"{WRITES} upserts of a {SIZE // 1024} KiB document, in slices of {SLICE}")
    with tempfile.TemporaryDirectory(prefix="amux-bench-", dir=Path.home()) as tmp:
        spent = asyncio.run(bench(Path(tmp)))
    rates = {name: WRITES / sum(seconds) for name, seconds in spent.items()}
    slices = range(len(spent["plain"]))
    floor = [spent["round_trip"][i] + spent["plain"][i] + spent["commit"][i] for i in slices]
    print(f"plain write+fsync+rename+dirfsync: {rates['plain']:7.0f} writes/s")
    print(f"durable SQLite commit of one row:  {rates['commit']:7.0f} commits/s")
    print(f"bare HTTP round trip to the Hub:   {rates['round_trip']:7.0f} requests/s")
    floor_rate = WRITES / sum(floor)
    print(f"floor (round trip + plain write + commit): {floor_rate:7.0f} writes/s")
    print(
        f"MemoryStore.upsert (in-process):   {rates['store']:7.0f} writes/s"
        f"  = {rates['store'] / rates['plain']:.0%} of plain"
    )
    for way, label in (
        ("rpc", f"history on ({HISTORY_DAYS} days)"),
        ("rpc_no_history", "history off (0 days)"),
    ):
        ratios = [floor[i] / spent[way][i] for i in slices]
        verdict = "met" if statistics.median(ratios) >= TARGET else "missed"
        print(
            f"memory.upsert over the Hub RPC, {label}: {rates[way]:7.0f} writes/s"
            f"  = {rates[way] / rates['plain']:.0%} of plain, {spread(ratios)} of the floor"
            f"  target >= {TARGET:.0%} of the floor: {verdict}"
        )


if __name__ == "__main__":
    main()
