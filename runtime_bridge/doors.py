"""The worker's side of a launch's doors: the Unix sockets its relay connects to.

Each socket is bound in the launch's own run directory owner-only from the first instant
(``owner_only_socket``), then handed to the Agent's uid (a root worker's Agent runs as a uid of
its own): no other launch's sandbox binds that directory, and no other uid may connect. The
model door is carried to the gateway and the hub door to the Hub (over TLS when the Hub's URL is
https, so the Agent speaks plain HTTP to its door); the egress door is the proxy of
``runtime_bridge/egress.py``.

The worker serves doors in the Hub's own process (``amux serve``), so whatever a door holds is
held there, out of the descriptors every other person's turn and request needs. An Agent is
untrusted code, so what it can make a door hold is bounded:

- each door of a launch holds at most ``DOOR_CONNECTIONS`` connections at once; one past that is
  closed as soon as it is accepted;
- a request's head must be complete within ``HEAD_SECONDS``, or the connection is closed; only
  then does a door connect onward, so a connection that never finishes its request costs the
  Hub nothing;
- the hub door passes only what an Agent's ``amux mcp`` and ``amux memory`` send:
  ``POST /rpc/v1/<method>``, one request per connection (so every request is checked).
  ``/metrics``, ``/readyz``, ``/healthz`` and anything else are answered 404 at the door.

Each kind of refusal is logged once per launch and door: an Agent repeating it cannot fill the
log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import ssl
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

from runtime_bridge.approvals import owner_only_socket
from runtime_bridge.egress import HEAD_LIMIT, HEAD_SECONDS, Egress, answer, pipe, splice
from runtime_bridge.network import EGRESS, HUB, MODEL, Door

logger = logging.getLogger("amux.worker")

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]

# Far above what an Agent's CLI opens at once (Claude and Codex keep a few connections to their
# model, npm some more through the egress door), far below what would use up the Hub's files.
DOOR_CONNECTIONS = 32
# Method names as the Hub's RPC spells them (``memory.search``, ``system.config.get``): no dot
# segment, no query, nothing the Hub's router could read as another path.
HUB_PATH = re.compile(r"/rpc/v1/[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
HUB_ONLY = "amux: the hub door passes only POST /rpc/v1/<method>"
# Request headers a one-request connection replaces or cannot honour.
_DROPPED = frozenset({b"connection", b"keep-alive", b"proxy-connection"})


class DoorRefusal(Exception):
    """A request a door does not pass on: ``status`` and ``reason`` are the Agent's answer,
    ``kind`` what the log says once per launch, ``example`` this request's part in it."""

    def __init__(self, status: int, reason: str, kind: str, example: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.kind = kind
        self.example = example


async def read_head(reader: asyncio.StreamReader) -> bytes:
    """A request's head, its blank line included.

    Raises:
        TimeoutError: not complete within ``HEAD_SECONDS``.
        DoorRefusal: larger than ``HEAD_LIMIT``.
        asyncio.IncompleteReadError: the connection ended first.
    """
    try:
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
    except asyncio.LimitOverrunError:
        raise DoorRefusal(431, "request head too large", "an oversized request head") from None


def hub_request(head: bytes) -> tuple[bytes, int]:
    """The head to send the Hub for ``head`` (one request, then the connection closes) and the
    length of the body that follows it.

    Raises:
        DoorRefusal: not ``POST /rpc/v1/<method>`` with a plain ``Content-Length`` body.
    """
    request_line, *lines = head[:-4].split(b"\r\n")
    words = request_line.split(b" ")
    if len(words) != 3 or not words[2].startswith(b"HTTP/1."):
        raise DoorRefusal(400, "not an HTTP/1.1 request", "a request that is not HTTP/1.1")
    method, target = words[0], words[1].decode("latin-1")
    if method != b"POST" or not HUB_PATH.fullmatch(target):
        shown = f"{method.decode('latin-1')[:16]} {target[:80]}"
        raise DoorRefusal(404, HUB_ONLY, "a request that is not POST /rpc/v1/<method>", shown)
    kept: list[bytes] = []
    lengths: list[bytes] = []
    for line in lines:
        name, colon, value = line.partition(b":")
        name = name.strip().lower()
        if not colon or not name:
            raise DoorRefusal(400, "malformed request header", "a malformed request header")
        if name == b"transfer-encoding":
            # The Hub's clients send a body of known length; a chunked one could not be
            # delimited here without parsing it.
            raise DoorRefusal(411, "a request body needs Content-Length", "a chunked request")
        if name == b"content-length":
            lengths.append(value.strip())
        if name not in _DROPPED:
            kept.append(line)
    if len(lengths) > 1 or (lengths and not lengths[0].isdigit()):
        raise DoorRefusal(400, "one Content-Length, a number", "a request of unclear length")
    kept.append(b"Connection: close")
    return b"\r\n".join([request_line, *kept]) + b"\r\n\r\n", int(lengths[0]) if lengths else 0


async def _send_body(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int
) -> None:
    """``length`` bytes of ``reader`` to ``writer``; nothing after them (the next request on the
    same connection is never passed on unchecked)."""
    with contextlib.suppress(ConnectionError, OSError, asyncio.IncompleteReadError):
        while length > 0:
            data = await reader.read(min(length, 65536))
            if not data:
                return
            length -= len(data)
            writer.write(data)
            await writer.drain()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
        await writer.wait_closed()


def _forward(
    host: str, port: int, tls: ssl.SSLContext | None = None, *, hub: bool = False
) -> Handler:
    async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_head(reader)
        length = 0
        if hub:
            head, length = hub_request(head)
        try:
            upstream = await asyncio.open_connection(
                host, port, ssl=tls, server_hostname=host if tls else None
            )
        except OSError:
            return
        try:
            upstream[1].write(head)
            if hub:
                sending = asyncio.create_task(_send_body(reader, upstream[1], length))
                try:
                    await pipe(upstream[0], writer)
                finally:
                    sending.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sending
            else:
                await splice((reader, writer), upstream)
        finally:
            await _close(upstream[1])

    return carry


def hub_address(hub_url: str) -> tuple[str, int, ssl.SSLContext | None]:
    """Where the hub door connects, and the TLS it speaks there (None: plain HTTP)."""
    parts = urlsplit(hub_url)
    secure = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if secure else 80)
    return host, port, ssl.create_default_context() if secure else None


class LaunchDoors:
    """Serves one launch's doors until closed. ``label`` names the launch in the log."""

    def __init__(
        self,
        doors: tuple[Door, ...],
        *,
        gateway_url: str,
        hub_url: str,
        egress: Egress,
        owner: tuple[int, int] | None = None,
        label: str = "",
        limit: int = DOOR_CONNECTIONS,
    ) -> None:
        host, port, tls = hub_address(hub_url)
        gateway = urlsplit(gateway_url)
        self._handlers: dict[str, Handler] = {
            MODEL: _forward(gateway.hostname or "127.0.0.1", gateway.port or 80),
            HUB: _forward(host, port, tls, hub=True),
            EGRESS: egress.handle,
        }
        self._doors = doors
        self._owner = owner
        self._label = label
        self._limit = limit
        self._open: dict[str, int] = {}
        self._logged: set[tuple[str, str]] = set()
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def _refused(self, door: str, kind: str, example: str = "") -> None:
        # Keyed by the kind alone: an Agent varying its requests still makes one line.
        if (door, kind) in self._logged:
            return
        self._logged.add((door, kind))
        logger.warning(
            "launch %s: its %s door refused %s%s (logged once per launch)",
            self._label,
            door,
            kind,
            f", first {example!r}" if example else "",
        )

    def _tracked(self, door: str, handler: Handler) -> Handler:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if self._open.get(door, 0) >= self._limit:
                # Closed before anything is read or connected: it holds nothing past this.
                writer.transport.abort()
                self._refused(door, f"connections past {self._limit} at once")
                return
            task = asyncio.current_task()
            assert task is not None
            self._tasks.add(task)
            self._open[door] = self._open.get(door, 0) + 1
            try:
                await handler(reader, writer)
            except TimeoutError:
                self._refused(door, f"a request head not complete within {HEAD_SECONDS:g}s")
            except DoorRefusal as refusal:
                await answer(writer, refusal.status, refusal.reason)
                self._refused(door, refusal.kind, refusal.example)
            except (ConnectionError, OSError, ssl.SSLError, asyncio.IncompleteReadError):
                pass
            finally:
                self._open[door] -= 1
                self._tasks.discard(task)
                await _close(writer)

        return serve

    async def __aenter__(self) -> LaunchDoors:
        try:
            for door in self._doors:
                server = await asyncio.start_unix_server(
                    self._tracked(door.name, self._handlers[door.name]),
                    sock=owner_only_socket(door.socket),
                    limit=HEAD_LIMIT,
                )
                self._servers.append(server)
                if self._owner is not None:
                    os.chown(door.socket, *self._owner, follow_symlinks=False)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        for door in self._doors:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(door.socket)
