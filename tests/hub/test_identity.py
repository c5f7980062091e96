"""Identity, isolation and frozen bindings at the Hub RPC: which scope each caller reaches."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from bot.service.app import create_app
from hub.config import HubSettings
from hub.state import State

Client = TestClient[Any, Any]


@dataclass
class World:
    client: Client
    tokens: dict[str, str]
    ids: dict[str, str]

    async def call(
        self, who: str, method: str, bind: str | None = None, **params: Any
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {self.tokens.get(who, who)}"}
        if bind is not None:
            headers["X-Amux-Memory-Binding"] = bind
        response = await self.client.post(f"/rpc/v1/{method}", json=params, headers=headers)
        return response.status, await response.json()

    async def ok(self, who: str, method: str, bind: str | None = None, **params: Any) -> Any:
        status, body = await self.call(who, method, bind, **params)
        assert status == 200, body
        return body

    async def code(self, who: str, method: str, bind: str | None = None, **params: Any) -> str:
        status, body = await self.call(who, method, bind, **params)
        assert status != 200, body
        return str(body["error"]["code"])

    async def delegate(self, principal: str, binding: str, ttl: int | None = None) -> str:
        body = await self.ok(
            "runtime",
            "credentials.delegate",
            principal_id=self.ids[principal],
            binding=binding,
            ttl_seconds=ttl,
        )
        return str(body["token"])


def seed_state(
    home: Path, *, enabled: bool, isolation: bool
) -> tuple[dict[str, str], dict[str, str]]:
    """Principals and tokens written before the Hub starts, as an operator would."""
    state = State(HubSettings(home=home).state_path)
    try:
        state.save_setting("memory.enabled", enabled)
        state.save_setting("memory.isolation", "on" if isolation else "off")
        tokens: dict[str, str] = {}
        ids: dict[str, str] = {}
        if not state.principals():
            for name, kind in [("alice", "user"), ("bob", "user"), ("runtime", "service")]:
                principal = state.add_principal(name, kind, owner=name == "alice")
                ids[name] = principal.id
                tokens[name], _ = state.issue_credential(principal.id, "cli")
            state.add_alias(ids["alice"], "feishu_union_id", "on_alice")
        else:
            for principal in state.principals():
                ids[principal.name] = principal.id
        return tokens, ids
    finally:
        state.close()


WorldFactory = Callable[..., Awaitable[World]]


@pytest.fixture
def make_world(aiohttp_client: Any, tmp_path: Path) -> WorldFactory:
    home = tmp_path / "home"
    known: dict[str, str] = {}

    async def make(*, enabled: bool = True, isolation: bool = True) -> World:
        tokens, ids = seed_state(home, enabled=enabled, isolation=isolation)
        known.update(tokens)
        client = await aiohttp_client(create_app(HubSettings(home=home)))
        return World(client, dict(known), ids)

    return make


DOC = {
    "path": "notes/secret.md",
    "content": "alice's private plan\n",
    "expected_revision": "absent",
}


async def test_isolated_principals_never_see_each_others_documents(
    make_world: WorldFactory,
) -> None:
    world = await make_world(isolation=True)
    written = await world.ok("alice", "memory.upsert", **DOC)

    got = await world.ok("bob", "memory.get", path=DOC["path"])
    assert got["exists"] is False and got["revision"] == "absent"
    found = await world.ok("bob", "memory.search", query="private plan")
    assert found["matches"] == []
    forgotten = await world.ok(
        "bob", "memory.forget", path=DOC["path"], expected_revision=written["revision"]
    )
    assert forgotten == {"path": DOC["path"], "already_absent": True}
    # Bob creating the same path makes his own document, not a conflict with Alice's.
    await world.ok(
        "bob", "memory.upsert", path=DOC["path"], content="bob\n", expected_revision="absent"
    )
    alice_view = await world.ok("alice", "memory.get", path=DOC["path"])
    assert alice_view["content"] == DOC["content"]
    assert alice_view["revision"] == written["revision"]


async def test_path_tricks_cannot_reach_another_scope(make_world: WorldFactory) -> None:
    world = await make_world(isolation=True)
    await world.ok("alice", "memory.upsert", **DOC)
    for trick in [
        "../global/notes/secret.md",
        "../../memory/users/x.md",
        "/etc/passwd.md",
        "notes/../../secret.md",
        ".hidden.md",
        "notes\\secret.md",
    ]:
        assert await world.code("bob", "memory.get", path=trick) == "invalid_path", trick
        assert (
            await world.code(
                "bob", "memory.upsert", path=trick, content="x", expected_revision="absent"
            )
            == "invalid_path"
        )


async def test_bindings_naming_another_principal_are_refused(make_world: WorldFactory) -> None:
    world = await make_world(isolation=True)
    alice_scope = f"principal:{world.ids['alice']}"
    assert await world.code("bob", "memory.get", bind=alice_scope, path="MEMORY.md") == (
        "binding_mismatch"
    )
    assert await world.code("bob", "memory.get", bind="global", path="MEMORY.md") == (
        "binding_mismatch"
    )


async def test_delegated_credentials_require_their_exact_binding(make_world: WorldFactory) -> None:
    world = await make_world(isolation=True)
    binding = f"principal:{world.ids['alice']}"
    await world.ok("alice", "memory.upsert", **DOC)
    agent = await world.delegate("alice", binding)

    got = await world.ok(agent, "memory.get", bind=binding, path=DOC["path"])
    assert got["content"] == DOC["content"]
    assert await world.code(agent, "memory.get", path=DOC["path"]) == "binding_mismatch"
    bob_binding = f"principal:{world.ids['bob']}"
    assert await world.code(agent, "memory.get", bind=bob_binding, path=DOC["path"]) == (
        "binding_mismatch"
    )
    assert await world.code(agent, "memory.get", bind="global", path=DOC["path"]) == (
        "binding_mismatch"
    )
    # An Agent credential cannot change settings, even when it acts for the owner.
    assert (
        await world.code(
            agent, "system.config.set", bind=binding, key="memory.enabled", value="false"
        )
        == "forbidden"
    )


async def test_expired_and_revoked_delegations_are_unauthenticated(
    make_world: WorldFactory, tmp_path: Path
) -> None:
    world = await make_world(isolation=True)
    binding = f"principal:{world.ids['alice']}"
    state = State(HubSettings(home=tmp_path / "home").state_path)
    try:
        expired, _ = state.issue_credential(
            world.ids["alice"], "delegated", binding=binding, expires_at=time.time() - 1
        )
    finally:
        state.close()
    assert await world.code(expired, "memory.get", bind=binding, path="a.md") == ("unauthenticated")

    revoked = await world.delegate("alice", binding)
    listed = await world.ok(revoked, "system.whoami", bind=binding)
    await world.ok("runtime", "credentials.revoke", id=listed["credential"]["id"])
    assert await world.code(revoked, "memory.get", bind=binding, path="a.md") == "unauthenticated"
    for forged in ["amux_forged", "", "Bearer", revoked + "x"]:
        status, body = await world.call(forged, "memory.get", bind=binding, path="a.md")
        assert status == 401 and body["error"]["code"] == "unauthenticated"


async def test_only_services_delegate_and_only_for_the_derived_binding(
    make_world: WorldFactory,
) -> None:
    world = await make_world(isolation=True)
    alice_binding = f"principal:{world.ids['alice']}"
    assert (
        await world.code(
            "bob", "credentials.delegate", principal_id=world.ids["alice"], binding=alice_binding
        )
        == "forbidden"
    )
    assert (
        await world.code(
            "runtime", "credentials.delegate", principal_id=world.ids["alice"], binding="global"
        )
        == "binding_mismatch"
    )
    resolved = await world.ok("runtime", "memory.binding.resolve", principal_id=world.ids["bob"])
    assert resolved["binding"] == f"principal:{world.ids['bob']}"
    own = await world.ok("bob", "memory.binding.resolve")
    assert own["binding"] == resolved["binding"]
    assert (
        await world.code("bob", "memory.binding.resolve", principal_id=world.ids["alice"])
        == "forbidden"
    )


async def test_isolation_off_shares_global_memory(make_world: WorldFactory) -> None:
    world = await make_world(isolation=False)
    await world.ok("alice", "memory.upsert", **DOC)
    got = await world.ok("bob", "memory.get", path=DOC["path"])
    assert got["content"] == DOC["content"]
    resolved = await world.ok("runtime", "memory.binding.resolve", principal_id=world.ids["bob"])
    assert resolved["binding"] == "global"


async def test_disabled_memory_refuses_new_bindings(make_world: WorldFactory) -> None:
    world = await make_world(enabled=False)
    assert await world.code("runtime", "memory.binding.resolve") == "memory_disabled"
    assert (
        await world.code(
            "runtime", "credentials.delegate", principal_id=world.ids["alice"], binding="global"
        )
        == "memory_disabled"
    )


async def test_cli_and_feishu_alias_of_one_person_share_isolated_memory(
    make_world: WorldFactory, tmp_path: Path
) -> None:
    world = await make_world(isolation=True)
    await world.ok("alice", "memory.upsert", **DOC)
    state = State(HubSettings(home=tmp_path / "home").state_path)
    try:
        via_feishu = state.principal_by_alias("feishu_union_id", "on_alice")
    finally:
        state.close()
    assert via_feishu is not None and via_feishu.id == world.ids["alice"]
    binding = f"principal:{via_feishu.id}"
    agent = await world.delegate("alice", binding)
    got = await world.ok(agent, "memory.get", bind=binding, path=DOC["path"])
    assert got["content"] == DOC["content"]


async def test_a_policy_change_fails_old_bindings_instead_of_falling_back(
    make_world: WorldFactory, aiohttp_client: Any, tmp_path: Path
) -> None:
    world = await make_world(isolation=False)
    agent = await world.delegate("alice", "global")
    await world.ok(agent, "memory.get", bind="global", path="MEMORY.md")
    await world.client.close()

    restarted = await make_world(isolation=True)
    assert await restarted.code(agent, "memory.get", bind="global", path="MEMORY.md") == (
        "binding_mismatch"
    )

    await restarted.client.close()
    disabled = await make_world(enabled=False, isolation=True)
    assert await disabled.code(agent, "memory.get", bind="global", path="MEMORY.md") == (
        "memory_disabled"
    )
