"""Upserts from WRITERS clients at once, each in a memory scope of its own, over the Hub RPC.

Memory isolation is on, so each writer (its own Principal and token) writes into its own scope, and
the Hub's per-scope locks let the writes proceed side by side; each is still acknowledged only after
its file and directory are synced. History is at its default (on, 30 days).

Baselines, same run: the bare write+fsync+rename+dirfsync loop, once alone and once as WRITERS
threads on distinct directories, on the same disk.

Run: .venv/bin/python tests/benchmarks/bench_upsert_parallel.py
Target: the Hub's aggregate rate at 1x the single raw loop or more.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.bench_upsert import Plain, content
from tests.benchmarks.harness import enable_memory_offline, header, hub_server

WRITERS = 16
EACH = 40


def raw_rate(base: Path, writers: int) -> float:
    """Aggregate writes/s of ``writers`` raw loops in threads, EACH writes apiece."""
    loops = [Plain(base / f"raw-{writers}-{n}") for n in range(writers)]
    texts = [content(i) for i in range(EACH)]

    def run(plain: Plain) -> None:
        for text in texts:
            plain.write(text)

    threads = [threading.Thread(target=run, args=(plain,)) for plain in loops]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    for plain in loops:
        plain.close()
    return writers * EACH / elapsed


def isolate_offline(home: Path) -> None:
    """Memory isolation on before the Hub starts, so each Principal writes its own scope."""
    from hub.config import HubSettings
    from hub.state import State

    state = State(HubSettings(home=home).state_path)
    state.save_setting("memory.isolation", "on")
    state.close()


def writer_tokens(home: Path, count: int) -> list[str]:
    from hub.config import HubSettings
    from hub.state import State

    state = State(HubSettings(home=home).state_path)
    try:
        tokens = []
        for n in range(count):
            principal = state.add_principal(f"writer-{n}", "user")
            tokens.append(state.issue_credential(principal.id, "cli", label="bench")[0])
        return tokens
    finally:
        state.close()


async def hub_rate(url: str, tokens: list[str]) -> float:
    from hub.client import HubClient

    clients = [HubClient(url, token) for token in tokens]

    async def write(hub: HubClient) -> None:
        revision = "absent"
        for i in range(EACH):
            revision = (await hub.memory_upsert("bench/doc.md", content(i), revision))["revision"]

    try:
        # One write each first: the scopes' directories exist before the clock starts.
        for hub in clients:
            await hub.memory_upsert("bench/warm.md", "warm", "absent")
        start = time.perf_counter()
        await asyncio.gather(*(write(hub) for hub in clients))
        elapsed = time.perf_counter() - start
    finally:
        for hub in clients:
            await hub.close()
    return len(clients) * EACH / elapsed


def main() -> None:
    header(f"{WRITERS} writers on distinct scopes, {EACH} upserts of 4 KiB each, over the Hub RPC")
    with tempfile.TemporaryDirectory(prefix="amux-bench-", dir=Path.home()) as tmp:
        base = Path(tmp)
        one = raw_rate(base, 1)
        many = raw_rate(base, WRITERS)
        home = base / "home"
        enable_memory_offline(home)
        isolate_offline(home)
        with hub_server(home) as server:
            # After the start: the Hub issues the owner's token only into an empty database.
            tokens = writer_tokens(home, WRITERS)
            rate = asyncio.run(hub_rate(server.url, tokens))
    print(f"raw loop, one writer:            {one:7.0f} writes/s")
    print(f"raw loops, {WRITERS} threads:           {many:7.0f} writes/s in aggregate")
    print(
        f"Hub RPC, {WRITERS} writers, isolation on: {rate:7.0f} writes/s in aggregate"
        f"  = {rate / one:.2f}x the single raw loop, {rate / many:.2f}x the {WRITERS} loops"
    )


if __name__ == "__main__":
    main()
