"""Fixtures of the Hub's tests: the whole service in-process, with Principals already made."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import pytest
from aiohttp.test_utils import TestClient

from bot.service.app import create_app
from hub.config import HubSettings
from hub.state import State

Client = TestClient[Any, Any]
# The test client, and per Principal its id (``ids[name]``) and CLI token (``ids[name-token]``).
Served = tuple[Client, dict[str, str]]


class ServeHub(Protocol):
    async def __call__(self, owner: str, *users: str, memory: bool = False) -> Served: ...


@pytest.fixture
def serve_hub(aiohttp_client: Any, tmp_path: Path) -> ServeHub:
    """Serve a fresh Hub whose Principals are the owner ``owner``, the other ``users`` and the
    service ``runtime`` (a worker's), each with a CLI token; ``memory`` enables memory first."""

    async def serve(owner: str, *users: str, memory: bool = False) -> Served:
        home = tmp_path / "home"
        state = State(HubSettings(home=home).state_path)
        ids: dict[str, str] = {}
        try:
            if memory:
                state.save_setting("memory.enabled", True)
            cast = [(owner, "user"), *((user, "user") for user in users), ("runtime", "service")]
            for name, kind in cast:
                principal = state.add_principal(name, kind, owner=name == owner)
                ids[name] = principal.id
                ids[f"{name}-token"], _ = state.issue_credential(principal.id, "cli")
        finally:
            state.close()
        client = await aiohttp_client(create_app(HubSettings(home=home)))
        return client, ids

    return serve
