"""What every request to the Hub passes through: a request id, and the graceful drain.

A request id comes from a valid incoming ``X-Request-Id`` or is generated, lives in a contextvar for
the request's task (so every log line written while serving it carries it), and is echoed in the
response header. Ids are kept only when short, printable and not shaped like a credential, because
they end up in every log line.

The drain: once a stop or restart begins, in-flight requests finish and new ones are refused with
503. aiohttp's own shutdown waits its full timeout for connections that arrive while it stops, so
the Hub tracks its requests itself and hands aiohttp an already idle server. A request whose body
is still arriving has done no work yet: the drain ends its read at once (``hub.bodies``) instead
of waiting for a client that may be dribbling bytes on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web

from hub.bodies import BODY_READS, BodyReads, close_refused
from hub.errors import Unavailable
from hub.requestid import REQUEST_ID, REQUEST_ID_HEADER
from hub.rpc import error_response

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

REQUEST_ID_KEY = web.RequestKey("request_id", str)
_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
# Hub credentials are "amux_" + 43 URL-safe characters; shorter words like amux_home are not.
CREDENTIAL_SHAPE = re.compile(r"\bamux_[A-Za-z0-9_-]{20,}")


def request_id_of(value: str | None) -> str:
    """The caller's id when it is well-formed and not shaped like a credential, else a fresh one."""
    if (
        value is not None
        and _VALID_REQUEST_ID.fullmatch(value)
        and CREDENTIAL_SHAPE.search(value) is None
    ):
        return value
    # An id names a request in the logs and means nothing to security: a generator without a
    # system call per request does, where uuid4 reads the kernel's random source every time.
    return f"{random.getrandbits(128):032x}"


RESTARTING = "the Hub is restarting; retry in a moment"


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.reads = BodyReads()

    async def serve(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.draining:
            response = error_response(Unavailable(RESTARTING))
            response.force_close()
            return response
        with self.admitted():
            return await handler(request)

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """One request in flight, which the drain waits for; a client in the Hub's own process
        passes here as an HTTP request does.

        Raises:
            Unavailable: the drain has begun.
        """
        if self.draining:
            raise Unavailable(RESTARTING)
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def wait_idle(self, seconds: float) -> bool:
        """Start draining and wait for in-flight requests; False if some outlived ``seconds``."""
        self.draining = True
        self.reads.end_all()
        try:
            await asyncio.wait_for(self._idle.wait(), seconds)
        except TimeoutError:
            return False
        return True


DRAIN = web.AppKey("drain", Drain)


def install_middleware(app: web.Application) -> Drain:
    """Put both in front of every request of ``app``: the request id outermost (so a refusal
    while draining carries one too), then the drain. Echoes the id on every response, and closes
    the connection of a request whose body was refused. One middleware and one signal handler
    do it all: each layer aiohttp runs per request is a measurable share of a small read."""
    drain = Drain()
    app[DRAIN] = drain
    app[BODY_READS] = drain.reads

    @web.middleware
    async def hub_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request_id = request_id_of(request.headers.get(REQUEST_ID_HEADER))
        request[REQUEST_ID_KEY] = request_id
        token = REQUEST_ID.set(request_id)
        try:
            return await drain.serve(request, handler)
        finally:
            REQUEST_ID.reset(token)

    async def prepared(request: web.Request, response: web.StreamResponse) -> None:
        request_id = request.get(REQUEST_ID_KEY)
        if request_id is not None:
            response.headers[REQUEST_ID_HEADER] = request_id
        await close_refused(request, response)

    app.middlewares.insert(0, hub_middleware)
    app.on_response_prepare.append(prepared)
    return drain
