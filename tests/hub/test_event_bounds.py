"""A turn's events are bounded: however much a worker reports, the state database keeps at most
``agents.max_events_per_turn`` events and ``agents.max_event_bytes_per_turn`` bytes of them, says
so once as the bound is reached and once more at the end, and the turn finishes with its answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.eventbudget import DEFAULT_MAX_BYTES, MAX_EVENT_BYTES, cut_to_bytes, text_bytes
from hub.rpc import HUB
from hub.services import Hub
from tests.hub.conftest import Served, ServeHub
from tests.hub.test_approvals import Client, call, rpc, running_turn

pytestmark = pytest.mark.timeout(240)

EVENTS = 6000
EVENT_TEXT = "x" * (16 * 1024)


@pytest.fixture
async def served(serve_hub: ServeHub) -> Served:
    return await serve_hub("owner", "alice")


def logical_size(hub: Hub) -> int:
    """The state database's size as its pages, the write-ahead log's included."""
    pages = hub.state.db.execute("PRAGMA page_count").fetchone()[0]
    page_size = hub.state.db.execute("PRAGMA page_size").fetchone()[0]
    return int(pages) * int(page_size)


def kept(hub: Hub, execution_id: str) -> tuple[int, int]:
    row = hub.state.db.execute(
        "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(text AS BLOB))), 0) FROM execution_events "
        "WHERE execution_id = ? AND kind = 'progress'",
        (execution_id,),
    ).fetchone()
    return int(row[0]), int(row[1])


async def report(
    client: Client, token: str, execution: str, worker: str, texts: list[str]
) -> list[int]:
    """Each text as one progress event, as a worker reports them, fifty at a time."""
    seqs: list[int] = []
    for start in range(0, len(texts), 50):
        answers = await asyncio.gather(
            *(
                rpc(
                    client,
                    token,
                    "executions.event",
                    execution_id=execution,
                    worker_id=worker,
                    kind="progress",
                    text=text,
                )
                for text in texts[start : start + 50]
            )
        )
        seqs += [answer["seq"] for answer in answers]
    return seqs


async def complete(client: Client, token: str, execution: str, worker: str) -> dict[str, Any]:
    answer: dict[str, Any] = await rpc(
        client,
        token,
        "executions.complete",
        execution_id=execution,
        worker_id=worker,
        succeeded=True,
        result={"text": "the answer", "usage": {}, "warnings": []},
    )
    return answer


async def test_six_thousand_events_of_16_kb_keep_the_state_database_within_the_byte_bound(
    served: Served,
) -> None:
    client, ids = served
    hub: Hub = client.server.app[HUB]
    runtime = ids["runtime-token"]
    execution, _, worker = await running_turn(client, ids)
    before = logical_size(hub)

    seqs = await report(client, runtime, execution, worker, [EVENT_TEXT] * EVENTS)

    count, size = kept(hub, execution)
    assert DEFAULT_MAX_BYTES - 2 * len(EVENT_TEXT) < size <= DEFAULT_MAX_BYTES
    # The rest were counted, not kept: the worker hears 0 for each and goes on.
    assert seqs.count(0) == EVENTS - count
    assert logical_size(hub) - before <= DEFAULT_MAX_BYTES * 5 // 4

    finished = await complete(client, runtime, execution, worker)
    assert finished["state"] == "succeeded"
    assert finished["result"]["text"] == "the answer"
    watched = await rpc(
        client, ids["alice-token"], "executions.watch", execution_id=execution, after=0
    )
    warnings = [e["text"] for e in watched["events"] if e["kind"] == "warning"]
    assert len(warnings) == 2
    assert "reached its bound of 2000 events or 4.0 MiB" in warnings[0]
    assert warnings[1].startswith(f"{EVENTS - count} more event(s), ")
    assert "were not recorded" in warnings[1]


async def test_the_count_bound_is_an_owner_setting_and_applies_to_the_next_turn(
    served: Served,
) -> None:
    client, ids = served
    hub: Hub = client.server.app[HUB]
    runtime = ids["runtime-token"]
    saved = await rpc(
        client,
        ids["owner-token"],
        "system.config.set",
        key="agents.max_events_per_turn",
        value="100",
    )
    assert saved["agents.max_events_per_turn"]["saved"] == 100
    status, refused = await call(
        client,
        ids["alice-token"],
        "system.config.set",
        key="agents.max_events_per_turn",
        value="100000",
    )
    assert status == 403, refused
    status, refused = await call(
        client, ids["owner-token"], "system.config.set", key="agents.max_events_per_turn", value=0
    )
    assert status == 400 and "from 1 to" in refused["error"]["message"]

    execution, _, worker = await running_turn(client, ids)
    await report(client, runtime, execution, worker, [f"line {n}" for n in range(1000)])
    assert kept(hub, execution)[0] == 100
    await complete(client, runtime, execution, worker)
    events = hub.executions.events(execution)
    progress = [e.text for e in events if e.kind == "progress"]
    assert progress == [f"line {n}" for n in range(100)]
    assert events[-1].kind == "warning"
    assert events[-1].text.startswith("900 more event(s), ")


async def test_one_event_is_cut_at_16_kib_of_utf8_however_many_characters_it_has(
    served: Served,
) -> None:
    client, ids = served
    hub: Hub = client.server.app[HUB]
    execution, _, worker = await running_turn(client, ids)
    # 16,384 characters of three bytes each: a bound on characters would keep 48 KiB.
    await report(client, ids["runtime-token"], execution, worker, ["界" * MAX_EVENT_BYTES])
    (event,) = [e for e in hub.executions.events(execution) if e.kind == "progress"]
    assert text_bytes(event.text) <= MAX_EVENT_BYTES
    assert event.text == "界" * (MAX_EVENT_BYTES // 3)


async def test_a_memory_change_and_a_permission_request_get_through_past_the_bound(
    served: Served,
) -> None:
    client, ids = served
    hub: Hub = client.server.app[HUB]
    runtime = ids["runtime-token"]
    await rpc(
        client, ids["owner-token"], "system.config.set", key="agents.max_events_per_turn", value=5
    )
    execution, _, worker = await running_turn(client, ids)
    await report(client, runtime, execution, worker, ["chatter"] * 20)
    asked = await rpc(
        client,
        runtime,
        "executions.ask",
        execution_id=execution,
        worker_id=worker,
        tool="Bash",
        action="command",
        subject="touch x",
    )
    saved = '{"op": "saved", "path": "notes.md", "revision": "b", "previous_revision": "a"}'
    read = '{"op": "read", "path": "notes.md", "revision": "b"}'
    assert await hub.executions.add_hub_event(execution, "memory", saved, bounded=False) > 0
    assert await hub.executions.add_hub_event(execution, "memory", read) == 0
    kinds = [e.kind for e in hub.executions.events(execution)]
    assert kinds.count("progress") == 5
    assert kinds.count("approval") == 1 and kinds.count("memory") == 1
    pending = [e.approval() for e in hub.executions.events(execution) if e.kind == "approval"]
    assert pending[0] is not None and pending[0].request_id == asked["request_id"]


@given(st.text(), st.integers(min_value=0, max_value=64))
def test_a_cut_never_splits_a_character_and_keeps_within_its_bytes(text: str, limit: int) -> None:
    cut = cut_to_bytes(text, limit)
    assert text.startswith(cut)
    assert text_bytes(cut) <= max(limit, 0)
    assert len(cut) == len(text) or text_bytes(text[: len(cut) + 1]) > limit
