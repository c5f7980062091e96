"""Many clients doing read-modify-write on one document: conflicts, retries, no update lost."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from hub.client import HubClient
from hub.errors import Conflict
from hub.store import MemoryStore
from tests.conftest import HubProcess

COUNTER = "counters/shared.md"


@dataclass
class Tally:
    successes: int = 0
    conflicts: int = 0


def parse_count(content: str) -> int:
    assert content.startswith("count: "), content
    return int(content.splitlines()[0].removeprefix("count: "))


def render(count: int, writer: int) -> str:
    return f"count: {count}\nlast writer: {writer}\n"


async def increment(hub: HubClient, writer: int, times: int, tally: Tally) -> None:
    done = 0
    while done < times:
        page = await hub.memory_get(COUNTER)
        count = parse_count(page["content"])
        try:
            await hub.memory_upsert(COUNTER, render(count + 1, writer), page["revision"])
        except Conflict as conflict:
            assert conflict.observed_revision != page["revision"]
            tally.conflicts += 1
            continue
        tally.successes += 1
        done += 1


async def test_sixteen_rpc_clients_incrementing_one_counter_lose_no_update(
    hub_process: HubProcess,
) -> None:
    await asyncio.to_thread(hub_process.enable_memory)
    token = hub_process.owner_token
    async with HubClient(hub_process.url, token) as setup:
        await setup.memory_upsert(COUNTER, render(0, -1), "absent")

    writers, times = 16, 6
    tally = Tally()
    clients = [HubClient(hub_process.url, token) for _ in range(writers)]
    try:
        await asyncio.wait_for(
            asyncio.gather(
                *(increment(client, n, times, tally) for n, client in enumerate(clients))
            ),
            timeout=120,
        )
    finally:
        await asyncio.gather(*(client.close() for client in clients))

    async with HubClient(hub_process.url, token) as check:
        final = await check.memory_get(COUNTER)
    assert tally.successes == writers * times
    assert parse_count(final["content"]) == tally.successes
    # The clients really raced: some writes were refused and retried.
    assert tally.conflicts > 0


async def test_concurrent_creates_of_one_path_let_exactly_one_win(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memory")
    store.open()

    async def create(n: int) -> str | None:
        try:
            return (await store.upsert("global", "once.md", f"writer {n}\n", "absent"))["revision"]
        except Conflict:
            return None

    results = await asyncio.gather(*(create(n) for n in range(32)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    page = await store.get("global", "once.md")
    assert page["revision"] == winners[0]
    assert page["content"].startswith("writer ")
