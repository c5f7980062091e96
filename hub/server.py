"""Mounts the Hub onto an aiohttp application: its services, the RPC sub-app and health checks."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from hub.config import HubSettings
from hub.rpc import HUB, create_rpc_app
from hub.services import Hub


def add_hub(app: web.Application, settings: HubSettings) -> None:
    """Open the Hub with the application and close it after the last request has drained."""

    async def hub_lifetime(app: web.Application) -> AsyncIterator[None]:
        app[HUB] = Hub.open(settings)
        yield
        app[HUB].close()

    app.cleanup_ctx.append(hub_lifetime)
    app.add_subapp("/rpc/v1/", create_rpc_app(settings.max_request_bytes))
    app.router.add_get("/healthz", healthz)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})
