"""Graceful drain: once a stop or restart begins, finish in-flight requests and refuse new ones.

aiohttp's own shutdown waits its full timeout for connections that arrive while it stops, so the
service tracks its requests itself and hands aiohttp an already idle server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from hub.errors import Unavailable
from hub.rpc import error_response

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.draining:
            response = error_response(Unavailable("the Hub is restarting; retry in a moment"))
            response.force_close()
            return response
        self._in_flight += 1
        self._idle.clear()
        try:
            return await handler(request)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def wait_idle(self, seconds: float) -> bool:
        """Start draining and wait for in-flight requests; False if some outlived ``seconds``."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), seconds)
        except TimeoutError:
            return False
        return True


DRAIN = web.AppKey("drain", Drain)
