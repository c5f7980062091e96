"""The long connection: lark-oapi's WebSocket client in its own thread, feeding the main loop.

``lark.ws.Client.start()`` blocks forever on the module-global ``lark_oapi.ws.client.loop`` and
has no ``stop()``. So a dedicated thread creates a loop, installs it as that global, and drives
the client's connect/ping/receive coroutines itself, which makes a clean stop possible. The
subclass handles ``event`` *and* ``card`` data frames (1.7.5 drops card frames) by handing the
plaintext payload to the :class:`EventDispatcher` on the main loop and writing its answer back
within Feishu's 3 s. Only one long connection can run per process (the SDK's loop is global).

A watchdog beside the SDK's ping loop notes every frame; when none has arrived for three ping
intervals the socket is aborted, and the SDK's receive loop reconnects as it does after any drop
(see :mod:`bot.feishu.liveness`). If the SDK gives up reconnecting, the watchdog starts again.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bot.config import FeishuSettings
from bot.feishu.dispatcher import Accepted, EventDispatcher
from bot.feishu.errors import FeishuApiError
from bot.feishu.events import CARD_ACTION, event_type_of
from bot.feishu.liveness import LinkHealth
from bot.feishu.sdk import lark, ws_client
from hub.errors import AmuxError, Unavailable

logger = logging.getLogger(__name__)

# Feishu waits 3 s for a frame's answer; the dispatcher bounds card handlers below this.
ANSWER_TIMEOUT_SECONDS = 2.8
# The watchdog looks at least this often (more often when the ping interval is short).
WATCH_SECONDS = 5.0

# The answer, whether it is a card's, and what to call once it was written (or failed to be).
PayloadHandler = Callable[[bytes], Awaitable[tuple[dict[str, Any], bool, Callable[[], None]]]]


def _nothing() -> None:
    pass


def _header(frame: Any, key: str) -> str:
    for header in frame.headers:
        if header.key == key:
            return str(header.value)
    return ""


class _WsClient(ws_client.Client):  # type: ignore[misc]
    """The SDK client with data frames (events and card clicks) routed to amux."""

    def __init__(self, handle_payload: PayloadHandler, health: LinkHealth, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handle_payload = handle_payload
        self._health = health
        self.on_reconnecting = self._reconnecting

    def _reconnecting(self) -> None:
        self._health.state = "reconnecting"

    def _configure(self, conf: Any) -> None:
        super()._configure(conf)
        if self._ping_interval and self._ping_interval > 0:
            self._health.ping_interval = float(self._ping_interval)

    async def _connect(self) -> None:
        await super()._connect()
        if self._conn is not None:
            self._health.connected()

    async def _reconnect(self) -> None:
        try:
            await super()._reconnect()
        except Exception as error:
            # The SDK stops after the server's reconnect count; the watchdog tries again later.
            self._health.gave_up()
            logger.error("Feishu long connection gave up reconnecting: %s", error)

    async def retry(self) -> None:
        """One more connection attempt after the SDK gave up (it may be told to try 0 times)."""
        self._reconnecting()
        try:
            await self._connect()
        except Exception as error:
            self._health.gave_up()
            logger.warning("Feishu long connection still down: %s", error or type(error).__name__)

    async def _handle_message(self, msg: bytes) -> None:
        self._health.frame()
        await super()._handle_message(msg)

    def abort(self) -> None:
        """Drop the socket at once: a silent peer cannot be relied on to finish a close."""
        conn = self._conn
        transport = getattr(conn, "transport", None)
        if transport is not None:
            transport.abort()
        elif conn is not None:
            asyncio.get_running_loop().create_task(conn.close())

    async def _handle_data_frame(self, frame: Any) -> None:
        kind = _header(frame, "type")
        if kind not in ("event", "card"):
            return
        self._health.frame(is_event=True)
        payload = frame.payload
        parts = int(_header(frame, "sum") or 1)
        if parts > 1:
            payload = self._combine(
                _header(frame, "message_id"), parts, int(_header(frame, "seq") or 0), payload
            )
            if payload is None:
                return
        started = time.monotonic()
        response: dict[str, Any] = {"code": 200}
        answered = _nothing
        try:
            answer, is_card, answered = await self._handle_payload(payload)
            if is_card or kind == "card":
                encoded = json.dumps(answer, ensure_ascii=False).encode("utf-8")
                response["data"] = base64.b64encode(encoded).decode("ascii")
        except Exception:
            logger.exception("Feishu long-connection frame failed")
            response = {"code": 500}
        header = frame.headers.add()
        header.key = "biz_rt"
        header.value = str(int((time.monotonic() - started) * 1000))
        frame.payload = json.dumps(response).encode("utf-8")
        try:
            await self._write_message(frame.SerializeToString())
        finally:
            # As over the webhook, the event's handler starts once Feishu has its answer.
            answered()


class LongConnection:
    """Receives Feishu events over the SDK's WebSocket and dispatches them on the main loop."""

    def __init__(self, settings: FeishuSettings, dispatcher: EventDispatcher) -> None:
        self._settings = settings
        self._dispatcher = dispatcher
        self._main_loop: asyncio.AbstractEventLoop | None = None
        self._ws_loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.error: AmuxError | None = None
        self.health = LinkHealth()

    def start(self) -> None:
        """Start the connection thread; call from the main loop."""
        if self._thread is not None:
            raise RuntimeError("long connection already started")
        self._main_loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, name="feishu-long-connection", daemon=True
        )
        self._thread.start()

    async def wait_connected(self, within_seconds: float = 10.0) -> None:
        """Return once connected.

        Raises:
            FeishuApiError: Feishu refused the app's credentials.
            Unavailable: not connected within ``within_seconds``.
        """
        ready = await asyncio.to_thread(self._ready.wait, within_seconds)
        if self.error is not None:
            raise self.error
        if not ready:
            raise Unavailable("Feishu long connection not established in time")

    async def stop(self, within_seconds: float = 10.0) -> None:
        """Close the WebSocket and end the thread."""
        self._stopping = True
        loop, event = self._ws_loop, self._stop_event
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, within_seconds)

    # -- the connection thread -------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        ws_client.loop = loop
        self._ws_loop = loop
        try:
            loop.run_until_complete(self._serve())
        except Exception:
            logger.exception("Feishu long connection stopped unexpectedly")
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            asyncio.set_event_loop(None)
            loop.close()
            self.health.state = "disconnected"
            self._ready.set()

    async def _serve(self) -> None:
        self._stop_event = asyncio.Event()
        if self._stopping:
            return
        client = _WsClient(
            self._handle_payload,
            self.health,
            app_id=self._settings.app_id,
            app_secret=self._settings.app_secret.get_secret_value(),
            log_level=lark.LogLevel.WARNING,
            domain=self._settings.domain,
            auto_reconnect=True,
        )
        try:
            await client._connect()
        except ws_client.ClientException as error:
            self.error = FeishuApiError(
                f"Feishu refused the long connection ({error.code})", feishu_code=error.code
            )
            self._ready.set()
            return
        except Exception as error:
            logger.warning("Feishu long connection failed (%s); retrying", type(error).__name__)
            await client._disconnect()
            await client._reconnect()
        self._ready.set()
        if self.health.state == "connected":
            logger.info("Feishu long connection established")
        pinger = asyncio.get_running_loop().create_task(client._ping_loop())
        watchdog = asyncio.get_running_loop().create_task(self._watch(client))
        await self._stop_event.wait()
        client._auto_reconnect = False
        current = asyncio.current_task()
        for task in asyncio.all_tasks():
            if task is not current:
                task.cancel()
        await asyncio.gather(pinger, watchdog, return_exceptions=True)
        await client._disconnect()

    async def _watch(self, client: _WsClient) -> None:
        """Replace a connection that has heard nothing for three ping intervals."""
        health = self.health
        retry: asyncio.Task[None] | None = None
        while True:
            await asyncio.sleep(min(health.ping_interval / 2, WATCH_SECONDS))
            silent, bound = health.silent_for(), health.silence_bound
            if silent <= bound:
                continue
            if client._conn is not None:
                logger.warning(
                    "Feishu long connection silent for %.1fs (over %.1fs, 3 ping intervals); "
                    "reconnecting",
                    silent,
                    bound,
                )
                health.silent_reconnects += 1
                health.state = "reconnecting"
                # Counted once: the next count starts when the new connection is up.
                health.quiet_since = None
                client.abort()
            elif health.state == "disconnected" and (retry is None or retry.done()):
                logger.warning("Feishu long connection down for %.1fs; reconnecting", silent)
                health.quiet_since = time.monotonic()
                retry = asyncio.get_running_loop().create_task(client.retry())

    async def _handle_payload(self, raw: bytes) -> tuple[dict[str, Any], bool, Callable[[], None]]:
        """Runs on the connection loop: accept on the main loop and wait for the answer."""
        payload = json.loads(raw)
        if not isinstance(payload, dict):
            return {}, False, _nothing
        main_loop = self._main_loop
        assert main_loop is not None
        future = asyncio.run_coroutine_threadsafe(self._dispatcher.accept(payload), main_loop)

        def release(done: concurrent.futures.Future[Accepted]) -> None:
            if done.cancelled() or done.exception() is not None or main_loop.is_closed():
                return
            main_loop.call_soon_threadsafe(done.result().answered)

        def answered() -> None:
            # Also when the answer timed out: the accept may finish later, and then its
            # handler is owed.
            future.add_done_callback(release)

        is_card = event_type_of(payload) == CARD_ACTION
        # shield: the timeout must not cancel the accept on the main loop, whose handler
        # the event's de-duplication record already promises.
        waiting = asyncio.shield(asyncio.wrap_future(future))
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_SECONDS):
                accepted = await waiting
        except TimeoutError:
            return {}, is_card, answered
        except AmuxError as error:
            logger.warning("Feishu long-connection event refused: %s", error.message)
            return {}, is_card, answered
        return accepted.answer, is_card, answered
