"""The Feishu bot's conversation keys are the bot's: no RPC caller can take a topic's next one."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from hub.rpc import HUB
from hub.services import Hub
from tests.hub.conftest import Served, ServeHub

Client = TestClient[Any, Any]
TOPIC = "feishu:oc_team:om_root"


@pytest.fixture
async def served(serve_hub: ServeHub) -> Served:
    return await serve_hub("owner", "bob")


def hub_of(client: Client) -> Hub:
    return client.server.app[HUB]


def counts(hub: Hub) -> tuple[int, int]:
    sessions = hub.state.db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    executions = hub.state.db.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
    return int(sessions), int(executions)


async def submit(client: Client, token: str, **params: Any) -> tuple[int, dict[str, Any]]:
    response = await client.post(
        "/rpc/v1/executions.submit",
        json={"provider": "claude", "prompt": "take over the topic", **params},
        headers={"Authorization": f"Bearer {token}"},
    )
    return response.status, await response.json()


@pytest.mark.parametrize(
    "origin",
    [TOPIC, f"{TOPIC}#1", f"{TOPIC}#7", "FEISHU:oc_team:om_root", "  feishu:oc_team:om_root"],
)
@pytest.mark.parametrize("caller", ["bob", "owner", "runtime"])
async def test_no_rpc_caller_may_submit_under_an_origin_in_the_bots_form(
    served: tuple[Client, dict[str, str]], origin: str, caller: str
) -> None:
    client, ids = served
    status, body = await submit(client, ids[f"{caller}-token"], origin=origin)
    assert status == 403
    assert body["error"]["code"] == "forbidden"
    message = body["error"]["message"]
    assert "\n" not in message and "Feishu bot" in message
    hub = hub_of(client)
    assert counts(hub) == (0, 0)
    assert hub.executions.session_by_origin(origin) is None


async def test_the_bot_still_opens_the_topics_conversation_after_a_refused_claim(
    served: tuple[Client, dict[str, str]],
) -> None:
    client, ids = served
    status, _ = await submit(client, ids["bob-token"], origin=f"{TOPIC}#1")
    assert status == 403
    hub = hub_of(client)
    # The bot queues a topic's turn in-process, as its sender (here the owner).
    owner = hub.state.owner()
    assert owner is not None
    _, session = await hub.executions.submit(
        principal_id=owner.id,
        submitted_by=owner.id,
        provider="claude",
        prompt="the topic's next message",
        origin=f"{TOPIC}#1",
    )
    found = hub.executions.session_by_origin(f"{TOPIC}#1")
    assert found is not None and found.id == session.id and found.principal_id == owner.id


async def test_an_origin_of_the_callers_own_still_names_its_conversation(
    served: tuple[Client, dict[str, str]],
) -> None:
    client, ids = served
    status, first = await submit(client, ids["bob-token"], origin="cli:release-notes")
    assert status == 200, first
    status, again = await submit(client, ids["bob-token"], origin="cli:release-notes")
    assert status == 200, again
    assert again["session"]["id"] == first["session"]["id"]
    assert first["session"]["origin"] == "cli:release-notes"
