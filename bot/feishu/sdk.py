"""lark-oapi, imported in one place so its import-time side effect is undone in one place.

Importing lark-oapi runs ``asyncio.get_event_loop()`` in ``lark_oapi.ws.client``, which outside
a running loop creates a loop, makes it the thread's current loop and never closes it (a
ResourceWarning at exit, and a stale "current loop"). The long connection brings its own loop
(see ``bot.feishu.longconn``), so that import-time loop is closed here unless it is in use.
"""

from __future__ import annotations

import asyncio
import warnings

import lark_oapi as lark
import lark_oapi.ws.client as ws_client
from lark_oapi.core.enum import AccessTokenType, HttpMethod
from lark_oapi.core.exception import ObtainAccessTokenException
from lark_oapi.core.model import RawResponse, RequestOption
from lark_oapi.core.token import verify
from lark_oapi.core.token.manager import TokenManager
from lark_oapi.core.utils import AESCipher

__all__ = [
    "AESCipher",
    "AccessTokenType",
    "HttpMethod",
    "ObtainAccessTokenException",
    "RawResponse",
    "RequestOption",
    "TokenManager",
    "lark",
    "verify",
    "ws_client",
]


def _release_import_loop() -> None:
    loop = ws_client.loop
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is running or loop.is_running() or loop.is_closed():
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        policy = asyncio.get_event_loop_policy()
        current = getattr(getattr(policy, "_local", None), "_loop", None)
    if current is loop:
        asyncio.set_event_loop(None)
    loop.close()


_release_import_loop()
