"""A project Session's later turns go to the worker holding its checkout, and only to it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hub.contract import TurnOutcome
from hub.errors import NotFound
from hub.executions import Executions
from hub.state import State


def add_project_row(state: State, name: str, principal_id: str) -> None:
    with state.transaction() as db:
        db.execute(
            "INSERT INTO projects (name, kind, source, default_branch, provider, principal_id,"
            " created_by, created_at) VALUES (?, 'path', '/srv/repo', 'main', 'claude', ?, ?, 0)",
            (name, principal_id, principal_id),
        )


async def test_the_second_turn_of_a_project_session_waits_for_the_worker_named_on_it(
    tmp_path: Path,
) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        executions = Executions(state, providers=("claude",))
        alice = state.add_principal("alice")
        runtime = state.add_principal("runtime", "service")
        add_project_row(state, "web", alice.id)
        first_worker = executions.register_worker("host-a", runtime.id)
        other_worker = executions.register_worker("host-b", runtime.id)

        first, session = await executions.submit(
            principal_id=alice.id,
            submitted_by=alice.id,
            provider="claude",
            prompt="one",
            project="web",
        )
        assert session.project == "web"
        claimed = await executions.claim(first_worker, runtime.id, 0)
        assert claimed is not None and claimed.execution_id == first.id
        assert executions.home_worker(session.id) == "host-a"
        assert claimed.session.project == "web"
        await executions.complete(first.id, first_worker, TurnOutcome(True, None))

        second, _ = await executions.submit(
            principal_id=alice.id,
            submitted_by=alice.id,
            provider="claude",
            prompt="two",
            session_id=session.id,
        )
        # Another worker skips it, even with nothing else to do; a plain turn it still takes.
        assert await executions.claim(other_worker, runtime.id, 0) is None
        plain, _ = await executions.submit(
            principal_id=alice.id, submitted_by=alice.id, provider="claude", prompt="plain"
        )
        taken = await executions.claim(other_worker, runtime.id, 0)
        assert taken is not None and taken.execution_id == plain.id
        assert executions.describe(second.id).state == "queued"
        # A restarted worker of the same name holds the same checkout.
        again = executions.register_worker("host-a", runtime.id)
        resumed = await executions.claim(again, runtime.id, 0)
        assert resumed is not None and resumed.execution_id == second.id
    finally:
        state.close()


async def test_a_turn_naming_an_unknown_project_is_refused_and_queues_nothing(
    tmp_path: Path,
) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        executions = Executions(state, providers=("claude",))
        alice = state.add_principal("alice")
        with pytest.raises(NotFound, match="no such project"):
            await executions.submit(
                principal_id=alice.id,
                submitted_by=alice.id,
                provider="claude",
                prompt="one",
                project="nope",
            )
        with sqlite3.connect(tmp_path / "state.sqlite3") as db:
            assert db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
            assert db.execute("SELECT COUNT(*) FROM executions").fetchone()[0] == 0
    finally:
        state.close()
