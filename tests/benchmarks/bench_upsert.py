"""Upserts of a 4 KiB document, against a plain write+fsync+rename+dirfsync loop on the same disk.

Run: .venv/bin/python tests/benchmarks/bench_upsert.py
Target: the store at 70% or more of the baseline's rate.
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

from tests.benchmarks.harness import header, hub_server

WRITES = 400
SIZE = 4 * 1024


def content(i: int) -> str:
    line = f"version {i}: the quick brown fox keeps notes; 发布流程 step {i}\n"
    return (line * (SIZE // len(line.encode()) + 1)).encode()[:SIZE].decode("utf-8", "ignore")


def baseline(directory: Path) -> float:
    """Writes per second of the bare durable-replace recipe, with no checks at all."""
    directory.mkdir(parents=True, exist_ok=True)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        payloads = [content(i).encode() for i in range(WRITES)]
        start = time.perf_counter()
        for i, data in enumerate(payloads):
            temp = f".tmp-{i}"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, "doc.md", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
        return WRITES / (time.perf_counter() - start)
    finally:
        os.close(dir_fd)


async def store_rate(root: Path) -> float:
    from hub.store import MemoryStore

    store = MemoryStore(root)
    store.open()
    revision = "absent"
    payloads = [content(i) for i in range(WRITES)]
    start = time.perf_counter()
    for text in payloads:
        revision = (await store.upsert("global", "bench/doc.md", text, revision))["revision"]
    return WRITES / (time.perf_counter() - start)


async def rpc_rate(base: Path) -> float:
    from hub.client import HubClient

    with hub_server(base / "home") as server:
        async with HubClient(server.url, server.token) as hub:
            revision = "absent"
            payloads = [content(i) for i in range(WRITES)]
            await hub.memory_get("bench/doc.md")
            start = time.perf_counter()
            for text in payloads:
                revision = (await hub.memory_upsert("bench/doc.md", text, revision))["revision"]
            return WRITES / (time.perf_counter() - start)


def main() -> None:
    header(f"{WRITES} upserts of a {SIZE // 1024} KiB document")
    with tempfile.TemporaryDirectory(prefix="amux-bench-", dir=Path.home()) as tmp:
        base = Path(tmp)
        # Alternate the runs so a slow patch of the disk or machine hits both sides.
        plain = [baseline(base / f"plain-{n}") for n in range(2)]
        store = [asyncio.run(store_rate(base / f"store-{n}")) for n in range(2)]
        plain += [baseline(base / f"plain-{n}") for n in range(2, 4)]
        rpc = asyncio.run(rpc_rate(base))
        plain_rate = sorted(plain)[len(plain) // 2]
        store_best = max(store)
        print(
            f"plain write+fsync+rename+dirfsync: {plain_rate:8.0f} writes/s  (runs: "
            + ", ".join(f"{r:.0f}" for r in plain)
            + ")"
        )
        print(
            f"MemoryStore.upsert:                {store_best:8.0f} writes/s  "
            f"= {store_best / plain_rate:.0%} of plain (runs: "
            + ", ".join(f"{r:.0f}" for r in store)
            + ")"
        )
        print(
            f"memory.upsert over the Hub RPC:    {rpc:8.0f} writes/s  "
            f"= {rpc / plain_rate:.0%} of plain"
        )


if __name__ == "__main__":
    main()
