"""The worker's side of a launch's doors: the Unix sockets its relay connects to.

Each socket is bound in the launch's own run directory owner-only from the first instant
(``owner_only_socket``), then handed to the Agent's uid (a root worker's Agent runs as a uid of
its own): no other launch's sandbox binds that directory, and no other uid may connect. The
model door is carried to the gateway and the hub door to the Hub (over TLS when the Hub's URL is
https, so the Agent speaks plain HTTP to its door); the egress door is the proxy of
``runtime_bridge/egress.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

from runtime_bridge.approvals import owner_only_socket
from runtime_bridge.egress import Egress, splice
from runtime_bridge.network import EGRESS, HUB, MODEL, Door

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]


def _forward(host: str, port: int, tls: ssl.SSLContext | None = None) -> Handler:
    async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.open_connection(
                host, port, ssl=tls, server_hostname=host if tls else None
            )
        except OSError:
            writer.close()
            return
        try:
            await splice((reader, writer), upstream)
        finally:
            for end in (writer, upstream[1]):
                end.close()
                with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
                    await end.wait_closed()

    return carry


def hub_address(hub_url: str) -> tuple[str, int, ssl.SSLContext | None]:
    """Where the hub door connects, and the TLS it speaks there (None: plain HTTP)."""
    parts = urlsplit(hub_url)
    secure = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if secure else 80)
    return host, port, ssl.create_default_context() if secure else None


class LaunchDoors:
    """Serves one launch's doors until closed."""

    def __init__(
        self,
        doors: tuple[Door, ...],
        *,
        gateway_url: str,
        hub_url: str,
        egress: Egress,
        owner: tuple[int, int] | None = None,
    ) -> None:
        host, port, tls = hub_address(hub_url)
        gateway = urlsplit(gateway_url)
        self._handlers: dict[str, Handler] = {
            MODEL: _forward(gateway.hostname or "127.0.0.1", gateway.port or 80),
            HUB: _forward(host, port, tls),
            EGRESS: egress.handle,
        }
        self._doors = doors
        self._owner = owner
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def _tracked(self, handler: Handler) -> Handler:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._tasks.add(task)
            try:
                await handler(reader, writer)
            finally:
                self._tasks.discard(task)

        return serve

    async def __aenter__(self) -> LaunchDoors:
        try:
            for door in self._doors:
                server = await asyncio.start_unix_server(
                    self._tracked(self._handlers[door.name]), sock=owner_only_socket(door.socket)
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
