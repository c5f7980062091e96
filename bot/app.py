"""The composition root of the ``amux serve`` process: one aiohttp application."""

from __future__ import annotations

import logging

from aiohttp import web

from hub.config import HubSettings
from hub.server import add_hub

logger = logging.getLogger("amux.serve")


def create_app(hub_settings: HubSettings) -> web.Application:
    """Build the service; nothing starts until the application's startup runs."""
    app = web.Application(client_max_size=hub_settings.max_request_bytes)
    add_hub(app, hub_settings)
    return app
