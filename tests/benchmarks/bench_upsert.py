"""Upserts of a 4 KiB document, against a plain write+fsync+rename+dirfsync loop on the same disk.

Over the Hub RPC with memory history on (the default: each overwritten body is kept, durably, and
the change logged) and off (``memory.history_days`` 0: only the change is logged).

Also timed in the same slices: one bare HTTP round trip to the same Hub (``GET /healthz``), the
floor under any call over the RPC. A write over the RPC costs at least the plain write plus that
round trip, which bounds its share of the plain loop on a disk that syncs fast.

Run: .venv/bin/python tests/benchmarks/bench_upsert.py
Target: over the RPC, 60% or more of the baseline's rate.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp

from tests.benchmarks.harness import header, hub_server

HISTORY_DAYS = 30

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


def save_history_days(home: Path, days: int) -> None:
    """Saved before the Hub starts, so it runs with this retention and no restart."""
    from hub.config import HubSettings
    from hub.state import State

    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    state = State(HubSettings(home=home).state_path)
    state.save_setting("memory.history_days", days)
    state.close()


async def bench(base: Path) -> dict[str, float]:
    """Seconds each way spent on WRITES writes, run in alternating slices of SLICE writes.

    Other work on the machine comes and goes; alternating slices lets it hit all four alike.
    """
    from hub.client import HubClient
    from hub.store import MemoryStore

    plain = Plain(base / "plain")
    store = MemoryStore(base / "store")
    store.open()
    spent = {"plain": 0.0, "store": 0.0, "rpc": 0.0, "rpc_no_history": 0.0, "round_trip": 0.0}
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
                    start = time.perf_counter()
                    for text in texts:
                        plain.write(text)
                    middle = time.perf_counter()
                    for text in texts:
                        written = await store.upsert("global", "bench/doc.md", text, store_revision)
                        store_revision = written.revision
                    end = time.perf_counter()
                    for text in texts:
                        written = await hub.memory_upsert("bench/doc.md", text, rpc_revision)
                        rpc_revision = written["revision"]
                    after_rpc = time.perf_counter()
                    for text in texts:
                        written = await bare.memory_upsert("bench/doc.md", text, bare_revision)
                        bare_revision = written["revision"]
                    before_round_trips = time.perf_counter()
                    for _ in texts:
                        async with http.get(f"{server.url}/healthz") as answer:
                            await answer.read()
                    spent["round_trip"] += time.perf_counter() - before_round_trips
                    spent["plain"] += middle - start
                    spent["store"] += end - middle
                    spent["rpc"] += after_rpc - end
                    spent["rpc_no_history"] += before_round_trips - after_rpc
    finally:
        plain.close()
    return spent


def main() -> None:
    header(f"{WRITES} upserts of a {SIZE // 1024} KiB document, in slices of {SLICE}")
    with tempfile.TemporaryDirectory(prefix="amux-bench-", dir=Path.home()) as tmp:
        spent = asyncio.run(bench(Path(tmp)))
    rates = {name: WRITES / seconds for name, seconds in spent.items()}
    print(f"plain write+fsync+rename+dirfsync: {rates['plain']:7.0f} writes/s")
    print(
        f"MemoryStore.upsert (in-process):   {rates['store']:7.0f} writes/s"
        f"  = {rates['store'] / rates['plain']:.0%} of plain"
    )
    print(
        f"memory.upsert over the Hub RPC, history on ({HISTORY_DAYS} days):"
        f" {rates['rpc']:7.0f} writes/s  = {rates['rpc'] / rates['plain']:.0%} of plain"
    )
    print(
        f"memory.upsert over the Hub RPC, history off (0 days): "
        f" {rates['rpc_no_history']:7.0f} writes/s"
        f"  = {rates['rpc_no_history'] / rates['plain']:.0%} of plain"
    )
    round_trip = spent["round_trip"] / WRITES
    plain = spent["plain"] / WRITES
    print(
        f"floor: one HTTP round trip to the Hub {round_trip * 1000:.2f} ms, a plain write"
        f" {plain * 1000:.2f} ms; the two alone = {plain / (plain + round_trip):.0%} of plain"
    )


if __name__ == "__main__":
    main()
