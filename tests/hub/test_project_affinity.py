"""A project Session's later turns go to the worker holding its checkout, and only to it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hub.client import HubClient
from hub.contract import ProjectSource, TurnOutcome
from hub.errors import Forbidden, InvalidArgument, NotFound
from hub.executions import Executions, moves_to_worker, waits_for_worker
from hub.projects import Projects
from hub.rpc import HUB
from hub.services import Hub
from hub.state import State
from tests.conftest import make_repo
from tests.hub.conftest import ServeHub


async def test_the_second_turn_of_a_project_session_waits_for_the_worker_named_on_it(
    tmp_path: Path,
) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        executions = Executions(state, providers=("claude",))
        alice = state.add_principal("alice")
        runtime = state.add_principal("runtime", "service")
        await Projects(state).add("web", by=alice.id, path=str(make_repo(tmp_path / "repo")))
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


async def test_a_project_sessions_turns_move_once_its_worker_has_been_gone_long_enough(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    state = State(tmp_path / "state.sqlite3")
    try:
        executions = Executions(
            state, providers=("claude",), clock=lambda: now[0], home_worker_seconds=300
        )
        alice = state.add_principal("alice")
        runtime = state.add_principal("runtime", "service")
        await Projects(state).add("web", by=alice.id, path=str(make_repo(tmp_path / "repo")))
        host_a = executions.register_worker("host-a", runtime.id)
        host_b = executions.register_worker("host-b", runtime.id)

        async def turn(prompt: str, session_id: str | None = None) -> str:
            submitted, session = await executions.submit(
                principal_id=alice.id,
                submitted_by=alice.id,
                provider="claude",
                prompt=prompt,
                session_id=session_id,
                project=None if session_id else "web",
            )
            return submitted.id if session_id else session.id

        session_id = await turn("one")
        first = await executions.claim(host_a, runtime.id, 0)
        assert first is not None and first.moved_from is None
        await executions.complete(first.execution_id, host_a, TurnOutcome(True, None))

        # host-a stops being seen. For a while its conversation's turn waits for it, and says
        # how long it will wait.
        now[0] += 200
        assert await executions.claim(host_b, runtime.id, 0) is None  # host-b is seen
        second = await turn("two", session_id)
        texts = [e.text for e in executions.events(second)]
        assert texts == [waits_for_worker("host-a", 300)]
        assert "until it has been away 5 min" in texts[0]
        assert await executions.claim(host_b, runtime.id, 0) is None

        # Gone past home_worker_seconds: host-b takes the turn, and the Session is its now.
        now[0] += 101
        moved = await executions.claim(host_b, runtime.id, 0)
        assert moved is not None and moved.execution_id == second
        assert moved.moved_from == "host-a"
        assert executions.home_worker(session_id) == "host-b"
        assert executions.events(second)[-1].text == moves_to_worker("host-a", "host-b", 300)
        await executions.complete(second, host_b, TurnOutcome(True, None))

        # host-a coming back does not take it back: the next turn is host-b's, not moved.
        host_a = executions.register_worker("host-a", runtime.id)
        third = await turn("three", session_id)
        assert await executions.claim(host_a, runtime.id, 0) is None
        stays = await executions.claim(host_b, runtime.id, 0)
        assert stays is not None and stays.execution_id == third and stays.moved_from is None
        await executions.complete(third, host_b, TurnOutcome(True, None))

        # While the Hub was down nobody could be seen: after a restart, absence counts from it.
        now[0] += 3600
        restarted = Executions(
            state, providers=("claude",), clock=lambda: now[0], home_worker_seconds=300
        )
        fourth = await turn("four", session_id)
        host_a = restarted.register_worker("host-a", runtime.id)
        assert await restarted.claim(host_a, runtime.id, 0) is None
        now[0] += 301
        taken = await restarted.claim(host_a, runtime.id, 0)
        assert taken is not None and taken.execution_id == fourth
        assert taken.moved_from == "host-b"
        await restarted.complete(fourth, host_a, TurnOutcome(True, None))

        # A turn submitted once its home is already gone is not told to wait: it moves at once.
        now[0] += 400
        host_b = restarted.register_worker("host-b", runtime.id)
        fifth = await turn("five", session_id)
        assert restarted.events(fifth) == []
        moved_at_once = await restarted.claim(host_b, runtime.id, 0)
        assert moved_at_once is not None and moved_at_once.moved_from == "host-a"
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


async def test_over_rpc_the_claim_carries_the_project_and_only_its_home_worker_gets_the_next_turn(
    serve_hub: ServeHub, tmp_path: Path
) -> None:
    client, ids = await serve_hub("owner", "alice")
    hub: Hub = client.server.app[HUB]
    repo = make_repo(tmp_path / "repo")
    url = str(client.make_url(""))
    async with (
        HubClient(url, ids["owner-token"]) as owner,
        HubClient(url, ids["runtime-token"]) as runtime,
    ):
        await owner.project_add("web", path=str(repo), permissions="auto")
        await owner.config_set("projects.worktree_days", "3")
        host_a = (await runtime.register_worker("host-a")).worker_id
        host_b = (await runtime.register_worker("host-b")).worker_id
        first, session = await hub.executions.submit(
            principal_id=ids["alice"],
            submitted_by=ids["alice"],
            provider="claude",
            prompt="one",
            project="web",
        )
        claim = await runtime.claim(host_a, wait_seconds=5)
        assert claim is not None and claim.execution_id == first.id
        assert claim.project == ProjectSource("web", "path", str(repo), "main", None, 3)
        assert claim.permissions == "auto" and claim.session.project == "web"
        await runtime.complete(first.id, host_a, TurnOutcome(True, None))

        second, _ = await hub.executions.submit(
            principal_id=ids["alice"],
            submitted_by=ids["alice"],
            provider="claude",
            prompt="two",
            session_id=session.id,
        )
        assert await runtime.claim(host_b, wait_seconds=0) is None
        again = await runtime.claim(host_a, wait_seconds=5)
        assert again is not None and again.execution_id == second.id
        assert again.project is not None and again.project.name == "web"


async def test_the_owner_may_start_a_project_conversation_over_rpc_and_nobody_else(
    serve_hub: ServeHub, tmp_path: Path
) -> None:
    client, ids = await serve_hub("owner", "alice")
    url = str(client.make_url(""))
    async with (
        HubClient(url, ids["owner-token"]) as owner,
        HubClient(url, ids["alice-token"]) as alice,
    ):
        await owner.project_add("web", path=str(make_repo(tmp_path / "repo")))
        started = await owner.call(
            "executions.submit", provider="claude", prompt="one", project="web"
        )
        assert started["session"]["project"] == "web"
        with pytest.raises(Forbidden, match="only the owner may start a conversation in a"):
            await alice.call("executions.submit", provider="claude", prompt="one", project="web")
        with pytest.raises(InvalidArgument, match="leave out session_id"):
            await owner.call(
                "executions.submit",
                provider="claude",
                prompt="two",
                project="web",
                session_id=started["session"]["id"],
            )
        with pytest.raises(NotFound, match="no such project"):
            await owner.call("executions.submit", provider="claude", prompt="x", project="nope")
