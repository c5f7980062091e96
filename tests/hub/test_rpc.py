"""The Hub RPC edge: authentication, the one error shape, and bad input getting a clear 4xx."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from bot.service.app import create_app
from hub.config import OWNER_TOKEN_FILE, HubSettings
from hub.state import State

Client = TestClient[Any, Any]


def owner_headers(settings: HubSettings) -> dict[str, str]:
    token = (settings.home / OWNER_TOKEN_FILE).read_text().strip()
    return {"Authorization": f"Bearer {token}"}


async def test_health_needs_no_credential(hub_client: Client) -> None:
    response = await hub_client.get("/healthz")
    assert response.status == 200
    assert (await response.json()) == {"status": "ok"}


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}, {"Authorization": ""}],
)
async def test_every_rpc_call_requires_a_valid_credential(
    hub_client: Client, headers: dict[str, str]
) -> None:
    response = await hub_client.post("/rpc/v1/system.capabilities", json={}, headers=headers)
    assert response.status == 401
    body = await response.json()
    assert body["error"]["code"] == "unauthenticated"
    assert set(body["error"]) >= {"code", "message"}


async def test_disabled_memory_rejects_data_calls_with_memory_disabled(
    hub_client: Client, hub_settings: HubSettings
) -> None:
    headers = owner_headers(hub_settings)
    for method, params in [
        ("memory.search", {"query": "x"}),
        ("memory.get", {"path": "MEMORY.md"}),
        ("memory.upsert", {"path": "a.md", "content": "x", "expected_revision": "absent"}),
        ("memory.forget", {"path": "a.md", "expected_revision": "absent"}),
    ]:
        response = await hub_client.post(f"/rpc/v1/{method}", json=params, headers=headers)
        assert response.status == 403, method
        assert (await response.json())["error"]["code"] == "memory_disabled"


@pytest.mark.parametrize(
    ("body", "code", "status"),
    [
        (b"{not json", "invalid_argument", 400),
        (b"[1, 2]", "invalid_argument", 400),
        (b'"text"', "invalid_argument", 400),
        (b"\xff\xfe", "invalid_argument", 400),
        (b'{"key": "memory.enabled", "value": "true", "extra": 1}', "invalid_argument", 400),
        (b'{"key": "no.such.key", "value": "true"}', "invalid_argument", 400),
        (b'{"key": "memory.enabled", "value": "maybe"}', "invalid_argument", 400),
        (b'{"key": "memory.enabled"}', "invalid_argument", 400),
    ],
)
async def test_malformed_requests_get_a_clear_4xx_never_a_500(
    hub_client: Client, hub_settings: HubSettings, body: bytes, code: str, status: int
) -> None:
    response = await hub_client.post(
        "/rpc/v1/system.config.set", data=body, headers=owner_headers(hub_settings)
    )
    assert response.status == status
    payload = await response.json()
    assert payload["error"]["code"] == code
    assert "Traceback" not in payload["error"]["message"]


async def test_unknown_method_is_not_found(hub_client: Client, hub_settings: HubSettings) -> None:
    response = await hub_client.post(
        "/rpc/v1/memory.explode", json={}, headers=owner_headers(hub_settings)
    )
    assert response.status == 404
    assert (await response.json())["error"]["code"] == "not_found"


async def test_a_huge_body_is_refused_as_payload_too_large(
    hub_client: Client, hub_settings: HubSettings
) -> None:
    response = await hub_client.post(
        "/rpc/v1/memory.upsert",
        data=io.BytesIO(b'{"content": "' + b"x" * (2 * 1024 * 1024) + b'"}'),
        headers=owner_headers(hub_settings),
    )
    assert response.status == 413
    assert (await response.json())["error"]["code"] == "payload_too_large"


async def test_saved_setting_applies_only_after_restart(
    hub_client: Client, hub_settings: HubSettings
) -> None:
    headers = owner_headers(hub_settings)
    response = await hub_client.post(
        "/rpc/v1/system.config.set",
        json={"key": "memory.enabled", "value": "true"},
        headers=headers,
    )
    assert (await response.json()) == {
        "memory.enabled": {"saved": True, "running": False, "restart_pending": True}
    }
    caps = await (await hub_client.post("/rpc/v1/system.capabilities", headers=headers)).json()
    assert caps["memory"]["enabled"] is False


DEEP = b"[" * 10_000 + b"]" * 10_000


@pytest.mark.parametrize(
    "body",
    [
        b'{"query": NaN}',
        b'{"query": "x", "limit": Infinity}',
        b'{"query": ["x", {"deep": -Infinity}]}',
        b'{"query": "x", "limit": 1e999}',
        b'{"query": "x", "limit": ' + b"9" * 5000 + b"}",
        b'{"query": ' + DEEP + b"}",
        DEEP,
    ],
    ids=["nan", "infinity", "nested-negative-infinity", "overflow", "huge-int", "deep", "deep-top"],
)
async def test_non_finite_numbers_huge_integers_and_deep_nesting_are_refused_before_any_handler(
    hub_client: Client, hub_settings: HubSettings, body: bytes
) -> None:
    # Memory is off here: a body the Hub accepted would be refused as memory_disabled instead.
    response = await hub_client.post(
        "/rpc/v1/memory.search", data=body, headers=owner_headers(hub_settings)
    )
    assert response.status == 400
    payload = await response.json()
    assert payload["error"]["code"] == "invalid_argument"
    assert "Traceback" not in payload["error"]["message"]


async def test_a_nan_wait_is_refused_instead_of_holding_a_claim_open_forever(
    hub_client: Client, hub_settings: HubSettings
) -> None:
    state = State(hub_settings.state_path)
    try:
        runtime = state.add_principal("runtime-nan", "service")
        token, _ = state.issue_credential(runtime.id, "cli")
    finally:
        state.close()
    headers = {"Authorization": f"Bearer {token}"}
    registered = await hub_client.post(
        "/rpc/v1/workers.register", json={"name": "nan-worker"}, headers=headers
    )
    worker_id = (await registered.json())["worker_id"]
    # The guard only bounds a regression; a correct Hub answers at once.
    async with asyncio.timeout(10):
        response = await hub_client.post(
            "/rpc/v1/executions.claim",
            data=f'{{"worker_id": "{worker_id}", "wait_seconds": NaN}}'.encode(),
            headers=headers,
        )
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_argument"


@pytest.fixture
async def memory_client(aiohttp_client: Any, hub_settings: HubSettings) -> Client:
    hub_settings.home.mkdir(parents=True)
    state = State(hub_settings.state_path)
    try:
        state.save_setting("memory.enabled", True)
    finally:
        state.close()
    client: Client = await aiohttp_client(create_app(hub_settings))
    return client


async def test_a_path_spelled_decomposed_and_composed_is_one_document(
    memory_client: Client, hub_settings: HubSettings
) -> None:
    headers = owner_headers(hub_settings)

    async def call(method: str, **params: Any) -> Any:
        response = await memory_client.post(f"/rpc/v1/{method}", json=params, headers=headers)
        assert response.status == 200, await response.text()
        return await response.json()

    decomposed, composed = "notes/cafe\u0301.md", "notes/caf\u00e9.md"
    created = await call(
        "memory.upsert", path=decomposed, content="espresso\n", expected_revision="absent"
    )
    assert created["path"] == composed
    got = await call("memory.get", path=composed)
    assert got["exists"] and got["content"] == "espresso\n"
    assert got["revision"] == created["revision"]
    found = await call("memory.search", query="espresso", path_prefix="notes/")
    assert [match["path"] for match in found["matches"]] == [composed]
    # Creating "again" under the other spelling is a conflict with the same document.
    response = await memory_client.post(
        "/rpc/v1/memory.upsert",
        json={"path": composed, "content": "latte\n", "expected_revision": "absent"},
        headers=headers,
    )
    assert response.status == 409
    assert (await response.json())["error"]["observed_revision"] == created["revision"]
    forgotten = await call("memory.forget", path=decomposed, expected_revision=created["revision"])
    assert forgotten == {"path": composed, "already_absent": False}
    assert (await call("memory.get", path=composed))["exists"] is False
