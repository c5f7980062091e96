"""Canary: the private parts of lark-oapi that amux relies on are still there, with the same shape.

``bot/feishu/longconn.py`` drives the SDK's WebSocket client by hand (it has no ``stop()`` and
drops card frames), and ``bot/feishu/client.py`` fills and clears the SDK's cached tenant token.
None of this is public API, so an upgrade of lark-oapi can change it silently; these tests name
what changed.
"""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest
from lark_oapi.core.model import Config

from bot.feishu.client import TENANT_TOKEN_CACHE_KEY
from bot.feishu.sdk import TokenManager, lark, ws_client

# Methods of lark_oapi.ws.client.Client that LongConnection calls or overrides, and their shape.
CLIENT_METHODS = {
    "_connect": (True, ["self"]),
    "_disconnect": (True, ["self"]),
    "_reconnect": (True, ["self"]),
    "_ping_loop": (True, ["self"]),
    "_handle_data_frame": (True, ["self", "frame"]),
    "_write_message": (True, ["self", "data"]),
    "_combine": (False, ["self", "msg_id", "sum_", "seq", "bs"]),
}


def changed(what: str) -> str:
    return f"lark-oapi changed a private hook amux relies on: {what}; see bot/feishu/longconn.py"


@pytest.mark.parametrize(("name", "shape"), CLIENT_METHODS.items(), ids=list(CLIENT_METHODS))
def test_the_ws_client_keeps_the_methods_the_long_connection_drives(
    name: str, shape: tuple[bool, list[str]]
) -> None:
    is_coroutine, parameters = shape
    method = getattr(ws_client.Client, name, None)
    assert method is not None, changed(f"ws.Client.{name} is gone")
    assert inspect.iscoroutinefunction(method) == is_coroutine, changed(
        f"ws.Client.{name} is {'no longer' if is_coroutine else 'now'} a coroutine"
    )
    found = list(inspect.signature(method).parameters)
    assert found == parameters, changed(f"ws.Client.{name} takes {found}, not {parameters}")


def test_data_frames_still_reach_the_overridden_handler() -> None:
    called = ws_client.Client._handle_message.__code__.co_names
    assert "_handle_data_frame" in called, changed(
        "ws.Client._handle_message no longer hands data frames to _handle_data_frame"
    )


def test_the_ws_client_runs_on_the_module_global_loop_the_connection_thread_replaces() -> None:
    assert isinstance(getattr(ws_client, "loop", None), asyncio.AbstractEventLoop), changed(
        "lark_oapi.ws.client.loop is no longer a module-global event loop"
    )
    uses = inspect.getclosurevars(ws_client.Client._connect).globals
    assert "loop" in uses, changed("ws.Client._connect no longer schedules on the global loop")


async def test_a_ws_client_keeps_auto_reconnect_settable_and_joins_split_frames() -> None:
    # Built inside a running loop, as the connection thread builds it: the SDK's cache starts a
    # sweeper task on the current loop.
    before = asyncio.all_tasks()
    client = ws_client.Client(
        app_id="cli_canary",
        app_secret="s",
        log_level=lark.LogLevel.WARNING,
        domain="http://127.0.0.1:9",
        auto_reconnect=True,
    )
    try:
        assert getattr(client, "_auto_reconnect", None) is True, changed(
            "ws.Client no longer keeps auto_reconnect in _auto_reconnect"
        )
        # Split frames are joined by the SDK's own _combine, which the override still calls.
        assert client._combine("m1", 2, 0, b"ab") is None, changed("ws.Client._combine")
        assert client._combine("m1", 2, 1, b"cd") == b"abcd", changed("ws.Client._combine")
    finally:
        started = asyncio.all_tasks() - before
        for task in started:
            task.cancel()
        await asyncio.gather(*started, return_exceptions=True)


def test_a_refused_connection_still_carries_its_code() -> None:
    error = ws_client.ClientException(1000040345, "app not found")
    assert getattr(error, "code", None) == 1000040345, changed("ws.ClientException.code")


def test_the_sdk_reads_its_tenant_token_from_the_cache_key_amux_clears() -> None:
    config = Config()
    config.app_id = "cli_canary_token"
    config.app_secret = "s"
    # Nothing listens here: had the key moved, the SDK's fetch fails at once instead of going out.
    config.domain = "http://127.0.0.1:9"
    key = TENANT_TOKEN_CACHE_KEY.format(app_id=config.app_id)
    TokenManager.cache.set(key, "t-canary", int(time.time()) + 600)
    try:
        token = TokenManager.get_self_tenant_token(config)
    except Exception as error:
        pytest.fail(changed(f"the tenant token is no longer cached under {key!r} ({error!r})"))
    finally:
        TokenManager.cache.set(key, "", 0)
    assert token == "t-canary", changed(f"the tenant token is no longer cached under {key!r}")
