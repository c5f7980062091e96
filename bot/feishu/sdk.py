"""lark-oapi, imported in one place so its import-time side effect is undone in one place.

Importing lark-oapi runs ``asyncio.get_event_loop()`` in ``lark_oapi.ws.client``, which outside
a running loop creates a loop, makes it the thread's current loop and never closes it (a
ResourceWarning at exit, and a stale "current loop"). The long connection brings its own loop
(see ``bot.feishu.longconn``), so that import-time loop is closed here unless it is in use.

The SDK's pure message normalizers (``lark_oapi.channel``: content parsing, flattening, mention
resolution, merge-forward expansion) are imported here too, and only they: its
``FeishuChannel`` runs a loop, a de-duplication and card answers of its own, which amux has. Their
authors mean to move them to another package; an upgrade that does fails here, by name.
"""

from __future__ import annotations

import asyncio
import warnings

import lark_oapi as lark
import lark_oapi.ws.client as ws_client
from lark_oapi.core.enum import HttpMethod
from lark_oapi.core.exception import ObtainAccessTokenException
from lark_oapi.core.json import JSON
from lark_oapi.core.token import (
    AccessTokenResponse,
    CreateSelfTenantTokenRequest,
    CreateTokenRequestBody,
)
from lark_oapi.core.token.manager import TokenManager
from lark_oapi.core.utils import AESCipher
from lark_oapi.core.utils.user_agent import build_user_agent

try:
    from lark_oapi.channel import (
        AudioContent,
        InteractiveContent,
        MediaContent,
        MergeForwardContent,
        MergeForwardItem,
        PostContent,
        StickerContent,
        TextContent,
        UnknownContent,
        flatten_content,
        parse_message_content,
    )
    from lark_oapi.channel.normalize.mentions import extract_mentions, resolve_mentions
    from lark_oapi.channel.normalize.merge_forward import MergeForwardExpander
except ImportError as error:  # pragma: no cover - only an SDK upgrade gets here
    raise ImportError(
        "this lark-oapi no longer ships the message normalizers amux reads Feishu messages "
        f"with (lark_oapi.channel: {error}); keep lark-oapi==1.7.5 or port bot/feishu/content.py"
    ) from error

__all__ = [
    "AESCipher",
    "AccessTokenResponse",
    "CreateSelfTenantTokenRequest",
    "CreateTokenRequestBody",
    "JSON",
    "build_user_agent",
    "AudioContent",
    "InteractiveContent",
    "MediaContent",
    "MergeForwardContent",
    "MergeForwardExpander",
    "MergeForwardItem",
    "PostContent",
    "StickerContent",
    "TextContent",
    "UnknownContent",
    "extract_mentions",
    "flatten_content",
    "parse_message_content",
    "resolve_mentions",
    "HttpMethod",
    "ObtainAccessTokenException",
    "TokenManager",
    "lark",
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
