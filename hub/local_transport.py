"""A ``hub.client`` transport for a client in the Hub's own process: no socket, same rules.

A call goes through what an HTTP request to ``/rpc/v1/<method>`` goes through, in its order: the
drain (refused once a stop or restart begins, waited for until then), the request id, the
metrics, the error mapping, authentication with the bearer credential the client presents, the
body limit and the method's dispatch (``hub.rpc.serve_rpc``). The answer is the JSON bytes an
HTTP caller would read, so the client decodes results and errors the one way it always does.
Each call ends with the access line an HTTP request would have (``hub.access``), marked
``transport=local``: operators trace an in-process caller by its request id as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from aiohttp import web

from hub.access import ACCESS_LOGGER, log_access
from hub.client import BINDING_HEADER, VIA_HEADER
from hub.errors import AmuxError, PayloadTooLarge
from hub.middleware import DRAIN, request_id_of
from hub.requestid import REQUEST_ID, REQUEST_ID_HEADER
from hub.rpc import HUB, RPC_METHODS, RpcRequest, dumps, serve_rpc


class LocalTransport:
    """Serves a ``HubClient``'s calls from ``app``, the application ``hub.server.add_hub``
    mounted the Hub on; use it only while that application runs."""

    def __init__(self, app: web.Application, access_log: logging.Logger = ACCESS_LOGGER) -> None:
        self._app = app
        self._access_log = access_log

    async def send(self, method: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        gone = asyncio.Event()
        serving = asyncio.ensure_future(self._serve(method, body, headers, gone))
        try:
            # Like an HTTP handler, the call runs to its end when its caller stops waiting (a
            # change is not cut in half); a long poll sees the caller gone, as over a socket.
            return await asyncio.shield(serving)
        except asyncio.CancelledError:
            gone.set()
            raise

    async def _serve(
        self, method: str, body: bytes, headers: Mapping[str, str], gone: asyncio.Event
    ) -> tuple[int, bytes]:
        app = self._app
        limit = app[HUB].settings.max_request_bytes

        async def read_body() -> bytes:
            if len(body) > limit:
                raise PayloadTooLarge(f"request body is over {limit} bytes")
            return body

        request = RpcRequest(
            name=method,
            authorization=headers.get("Authorization"),
            read_body=read_body,
            binding=headers.get(BINDING_HEADER) or None,
            via=headers.get(VIA_HEADER, ""),
            path=f"/rpc/v1/{method}",
            connected=lambda: not gone.is_set(),
        )
        started = time.perf_counter()
        request_id = request_id_of(headers.get(REQUEST_ID_HEADER))
        try:
            with app[DRAIN].admitted():
                # This task's own context: the id lasts for this call only.
                REQUEST_ID.set(request_id)
                answer = await serve_rpc(app, app[RPC_METHODS], request)
            status, raw = answer.status, answer.body
        except AmuxError as refused:
            status, raw = refused.status, dumps(refused.to_wire())
        seconds = time.perf_counter() - started
        log_access(
            self._access_log, "POST", request.path, status, request_id, seconds, transport="local"
        )
        return status, raw

    async def close(self) -> None:
        """Nothing to release: the application owns the Hub."""
