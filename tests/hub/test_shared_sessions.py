"""A shared conversation (a group topic) runs each turn as its sender, not as its starter."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from hub.rpc import HUB
from hub.services import Hub
from tests.hub.conftest import Served, ServeHub

Client = TestClient[Any, Any]
TOPIC = "feishu:oc_team:om_root"
WORKSPACE = "topic-" + "ab" * 16


@pytest.fixture
async def served(serve_hub: ServeHub) -> Served:
    return await serve_hub("alice", "mallory", memory=True)


async def rpc(client: Client, token: str, method: str, **params: Any) -> dict[str, Any]:
    response = await client.post(
        f"/rpc/v1/{method}", json=params, headers={"Authorization": f"Bearer {token}"}
    )
    body = await response.json()
    assert response.status == 200, body
    return dict(body)


async def launched_as(client: Client, ids: dict[str, str], session: str, execution: str) -> str:
    """Whom a worker's delegated credential for ``execution`` speaks as."""
    delegated = await rpc(
        client,
        ids["runtime-token"],
        "sessions.memory",
        session_id=session,
        capable=True,
        execution_id=execution,
    )
    assert delegated["token"], delegated
    who = await rpc(client, delegated["token"], "system.whoami")
    return str(who["principal"]["id"])


async def test_each_turn_of_a_shared_topic_is_its_senders_own(
    served: tuple[Client, dict[str, str]],
) -> None:
    client, ids = served
    hub: Hub = client.server.app[HUB]
    first, session = await hub.executions.submit(
        principal_id=ids["alice"],
        submitted_by=ids["alice"],
        provider="claude",
        prompt="start",
        origin=TOPIC,
        workspace=WORKSPACE,
    )
    reply, same = await hub.executions.submit(
        principal_id=session.principal_id,
        submitted_by=ids["mallory"],
        provider="claude",
        prompt="reply",
        origin=TOPIC,
    )
    assert same.id == session.id and same.workspace == WORKSPACE
    assert await launched_as(client, ids, session.id, first.id) == ids["alice"]
    assert await launched_as(client, ids, session.id, reply.id) == ids["mallory"]


async def test_a_personal_conversation_runs_as_its_principal_whoever_queued_the_turn(
    served: tuple[Client, dict[str, str]],
) -> None:
    client, ids = served
    hub: Hub = client.server.app[HUB]
    # A service queueing a turn for alice (as the CLI's --principal would) runs it as alice.
    queued, session = await hub.executions.submit(
        principal_id=ids["alice"], submitted_by=ids["runtime"], provider="claude", prompt="hi"
    )
    assert session.workspace is None
    assert await launched_as(client, ids, session.id, queued.id) == ids["alice"]
