"""The Hub's own middleware, on a Hub mounted by ``add_hub`` alone (no bot, no composition root)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from hub.config import OWNER_TOKEN_FILE, HubSettings
from hub.middleware import DRAIN, request_id_of
from hub.requestid import REQUEST_ID_HEADER
from hub.server import add_hub

Client = TestClient[Any, Any]


async def bare_hub(aiohttp_client: Any, home: Path) -> Client:
    app = web.Application()
    add_hub(app, HubSettings(home=home))
    client: Client = await aiohttp_client(app)
    return client


async def test_a_hub_mounted_alone_echoes_a_callers_request_id_and_makes_one_otherwise(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    client = await bare_hub(aiohttp_client, tmp_path / "home")
    given = await client.get("/healthz", headers={REQUEST_ID_HEADER: "trace-1"})
    assert given.headers[REQUEST_ID_HEADER] == "trace-1"
    made = await client.get("/no-such-page")
    assert made.status == 404
    assert len(made.headers[REQUEST_ID_HEADER]) == 32


async def test_a_hub_mounted_alone_refuses_new_requests_once_it_drains(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    client = await bare_hub(aiohttp_client, tmp_path / "home")
    token = (tmp_path / "home" / OWNER_TOKEN_FILE).read_text().strip()
    assert await client.app[DRAIN].wait_idle(5.0)
    response = await client.post(
        "/rpc/v1/system.whoami",
        json={},
        headers={"Authorization": f"Bearer {token}", REQUEST_ID_HEADER: "late-1"},
    )
    assert response.status == 503
    assert (await response.json())["error"]["code"] == "unavailable"
    # The refusal comes from inside the request-id middleware, so it is traceable too.
    assert response.headers[REQUEST_ID_HEADER] == "late-1"


def test_request_ids_shaped_like_credentials_or_malformed_are_replaced() -> None:
    assert request_id_of("feishu-ev-42") == "feishu-ev-42"
    assert request_id_of("amux_home") == "amux_home"
    for refused in ("amux_" + "k" * 43, "bad id", "", "x" * 129, None):
        replaced = request_id_of(refused)
        assert replaced != refused and len(replaced) == 32
