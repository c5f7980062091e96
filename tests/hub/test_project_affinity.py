"""A project Session's later turns go to the worker holding its checkout, and only to it."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from hub.client import HubClient
from hub.contract import ProjectSource, TurnOutcome
from hub.errors import NotFound
from hub.executions import Executions
from hub.projects import Projects
from hub.rpc import HUB
from hub.services import Hub
from hub.state import State
from tests.hub.conftest import ServeHub


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=path, check=True)
    (path / "README.md").write_text("hello\n")
    subprocess.run([*git, "add", "README.md"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], cwd=path, check=True)
    return path


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
