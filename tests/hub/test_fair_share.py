"""Fair share of the workers: Principals with waiting turns take turns at free slots, so one's
backlog never holds up another's next turn for longer than a slot takes to free."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.contract import Outcome, TurnResult
from hub.executions import Executions
from hub.migrations import MIGRATIONS, run_script
from hub.state import Principal, State

PROVIDERS = ("claude",)
# The migration that records whom each turn runs as.
RUNS_AS_VERSION = next(v for v, step in MIGRATIONS if isinstance(step, str) and "runs_as" in step)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[State]:
    opened = State(tmp_path / "state.sqlite3")
    try:
        yield opened
    finally:
        opened.close()


async def submit(executions: Executions, who: Principal, prompt: str) -> str:
    execution, _ = await executions.submit(
        principal_id=who.id, submitted_by=who.id, provider="claude", prompt=prompt
    )
    return execution.id


async def claim(executions: Executions, worker: str, runtime: Principal) -> str:
    claimed = await executions.claim(worker, runtime.id, 0)
    assert claimed is not None
    return claimed.prompt


async def finish(executions: Executions, worker: str, prompt: str) -> None:
    row = executions.db.execute(
        "SELECT id FROM executions WHERE prompt = ? AND state = 'running'", (prompt,)
    ).fetchone()
    await executions.complete(row["id"], worker, Outcome(True, TurnResult(text="done")))


async def test_a_second_senders_turn_gets_the_next_free_slot_not_the_end_of_a_burst(
    state: State,
) -> None:
    executions = Executions(state, providers=PROVIDERS)
    alice, bob = state.add_principal("alice"), state.add_principal("bob")
    runtime = state.add_principal("runtime", "service")
    worker = executions.register_worker("w", runtime.id)
    for n in range(20):
        await submit(executions, alice, f"alice-{n:02d}")
    # Two slots take Alice's first two; then Bob asks.
    started = [await claim(executions, worker, runtime) for _ in range(2)]
    await submit(executions, bob, "bob")

    await finish(executions, worker, started[0])
    started.append(await claim(executions, worker, runtime))
    assert started == ["alice-00", "alice-01", "bob"]

    # Alice's backlog goes on in the order she sent it.
    for _ in range(18):
        started.append(await claim(executions, worker, runtime))
        await finish(executions, worker, started[-1])
    assert await executions.claim(worker, runtime.id, 0) is None
    assert started[3:] == [f"alice-{n:02d}" for n in range(2, 20)]


async def test_senders_with_waiting_turns_take_turns_at_a_single_slot(state: State) -> None:
    executions = Executions(state, providers=PROVIDERS)
    alice, bob, carol = (state.add_principal(name) for name in ("alice", "bob", "carol"))
    runtime = state.add_principal("runtime", "service")
    worker = executions.register_worker("w", runtime.id)
    for who, count in ((alice, 6), (bob, 3), (carol, 3)):
        for n in range(count):
            await submit(executions, who, f"{who.name}-{n}")

    order = []
    for _ in range(12):
        prompt = await claim(executions, worker, runtime)
        order.append(prompt.split("-")[0])
        await finish(executions, worker, prompt)
    assert order == ["alice", "bob", "carol"] * 3 + ["alice"] * 3


async def test_the_sender_with_fewer_running_turns_goes_first_whoever_waited_longer(
    state: State,
) -> None:
    executions = Executions(state, providers=PROVIDERS)
    alice, bob = state.add_principal("alice"), state.add_principal("bob")
    runtime = state.add_principal("runtime", "service")
    worker = executions.register_worker("w", runtime.id)
    await submit(executions, bob, "bob-0")
    await submit(executions, bob, "bob-1")
    await submit(executions, alice, "alice-0")
    await submit(executions, bob, "bob-2")
    # Bob waited longest; once he runs one, Alice (none running) comes before his next.
    assert [await claim(executions, worker, runtime) for _ in range(4)] == [
        "bob-0",
        "alice-0",
        "bob-1",
        "bob-2",
    ]


async def test_a_turn_behind_its_sessions_running_turn_lets_the_same_persons_next_one_go(
    state: State,
) -> None:
    executions = Executions(state, providers=PROVIDERS)
    alice, bob = state.add_principal("alice"), state.add_principal("bob")
    runtime = state.add_principal("runtime", "service")
    worker = executions.register_worker("w", runtime.id)
    first, session = await executions.submit(
        principal_id=alice.id, submitted_by=alice.id, provider="claude", prompt="a-1"
    )
    assert await claim(executions, worker, runtime) == "a-1"
    await executions.submit(
        principal_id=alice.id,
        submitted_by=alice.id,
        provider="claude",
        prompt="a-2 (same conversation)",
        session_id=session.id,
    )
    await submit(executions, alice, "a-3")
    await submit(executions, bob, "b-1")
    assert await claim(executions, worker, runtime) == "b-1"
    # Alice's oldest waiting turn must follow a-1 in its conversation; her other one goes.
    assert await claim(executions, worker, runtime) == "a-3"
    assert await executions.claim(worker, runtime.id, 0) is None
    await finish(executions, worker, "a-1")
    assert await claim(executions, worker, runtime) == "a-2 (same conversation)"


async def test_turns_waiting_in_a_database_from_before_the_upgrade_keep_their_place(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    for version, step in MIGRATIONS:
        if version == RUNS_AS_VERSION:
            break
        if isinstance(step, str):
            run_script(db, step)
        else:
            step(db)
    db.execute(f"PRAGMA user_version = {RUNS_AS_VERSION - 1}")
    db.execute(
        "INSERT INTO principals (id, name, kind, is_owner, created_at) "
        "VALUES ('p1', 'alice', 'user', 0, 1.0)"
    )
    db.execute(
        "INSERT INTO sessions (id, principal_id, provider, created_at, updated_at) "
        "VALUES ('s1', 'p1', 'claude', 1.0, 1.0)"
    )
    db.execute(
        "INSERT INTO executions (id, session_id, prompt, state, submitted_by, created_at, "
        "updated_at) VALUES ('e1', 's1', 'from before', 'queued', 'p1', 1.0, 1.0)"
    )
    db.close()

    state = State(path)
    try:
        executions = Executions(state, providers=PROVIDERS)
        alice = state.principal_by_name("alice")
        await submit(executions, alice, "after")
        runtime = state.add_principal("runtime", "service")
        worker = executions.register_worker("w", runtime.id)
        assert await claim(executions, worker, runtime) == "from before"
    finally:
        state.close()
