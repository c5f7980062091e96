"""The webhook: ``POST /feishu/events`` for events and card callbacks, inside the amux app.

Thin edge: read the body, let :class:`WebhookVerifier` authenticate and decrypt it, let
:class:`EventDispatcher` answer, and turn typed errors into their status and JSON shape
(401 signature/timestamp, 403 token, 400 garbage) rather than the SDK's 500, which Feishu
would keep retrying. The route is open to anyone, so the body is read as ``hub.bodies`` reads
any: uncompressed only (415), at most ``MAX_BODY_BYTES`` (413), within a deadline (408), and a
refused request's connection is closed unread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiohttp import web

from bot.feishu.dispatcher import EventDispatcher
from bot.feishu.verifier import WebhookVerifier
from hub.bodies import read_body
from hub.errors import AmuxError

logger = logging.getLogger(__name__)

EVENTS_PATH = "/feishu/events"
# Feishu's events and card callbacks are a few KB; anything near this is not from Feishu.
MAX_BODY_BYTES = 1024 * 1024


class WebhookIngress:
    """Owns the webhook route; mount with ``app.add_routes(ingress.routes())``."""

    def __init__(
        self,
        verifier: WebhookVerifier,
        dispatcher: EventDispatcher,
        *,
        clock: Callable[[], float] = time.time,
        max_body_bytes: int = MAX_BODY_BYTES,
        body_seconds: float = 10.0,
    ) -> None:
        self._verifier = verifier
        self._dispatcher = dispatcher
        self._clock = clock
        self._max_body = max_body_bytes
        self._body_seconds = body_seconds

    def routes(self) -> list[web.RouteDef]:
        return [web.post(EVENTS_PATH, self.handle)]

    async def handle(self, request: web.Request) -> web.Response:
        try:
            # The whole body: the signature covers the exact bytes received.
            body = await read_body(request, self._max_body, self._body_seconds)
            payload = self._verifier.open(request.headers, body, self._clock())
            accepted = await self._dispatcher.accept(payload)
        except AmuxError as error:
            logger.warning("Feishu webhook request refused: %s (%s)", error.code, error.message)
            return web.json_response(error.to_wire(), status=error.status)
        response = web.json_response(accepted.answer)
        try:
            # Sent here, not by aiohttp after the return, so the event's handler starts only
            # once Feishu has its answer.
            await response.prepare(request)
            await response.write_eof()
        finally:
            # Even when the answer could not be sent: the event is recorded as seen, so
            # Feishu's retry would be dropped and this is its one chance to run.
            accepted.answered()
        return response
