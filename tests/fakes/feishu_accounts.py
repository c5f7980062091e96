"""A fake Feishu accounts site on a random loopback port: the app registration device flow.

It answers what ``lark_oapi.aregister_app`` posts to ``/oauth/v1/app/registration`` (form
encoded): ``init`` names the auth methods, ``begin`` hands out a device code and the link the QR
code carries, and ``poll`` answers ``authorization_pending`` ``pending`` times, then the
``outcome``: ``approve`` (the app's id and secret and the scanner's open_id), ``deny``
(``access_denied``) or ``expire`` (``expired_token``); ``silent`` answers nothing, ever, as a
site behind a dead path. ``brand="lark"`` first answers a poll as a
Lark tenant without credentials, as Feishu's site does before the SDK moves to Lark's. Every
request's form is recorded in ``requests``.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from aiohttp import web

ENDPOINT = "/oauth/v1/app/registration"
Outcome = Literal["approve", "deny", "expire", "silent"]


def decoded_addons(url: str) -> dict[str, Any]:
    """The scopes, events and callbacks a registration link asks for."""
    encoded = parse_qs(urlsplit(url).query)["addons"][0]
    padded = encoded + "=" * (-len(encoded) % 4)
    payload: dict[str, Any] = json.loads(gzip.decompress(base64.urlsafe_b64decode(padded)))
    return payload


class FakeAccounts:
    """Use ``async with FakeAccounts(...) as accounts`` and point setup at ``url``."""

    def __init__(
        self,
        *,
        outcome: Outcome = "approve",
        pending: int = 1,
        app_id: str = "cli_scanned",
        app_secret: str = "scanned_secret",
        open_id: str = "ou_scanner",
        brand: Literal["feishu", "lark"] = "feishu",
        interval: int = 0,
        expires_in: int = 600,
    ) -> None:
        self.outcome = outcome
        self.pending = pending
        self.app_id = app_id
        self.app_secret = app_secret
        self.open_id = open_id
        self.brand = brand
        self.interval = interval
        self.expires_in = expires_in
        self.requests: list[dict[str, str]] = []
        self._switched = False
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> FakeAccounts:
        app = web.Application()
        app.router.add_post(ENDPOINT, self._registration)
        # A silent request never ends on its own: closing does not wait for it.
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def polls(self) -> int:
        return sum(r.get("action") == "poll" for r in self.requests)

    async def _registration(self, request: web.Request) -> web.Response:
        form = {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
        self.requests.append(form)
        if self.outcome == "silent":
            await asyncio.Event().wait()
        action = form.get("action")
        if action == "init":
            return web.json_response({"supported_auth_methods": ["client_secret"]})
        if action == "begin":
            return web.json_response(
                {
                    "device_code": "dc_1",
                    "user_code": "ABCD-EFGH",
                    "verification_uri_complete": f"{self.url}/verify?user_code=ABCD-EFGH",
                    "interval": self.interval,
                    "expires_in": self.expires_in,
                }
            )
        if action != "poll" or form.get("device_code") != "dc_1":
            return web.json_response({"error": "invalid_request"}, status=400)
        if self.pending > 0:
            self.pending -= 1
            return web.json_response({"error": "authorization_pending"})
        if self.brand == "lark" and not self._switched:
            self._switched = True
            return web.json_response({"user_info": {"tenant_brand": "lark"}})
        if self.outcome == "deny":
            return web.json_response({"error": "access_denied", "error_description": "declined"})
        if self.outcome == "expire":
            return web.json_response({"error": "expired_token", "error_description": "expired"})
        return web.json_response(
            {
                "client_id": self.app_id,
                "client_secret": self.app_secret,
                "user_info": {"open_id": self.open_id, "tenant_brand": self.brand},
            }
        )
