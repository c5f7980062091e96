"""Ids a caller may not see: the Hub's answer never tells whether one exists.

A caller that may not see an object gets, for someone else's id, byte for byte the answer an
unknown id gets; one that may not use the method at all is refused before any id is looked up.
Those who may see the object keep their answers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from bot.service.app import create_app
from hub.config import HubSettings
from hub.requestid import REQUEST_ID_HEADER
from hub.state import State

Client = TestClient[Any, Any]
PLACEHOLDER = "<id>"


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes


@dataclass
class World:
    client: Client
    tokens: dict[str, str]
    ids: dict[str, str]

    async def raw(self, who: str, method: str, **params: Any) -> tuple[Answer, str]:
        response = await self.client.post(
            f"/rpc/v1/{method}",
            json=params,
            headers={"Authorization": f"Bearer {self.tokens[who]}"},
        )
        body = await response.read()
        answer = Answer(response.status, response.headers["Content-Type"], body)
        return answer, response.headers[REQUEST_ID_HEADER]

    async def answer(self, who: str, method: str, id_field: str, id_value: str) -> Answer:
        """The answer with the id asked about written as a placeholder, so two ids compare."""
        answer, _ = await self.raw(who, method, **{id_field: id_value})
        return Answer(
            answer.status, answer.content_type, answer.body.replace(id_value.encode(), b"<id>")
        )

    async def ok(self, who: str, method: str, **params: Any) -> dict[str, Any]:
        response = await self.client.post(
            f"/rpc/v1/{method}",
            json=params,
            headers={"Authorization": f"Bearer {self.tokens[who]}"},
        )
        body: dict[str, Any] = await response.json()
        assert response.status == 200, body
        return body


@pytest.fixture
async def world(aiohttp_client: Any, tmp_path: Path) -> World:
    home = tmp_path / "home"
    state = State(HubSettings(home=home).state_path)
    tokens: dict[str, str] = {}
    ids: dict[str, str] = {}
    try:
        state.save_setting("memory.enabled", True)
        for name, kind in [
            ("alice", "user"),
            ("bob", "user"),
            ("carol", "user"),
            ("runtime", "service"),
            ("other-runtime", "service"),
        ]:
            principal = state.add_principal(name, kind, owner=name == "alice")
            ids[name] = principal.id
            tokens[name], credential = state.issue_credential(principal.id, "cli")
            ids[f"{name}-credential"] = credential.id
    finally:
        state.close()
    client = await aiohttp_client(create_app(HubSettings(home=home)))
    w = World(client, tokens, ids)
    submitted = await w.ok("bob", "executions.submit", provider="claude", prompt="bob's plan")
    ids["execution"] = submitted["execution"]["id"]
    ids["session"] = submitted["session"]["id"]
    for name in ("bob", "carol"):
        resolved = await w.ok("runtime", "memory.binding.resolve", principal_id=ids[name])
        delegated = await w.ok(
            "runtime",
            "credentials.delegate",
            principal_id=ids[name],
            binding=resolved["binding"],
        )
        tokens[f"{name}-agent"] = delegated["token"]
        ids[f"{name}-agent-credential"] = delegated["id"]
    return w


def unknown_like(known: str) -> str:
    """An id of the same length that names nothing, so the two answers are the same size."""
    return uuid.uuid4().hex[: len(known)]


# (method, the parameter naming the id, which id of the world it names)
FOLLOWING = [
    ("executions.watch", "execution_id", "execution"),
    ("executions.cancel", "execution_id", "execution"),
    ("sessions.get", "session_id", "session"),
]


@pytest.mark.parametrize(("method", "field", "target"), FOLLOWING)
async def test_another_users_turn_answers_exactly_as_an_unknown_one(
    world: World, method: str, field: str, target: str
) -> None:
    known = world.ids[target]
    mine = await world.answer("carol", method, field, known)
    unknown = await world.answer("carol", method, field, unknown_like(known))
    assert mine == unknown
    assert mine.status == 404
    assert b'"code":"not_found"' in mine.body


async def test_another_users_conversation_cannot_be_resumed_or_probed(world: World) -> None:
    session = world.ids["session"]

    async def resume(session_id: str) -> Answer:
        answer, _ = await world.raw(
            "carol",
            "executions.submit",
            provider="claude",
            prompt="mine now",
            session_id=session_id,
        )
        return Answer(
            answer.status, answer.content_type, answer.body.replace(session_id.encode(), b"<id>")
        )

    assert await resume(session) == await resume(unknown_like(session))
    assert (await resume(session)).status == 404


@pytest.mark.parametrize(("method", "field", "target"), FOLLOWING)
async def test_an_agent_credential_is_refused_before_any_id_is_looked_up(
    world: World, method: str, field: str, target: str
) -> None:
    known = world.ids[target]
    for agent in ("bob-agent", "carol-agent"):
        own_or_not = await world.answer(agent, method, field, known)
        unknown = await world.answer(agent, method, field, unknown_like(known))
        assert own_or_not == unknown
        assert own_or_not.status == 403
        assert b"an Agent credential cannot follow Agent turns" in own_or_not.body


async def test_a_service_cannot_tell_another_services_credentials_from_unknown_ids(
    world: World,
) -> None:
    issued = world.ids["carol-agent-credential"]
    other = await world.answer("other-runtime", "credentials.revoke", "id", issued)
    unknown = await world.answer("other-runtime", "credentials.revoke", "id", unknown_like(issued))
    assert other == unknown
    assert other.status == 404
    assert b"no credential with id '<id>'" in other.body
    # Whoever may not revoke at all hears so whatever the id.
    for caller in ("carol", "carol-agent"):
        existing = await world.answer(caller, "credentials.revoke", "id", issued)
        assert existing == await world.answer(caller, "credentials.revoke", "id", "0" * 16)
        assert existing.status == 403
    # None of those calls revoked it: the Agent's credential still works.
    await world.ok("carol-agent", "system.whoami")


async def test_the_owner_and_the_issuer_keep_their_answers(world: World) -> None:
    execution, session = world.ids["execution"], world.ids["session"]
    for who in ("bob", "alice", "runtime"):
        watched = await world.ok(who, "executions.watch", execution_id=execution)
        assert watched["state"] == "queued"
        assert (await world.ok(who, "sessions.get", session_id=session))["id"] == session
    # The owner and a service see every Session, so they are told whose it is.
    for who, acting in (("alice", {}), ("runtime", {"principal_id": world.ids["carol"]})):
        answer, _ = await world.raw(
            who, "executions.submit", provider="claude", prompt="x", session_id=session, **acting
        )
        assert answer.status == 403
        assert b"this conversation belongs to someone else" in answer.body
    unknown = await world.answer(
        "alice", "executions.watch", "execution_id", unknown_like(execution)
    )
    assert unknown.status == 404 and b"no such execution" in unknown.body
    missing = await world.answer("alice", "credentials.revoke", "id", "0" * 16)
    assert missing.status == 404
    revoked = await world.ok(
        "runtime", "credentials.revoke", id=world.ids["carol-agent-credential"]
    )
    assert revoked["revoked"] is True
    cancelled = await world.ok("bob", "executions.cancel", execution_id=execution)
    assert cancelled["state"] == "cancelled"


async def test_a_refused_cancel_leaves_the_turn_running(world: World) -> None:
    execution = world.ids["execution"]
    answer = await world.answer("carol", "executions.cancel", "execution_id", execution)
    assert answer.status == 404
    watched = await world.ok("bob", "executions.watch", execution_id=execution)
    assert watched["state"] == "queued"


async def test_the_request_id_is_all_that_tells_two_refusals_apart(world: World) -> None:
    known = world.ids["execution"]
    first, first_id = await world.raw("carol", "executions.watch", execution_id=known)
    second, second_id = await world.raw("carol", "executions.watch", execution_id=known)
    assert first == second and first_id != second_id
