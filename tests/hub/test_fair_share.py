"""Fair share of the workers: senders take turns at free slots, and one sender's waiting turns
are capped, refused with quota_exceeded and when to try again (in the Hub, over RPC, in the CLI)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.service.app import create_app
from hub.config import OWNER_TOKEN_FILE, HubSettings
from hub.contract import TurnOutcome, TurnResult
from hub.errors import QuotaExceeded
from hub.executions import QUEUED_RETRY_SECONDS, Executions
from hub.migrations import MIGRATIONS, run_script
from hub.state import Principal, State
from tests.conftest import running_hub, save_settings

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
    await executions.complete(row["id"], worker, TurnOutcome(True, TurnResult(text="done")))


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


async def test_a_sender_at_the_queued_cap_is_refused_with_when_to_try_again(
    state: State,
) -> None:
    executions = Executions(state, providers=PROVIDERS, max_queued_per_principal=3)
    alice, bob = state.add_principal("alice"), state.add_principal("bob")
    runtime = state.add_principal("runtime", "service")
    worker = executions.register_worker("w", runtime.id)
    for n in range(3):
        await submit(executions, alice, f"alice-{n}")

    with pytest.raises(QuotaExceeded) as refused:
        await submit(executions, alice, "one too many")
    assert refused.value.code == "quota_exceeded"
    assert refused.value.limit == "queued_turns"
    assert refused.value.retry_after == QUEUED_RETRY_SECONDS
    assert f"try again in about {QUEUED_RETRY_SECONDS} s" in refused.value.message
    count = executions.db.execute("SELECT COUNT(*) AS n FROM executions").fetchone()["n"]
    assert count == 3, "a refused submit leaves nothing behind"
    sessions = executions.db.execute("SELECT COUNT(*) AS n FROM sessions").fetchone()["n"]
    assert sessions == 3

    # Someone else is not held to Alice's count, and a running turn no longer counts as waiting.
    await submit(executions, bob, "bob-0")
    assert await claim(executions, worker, runtime) == "alice-0"
    await submit(executions, alice, "alice-3")


def owner_token(home: Path) -> str:
    return (home / OWNER_TOKEN_FILE).read_text().strip()


async def test_submit_over_the_cap_answers_quota_exceeded_with_retry_after_over_rpc(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    home = tmp_path / "amux-home"
    save_settings(home, {"turns.max_queued_per_principal": 2})
    client = await aiohttp_client(create_app(HubSettings(home=home)))
    headers = {"Authorization": f"Bearer {owner_token(home)}"}

    async def submit_rpc() -> tuple[int, dict[str, Any]]:
        response = await client.post(
            "/rpc/v1/executions.submit",
            json={"provider": "claude", "prompt": "hello"},
            headers=headers,
        )
        return response.status, await response.json()

    assert [(await submit_rpc())[0] for _ in range(2)] == [200, 200]
    status, body = await submit_rpc()
    assert status == 422
    error = body["error"]
    assert error["code"] == "quota_exceeded"
    assert error["limit"] == "queued_turns"
    assert error["retry_after"] == QUEUED_RETRY_SECONDS


@pytest.mark.e2e
def test_the_cli_prints_the_refusal_in_one_line_and_the_cap_is_an_owner_setting(
    tmp_path: Path,
) -> None:
    settings = {"turns.max_queued_per_principal": 1}
    with running_hub(
        tmp_path / "amux-home", settings, extra_env={"AMUX_RUNTIME_IN_PROCESS": "false"}
    ) as hub:
        status, _ = hub.rpc("executions.submit", provider="claude", prompt="first")
        assert status == 200
        refused = hub.cli("agent", "run", "--provider", "claude", "second")
        assert refused.returncode == 1
        assert refused.stderr.startswith("error: quota_exceeded: ")
        assert f"try again in about {QUEUED_RETRY_SECONDS} s" in refused.stderr
        assert refused.stderr.count("\n") == 1

        changed = hub.cli(
            "system", "config", "set", "--json", "turns.max_queued_per_principal", "8"
        )
        assert changed.returncode == 0, changed.stderr
        assert changed.json()["turns.max_queued_per_principal"] == {
            "saved": 8,
            "running": 1,
            "restart_pending": True,
        }
        wrong = hub.cli("system", "config", "set", "feishu.messages_per_minute", "lots")
        assert wrong.returncode == 1
        assert wrong.stderr.startswith("error: invalid_argument: feishu.messages_per_minute")
        assert wrong.stderr.count("\n") == 1


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


async def test_in_a_shared_conversation_each_turn_counts_for_its_sender(state: State) -> None:
    executions = Executions(state, providers=PROVIDERS, max_queued_per_principal=2)
    alice, bob = state.add_principal("alice"), state.add_principal("bob")
    _, topic = await executions.submit(
        principal_id=alice.id,
        submitted_by=alice.id,
        provider="claude",
        prompt="alice starts the topic",
        origin="feishu:oc_group:om_root",
        workspace="topic-1",
    )
    await executions.submit(
        principal_id=alice.id,
        submitted_by=bob.id,
        provider="claude",
        prompt="bob in alice's topic",
        session_id=topic.id,
    )
    # One each so far, though both wait in Alice's conversation.
    await submit(executions, alice, "alice elsewhere")
    await submit(executions, bob, "bob elsewhere")
    for who in (alice, bob):
        with pytest.raises(QuotaExceeded):
            await submit(executions, who, "one too many")


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
        executions = Executions(state, providers=PROVIDERS, max_queued_per_principal=1)
        alice = state.principal_by_name("alice")
        with pytest.raises(QuotaExceeded):
            await submit(executions, alice, "after")
        runtime = state.add_principal("runtime", "service")
        worker = executions.register_worker("w", runtime.id)
        assert await claim(executions, worker, runtime) == "from before"
    finally:
        state.close()
