"""Memory history over the Hub RPC: the change log, kept bodies, restore and erase, each seen only
by the Principal whose memory it is; and the retention window."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from bot.service.app import create_app
from hub.config import OWNER_TOKEN_FILE, HubSettings
from hub.history import DAY, Author, MemoryHistory
from hub.limits import Limits
from hub.paths import principal_scope
from hub.state import State
from hub.store import MemoryStore

Client = TestClient[Any, Any]


def revision(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Caller:
    def __init__(self, client: Client, token: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"}

    async def call(self, method: str, **params: Any) -> tuple[int, dict[str, Any]]:
        response = await self.client.post(f"/rpc/v1/{method}", json=params, headers=self.headers)
        return response.status, await response.json()

    async def ok(self, method: str, **params: Any) -> dict[str, Any]:
        status, body = await self.call(method, **params)
        assert status == 200, body
        return body


async def start(
    aiohttp_client: Any,
    tmp_path: Path,
    isolation: bool,
    history_days: int = 30,
    enabled: bool = True,
) -> tuple[Caller, Caller, HubSettings]:
    settings = HubSettings(home=tmp_path / "amux-home")
    state = State(settings.state_path)
    state.save_setting("memory.enabled", enabled)
    state.save_setting("memory.isolation", "on" if isolation else "off")
    state.save_setting("memory.history_days", history_days)
    state.add_principal("owner", owner=True)
    owner = state.principal_by_name("owner")
    owner_token, _ = state.issue_credential(owner.id)
    (settings.home / OWNER_TOKEN_FILE).write_text(owner_token)
    bob = state.add_principal("bob")
    bob_token, _ = state.issue_credential(bob.id)
    state.close()
    client = await aiohttp_client(create_app(settings))
    return Caller(client, owner_token), Caller(client, bob_token), settings


@pytest.mark.parametrize("isolation", [True, False], ids=["isolation-on", "isolation-off"])
async def test_another_principal_sees_restores_and_erases_nothing_of_yours(
    aiohttp_client: Any, tmp_path: Path, isolation: bool
) -> None:
    alice, bob, settings = await start(aiohttp_client, tmp_path, isolation)
    first, second = "# Plan\nalice's first draft\n", "# Plan\nalice's second draft\n"
    await alice.ok("memory.upsert", path="plan.md", content=first, expected_revision="absent")
    await alice.ok(
        "memory.upsert", path="plan.md", content=second, expected_revision=revision(first)
    )
    mine = await alice.ok("memory.history")
    assert [e["action"] for e in mine["entries"]] == ["upsert", "upsert"]
    assert mine["entries"][0]["via"] == "rpc"
    assert mine["entries"][0]["restorable"] is True

    assert (await bob.ok("memory.history"))["entries"] == []
    assert (await bob.ok("memory.history", path="plan.md"))["entries"] == []
    if isolation:
        # In the shared scope anyone may write plan.md, so anyone may also put a replaced body
        # back (tests/hub/test_memory_cli_safety.py); another scope's copies are out of reach.
        status, body = await bob.call(
            "memory.restore", path="plan.md", revision=revision(first), expected_revision="absent"
        )
        assert status == 404, body
        assert body["error"]["code"] == "not_found"

    receipt = await bob.ok("memory.erase")
    assert receipt["documents_removed"] == 0
    assert receipt["history_copies_removed"] == 0
    assert receipt["log_entries_redacted"] == 0
    # Nothing of bob's is at plan.md: the erase says so instead of an all-zero receipt.
    status, body = await bob.call("memory.erase", path="plan.md")
    assert status == 404, body
    assert body["error"]["code"] == "not_found"

    # Alice's document, its kept body and her log are untouched.
    got = await alice.ok("memory.get", path="plan.md")
    assert got["content"] == second
    kept = list((settings.home / "memory-history").rglob(revision(first)))
    assert len(kept) == 1
    assert [e["path"] for e in (await alice.ok("memory.history"))["entries"]] == ["plan.md"] * 2
    restored = await alice.ok(
        "memory.restore",
        path="plan.md",
        revision=revision(first),
        expected_revision=revision(second),
    )
    assert restored["revision"] == revision(first)


async def test_only_the_owner_can_erase_another_principals_memory(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    owner, bob, settings = await start(aiohttp_client, tmp_path, isolation=True)
    await bob.ok("memory.upsert", path="me.md", content="bob's note\n", expected_revision="absent")
    state = State(settings.state_path)
    bob_id = state.principal_by_name("bob").id
    owner_id = state.principal_by_name("owner").id
    state.close()
    status, body = await bob.call("memory.erase_principal", principal_id=owner_id)
    assert status == 403, body
    receipt = await owner.ok("memory.erase_principal", principal_id=bob_id)
    assert receipt["documents_removed"] == 1
    assert "not erased" in receipt["not_erased"]
    assert (await bob.ok("memory.get", path="me.md"))["exists"] is False


async def test_with_history_days_zero_no_body_is_kept(aiohttp_client: Any, tmp_path: Path) -> None:
    alice, _, settings = await start(aiohttp_client, tmp_path, isolation=True, history_days=0)
    await alice.ok("memory.upsert", path="a.md", content="one\n", expected_revision="absent")
    await alice.ok("memory.forget", path="a.md", expected_revision=revision("one\n"))
    [forgot, _] = (await alice.ok("memory.history"))["entries"]
    assert forgot["action"] == "forget"
    assert forgot["restorable"] is False
    assert [p for p in (settings.home / "memory-history").rglob("*") if p.is_file()] == []


async def test_history_days_is_a_setting_of_whole_days(aiohttp_client: Any, tmp_path: Path) -> None:
    owner, bob, _ = await start(aiohttp_client, tmp_path, isolation=True)
    saved = await owner.ok("system.config.set", key="memory.history_days", value="7")
    assert saved["memory.history_days"] == {"saved": 7, "running": 30, "restart_pending": True}
    status, body = await owner.call("system.config.set", key="memory.history_days", value="-1")
    assert status == 400, body
    status, body = await bob.call("system.config.set", key="memory.history_days", value="7")
    assert status == 403, body


async def test_copies_past_the_window_or_beyond_four_times_the_quota_are_pruned_oldest_first(
    tmp_path: Path,
) -> None:
    state = State(tmp_path / "state.sqlite3")
    limits = Limits(scope_documents=1)
    store = MemoryStore(tmp_path / "memory", limits)
    store.open()
    history = MemoryHistory(state, store, tmp_path / "memory-history", 30, limits)
    history.open()
    author = Author("p1", "cli")
    bodies = [f"body {i}\n" for i in range(7)]
    previous = "absent"
    for body in bodies:
        await history.upsert("global", "a.md", body, previous, author)
        previous = revision(body)
    kept_dir = tmp_path / "memory-history" / "global" / "a.md"
    # Six overwritten bodies, at most 4 × 1 kept: the two oldest went.
    assert sorted(p.name for p in kept_dir.iterdir()) == sorted(revision(b) for b in bodies[2:6])
    # Age every entry past the window: the next prune removes every copy.
    state.db.execute("UPDATE memory_log SET at = ?", (time.time() - 31 * DAY,))
    await history.prune()
    assert not kept_dir.exists() or list(kept_dir.iterdir()) == []
    entries = history.entries("global", "p1").entries
    assert not any(e.restorable for e in entries)
    state.close()


async def test_an_agent_credential_cannot_erase_memory(aiohttp_client: Any, tmp_path: Path) -> None:
    owner, _, settings = await start(aiohttp_client, tmp_path, isolation=True)
    state = State(settings.state_path)
    principal = state.principal_by_name("owner")
    binding = f"principal:{principal.id}"
    token, _ = state.issue_credential(principal.id, "delegated", binding=binding)
    state.close()
    agent = Caller(owner.client, token)
    agent.headers["X-Amux-Memory-Binding"] = binding
    await agent.ok("memory.upsert", path="a.md", content="kept\n", expected_revision="absent")
    status, body = await agent.call("memory.erase")
    assert status == 403, body
    assert body["error"]["code"] == "forbidden"
    assert (await owner.ok("memory.get", path="a.md"))["exists"] is True


async def test_a_copy_no_entry_keeps_goes_once_it_is_older_than_the_window(tmp_path: Path) -> None:
    state = State(tmp_path / "state.sqlite3")
    store = MemoryStore(tmp_path / "memory")
    store.open()
    history = MemoryHistory(state, store, tmp_path / "memory-history", 30, Limits())
    history.open()
    author = Author("p1", "cli")
    await history.upsert("global", "a.md", "one\n", "absent", author)
    await history.upsert("global", "a.md", "two\n", revision("one\n"), author)
    kept = tmp_path / "memory-history" / "global" / "a.md" / revision("one\n")
    orphan = kept.parent / revision("lost\n")
    orphan.write_text("lost\n")
    old = time.time() - 31 * DAY
    os.utime(orphan, (old, old))
    await history.prune()
    assert not orphan.exists()
    assert kept.exists()
    state.close()


async def test_history_pages_newest_first_and_filters_by_path(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    alice, _, _ = await start(aiohttp_client, tmp_path, isolation=True)
    for name in ("a.md", "b.md", "c.md"):
        await alice.ok("memory.upsert", path=name, content=name, expected_revision="absent")
    first = await alice.ok("memory.history", limit=2)
    assert [e["path"] for e in first["entries"]] == ["c.md", "b.md"]
    rest = await alice.ok("memory.history", limit=2, before=first["next_before"])
    assert [e["path"] for e in rest["entries"]] == ["a.md"]
    assert rest["next_before"] is None
    only = await alice.ok("memory.history", path="b.md")
    assert [e["path"] for e in only["entries"]] == ["b.md"]
    status, body = await alice.call("memory.history", limit=0)
    assert status == 400, body


async def test_erase_works_while_memory_is_off(aiohttp_client: Any, tmp_path: Path) -> None:
    settings = HubSettings(home=tmp_path / "amux-home")
    store = MemoryStore(settings.memory_root)
    store.open()
    owner, bob, _ = await start(aiohttp_client, tmp_path, isolation=True, enabled=False)
    state = State(settings.state_path)
    bob_id = state.principal_by_name("bob").id
    state.close()
    await store.upsert(principal_scope(bob_id), "mine.md", "bob's note\n", "absent")
    status, body = await bob.call("memory.get", path="mine.md")
    assert (status, body["error"]["code"]) == (403, "memory_disabled")
    receipt = await bob.ok("memory.erase")
    assert receipt["documents_removed"] == 1
    assert not (settings.memory_root / "users").exists() or not any(
        (settings.memory_root / "users").rglob("*.md")
    )
