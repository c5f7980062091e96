"""Mounts the Hub onto an aiohttp application: its services, the RPC sub-app and health checks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from hub import rpc_executions  # noqa: F401  (registers the execution methods)
from hub.config import HubSettings
from hub.rpc import HUB, create_rpc_app
from hub.services import Hub

logger = logging.getLogger("amux.hub")


def add_hub(app: web.Application, settings: HubSettings) -> None:
    """Open the Hub with the application and close it after the last request has drained."""

    async def hub_lifetime(app: web.Application) -> AsyncIterator[None]:
        app[HUB] = Hub.open(settings)
        yield
        app[HUB].close()

    async def lease_sweeper(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(sweep_leases(app[HUB]))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def release_long_polls(app: web.Application) -> None:
        await app[HUB].executions.close()

    app.cleanup_ctx.append(hub_lifetime)
    app.cleanup_ctx.append(lease_sweeper)
    app.on_shutdown.append(release_long_polls)
    app.add_subapp("/rpc/v1/", create_rpc_app(settings.max_request_bytes))
    app.router.add_get("/healthz", healthz)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def sweep_leases(hub: Hub) -> None:
    interval = max(0.05, min(1.0, hub.executions.lease_seconds / 4))
    while True:
        await asyncio.sleep(interval)
        try:
            await hub.executions.expire_leases()
        except Exception:
            logger.exception("expiring worker leases failed")
