"""A conversation's pull request on a fake GitHub or GitLab on loopback, through the Hub's real
state database: found rather than duplicated, addressed by GitLab's encoded project path, and
refused to anyone taking no part in the conversation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hub.config import HubSettings
from hub.errors import Forbidden
from hub.services import Hub
from tests.conftest import make_repo
from tests.fakes.forge import FakeForge

TOKEN = "glpat-hubLevelForgeToken0123"


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    opened = Hub.open(HubSettings(home=tmp_path / "home"), providers=("claude",))
    try:
        yield opened
    finally:
        opened.close()


async def project_session(hub: Hub, repo: Path) -> tuple[str, str, str]:
    """A project ``web`` and a conversation of Alice's in it: (session, alice, bob)."""
    alice = hub.state.add_principal("alice", "user")
    bob = hub.state.add_principal("bob", "user")
    await hub.projects.add("web", by=alice.id, path=str(repo))
    _, session = await hub.executions.submit(
        principal_id=alice.id, submitted_by=alice.id, provider="claude", prompt="x", project="web"
    )
    return session.id, alice.id, bob.id


async def test_github_finds_the_open_pull_request_from_the_branch_rather_than_open_another(
    hub: Hub, tmp_path: Path
) -> None:
    session_id, alice_id, _ = await project_session(hub, make_repo(tmp_path / "web"))
    alice = hub.state.principal(alice_id)
    assert alice is not None
    async with FakeForge(token=TOKEN) as forge:
        # Opened by hand before anyone pressed the button.
        forge.pulls[("acme/web", 7)] = {
            "number": 7,
            "html_url": "https://forge.example/acme/web/pull/7",
            "head": "amux/abc",
            "base": "main",
            "title": "by hand",
            "body": "",
        }
        await hub.forges.set(
            "web", kind="github", token=TOKEN, by=alice_id, base_url=forge.url, repo="acme/web"
        )
        pull, opened = await hub.forges.open_or_update(
            session_id, alice, branch="amux/abc", title="the answer", body="all of it"
        )
        assert (pull.number, opened) == (7, False)
        assert len(forge.pulls) == 1 and forge.pulls[("acme/web", 7)]["body"] == "all of it"
        assert [c.method for c in forge.calls] == ["GET", "PATCH"]
        assert hub.forges.pull_request(session_id) == pull


async def test_gitlab_addresses_a_nested_project_by_its_encoded_path_and_refuses_outsiders(
    hub: Hub, tmp_path: Path
) -> None:
    session_id, alice_id, bob_id = await project_session(hub, make_repo(tmp_path / "web"))
    alice, bob = hub.state.principal(alice_id), hub.state.principal(bob_id)
    assert alice is not None and bob is not None
    async with FakeForge(token=TOKEN) as forge:
        await hub.forges.set(
            "web", kind="gitlab", token=TOKEN, by=alice_id, base_url=forge.url, repo="grp/sub/web"
        )
        with pytest.raises(Forbidden):
            await hub.forges.open_or_update(session_id, bob, branch="amux/abc", title="t", body="b")
        assert forge.calls == [] and hub.forges.pull_request(session_id) is None
        pull, opened = await hub.forges.open_or_update(
            session_id, alice, branch="amux/abc", title="t", body="b"
        )
        assert opened and forge.calls[0].path.endswith("/merge_requests")
        assert ("grp%2Fsub%2Fweb", pull.number) in forge.pulls
        again, opened = await hub.forges.open_or_update(
            session_id, alice, branch="amux/abc", title="t2", body="b2"
        )
        assert (again.number, opened) == (pull.number, False)
        assert [c.method for c in forge.calls] == ["POST", "PUT"]
        assert forge.pulls[("grp%2Fsub%2Fweb", pull.number)]["description"] == "b2"


async def test_in_a_bound_groups_conversation_whoever_sent_a_turn_may_press_and_nobody_else(
    hub: Hub, tmp_path: Path
) -> None:
    _, alice_id, bob_id = await project_session(hub, make_repo(tmp_path / "web"))
    carol = hub.state.add_principal("carol", "user")
    group = hub.projects.principal_of("web")
    _, session = await hub.executions.submit(
        principal_id=group.id,
        submitted_by=alice_id,
        provider="claude",
        prompt="start",
        workspace="topic-1",
        project="web",
    )
    await hub.executions.submit(
        principal_id=group.id,
        submitted_by=bob_id,
        provider="claude",
        prompt="go on",
        session_id=session.id,
    )
    bob = hub.state.principal(bob_id)
    assert bob is not None
    async with FakeForge(token=TOKEN) as forge:
        await hub.forges.set(
            "web", kind="github", token=TOKEN, by=alice_id, base_url=forge.url, repo="acme/web"
        )
        with pytest.raises(Forbidden):
            await hub.forges.open_or_update(
                session.id, carol, branch="amux/grp", title="t", body="b"
            )
        assert forge.calls == []
        pull, opened = await hub.forges.open_or_update(
            session.id, bob, branch="amux/grp", title="t", body="b"
        )
        assert opened and forge.pulls[("acme/web", pull.number)]["head"] == "amux/grp"


async def test_a_forge_token_is_sealed_at_rest_and_one_kept_in_the_clear_is_sealed_at_start(
    tmp_path: Path,
) -> None:
    settings = HubSettings(home=tmp_path / "home")
    hub = Hub.open(settings, providers=("claude",))
    try:
        owner = hub.state.add_principal("alice", "user")
        await hub.projects.add("web", by=owner.id, path=str(make_repo(tmp_path / "web")))
        await hub.projects.add("api", by=owner.id, path=str(make_repo(tmp_path / "api")))
        await hub.forges.set("web", kind="github", token=TOKEN, by=owner.id, repo="acme/web")
        # What a version that kept the token in the clear left behind.
        with hub.state.transaction() as db:
            db.execute(
                "INSERT INTO project_forges (project, kind, base_url, repo, token, set_by, set_at)"
                " VALUES ('api', 'gitlab', 'https://gitlab.example.com', 'acme/api', ?, ?, 0)",
                (TOKEN + "-api", owner.id),
            )
    finally:
        hub.close()

    hub = Hub.open(settings, providers=("claude",))
    try:
        web, api = hub.forges.of("web"), hub.forges.of("api")
        assert web is not None and web.token == TOKEN
        assert api is not None and api.token == TOKEN + "-api"
        hub.state.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for path in settings.state_path.parent.glob(settings.state_path.name + "*"):
            assert TOKEN.encode() not in path.read_bytes(), path
    finally:
        hub.close()
    # Without the key the tokens do not open: the owner sets them again.
    (settings.home / "secrets.key").unlink()
    hub = Hub.open(settings, providers=("claude",))
    try:
        assert hub.forges.of("web") is None
    finally:
        hub.close()
