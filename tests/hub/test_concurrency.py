"""Many clients doing read-modify-write on one document: conflicts, retries, no update lost."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from hub.client import HubClient
from hub.errors import Conflict
from tests.conftest import HubProcess

pytestmark = pytest.mark.e2e

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
