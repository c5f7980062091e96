"""Request bodies from outside: never inflated, bounded in bytes and in time.

- The server never inflates a body (``SERVER_ARGS`` turns aiohttp's ``auto_decompress`` off): a
  ``Content-Encoding`` other than identity is refused unread, whatever it would inflate to.
  Inflating happens as bytes arrive, before any handler could look at a size.
- A body is read chunk by chunk and refused as soon as it would pass its bound (a declared
  ``Content-Length`` over it is refused before reading); nothing past the bound is buffered.
- A body must arrive whole within a deadline (``AMUX_REQUEST_BODY_SECONDS``), else 408; a drain
  that begins meanwhile ends the read at once with 503, so a client dribbling bytes holds
  neither a connection nor a restart.
- A refused request's response says ``Connection: close``, and its connection is closed without
  reading the rest: aiohttp's lingering read (up to 10 s of whatever the client still sends) is
  off, so a refusal costs the Hub nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from hub.errors import (
    AmuxError,
    InvalidArgument,
    PayloadTooLarge,
    RequestTimeout,
    Unavailable,
    UnsupportedEncoding,
)

# For ``web.Application(handler_args=...)``: the server's connection handling, per connection.
SERVER_ARGS: Mapping[str, Any] = {"auto_decompress": False, "lingering_time": 0}
_IDENTITY = frozenset({"", "identity"})
_REFUSED = web.RequestKey("body_refused", bool)


class BodyReads:
    """The deadlines of request bodies still arriving; ending them all is how a drain starts."""

    def __init__(self) -> None:
        self.ended = False
        self._deadlines: set[asyncio.Timeout] = set()

    @contextlib.contextmanager
    def reading(self, deadline: asyncio.Timeout) -> Iterator[None]:
        """While a body arrives under ``deadline``, which ``end_all`` moves to now."""
        self._deadlines.add(deadline)
        if self.ended:
            _expire(deadline)
        try:
            yield
        finally:
            self._deadlines.discard(deadline)

    def end_all(self) -> None:
        """Every body still arriving, and every later one, stops being read at once."""
        self.ended = True
        for deadline in list(self._deadlines):
            _expire(deadline)


def _expire(deadline: asyncio.Timeout) -> None:
    if not deadline.expired():
        deadline.reschedule(asyncio.get_running_loop().time())


BODY_READS = web.AppKey("body_reads", BodyReads)


async def read_body(request: web.Request, limit: int, seconds: float) -> bytes:
    """The whole body of ``request``: at most ``limit`` bytes, received within ``seconds``.

    Raises:
        UnsupportedEncoding: the body is compressed (or otherwise encoded).
        PayloadTooLarge: it is (or says it is) over ``limit`` bytes.
        RequestTimeout: it did not arrive whole within ``seconds``.
        Unavailable: the Hub began draining while it arrived.
        InvalidArgument: the client hung up halfway, or its chunked encoding is broken.
    """
    try:
        return await _read(request, limit, seconds)
    except AmuxError:
        request[_REFUSED] = True
        raise


async def _read(request: web.Request, limit: int, seconds: float) -> bytes:
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    if encoding not in _IDENTITY:
        raise UnsupportedEncoding(
            f"request bodies are accepted uncompressed only, not with Content-Encoding {encoding}"
        )
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"request body is over {limit} bytes")
    content = request.content
    if content.is_eof():
        # The whole body came with the headers (most calls are small): nothing to wait for.
        try:
            whole = content.read_nowait()
        except (ConnectionError, HttpProcessingError):
            raise InvalidArgument("request body was cut off or malformed") from None
        if len(whole) > limit:
            raise PayloadTooLarge(f"request body is over {limit} bytes")
        return whole
    reads = request.app.get(BODY_READS)
    body = bytearray()
    try:
        async with asyncio.timeout(seconds) as deadline:
            with reads.reading(deadline) if reads is not None else contextlib.nullcontext():
                while chunk := await request.content.readany():
                    if len(body) + len(chunk) > limit:
                        raise PayloadTooLarge(f"request body is over {limit} bytes")
                    body += chunk
    except TimeoutError:
        if reads is not None and reads.ended:
            raise Unavailable("the Hub is restarting; retry in a moment") from None
        raise RequestTimeout(f"request body did not arrive within {seconds:g}s") from None
    except (ConnectionError, HttpProcessingError):
        # A client that hangs up (or breaks its chunked encoding) halfway: one log line, not
        # a traceback per attempt.
        raise InvalidArgument("request body was cut off or malformed") from None
    return bytes(body)


async def close_refused(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """``on_response_prepare``: a request whose body was refused has its connection closed."""
    if request.get(_REFUSED):
        response.force_close()
