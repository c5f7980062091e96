"""The relay inside a launch's namespace, run as a real process: it carries each loopback door to
its Unix socket, and no more connections at once than the worker's side would keep."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from runtime_bridge.network import RELAY
from runtime_bridge.relay import DOOR_CONNECTIONS
from tests.conftest import free_port, until
from tests.runtime_bridge.test_doors import closed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


async def test_a_door_carries_at_most_its_bound_and_closes_the_rest_at_once(
    tmp_path: Path,
) -> None:
    carried: set[asyncio.StreamWriter] = set()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        carried.add(writer)
        try:
            with contextlib.suppress(ConnectionError):
                await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            carried.discard(writer)

    socket_path = tmp_path / "hub.sock"
    server = await asyncio.start_unix_server(hold, str(socket_path))
    port = free_port()
    relay = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", str(RELAY), f"{port}={socket_path}", "--", "sleep", "60",
        start_new_session=True,
    )  # fmt: skip
    try:
        await until(lambda: _listening(port), 10)
        await until(lambda: not carried, 10)
        opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(DOOR_CONNECTIONS)]
        await until(lambda: len(carried) == DOOR_CONNECTIONS, 10)
        extra = [await asyncio.open_connection("127.0.0.1", port) for _ in range(8)]
        assert all(await asyncio.gather(*(closed(reader, 5) for reader, _ in extra)))
        # The ones carried stay open, and a connection that ends frees its place.
        assert not await closed(opened[0][0], 0.2)
        opened[0][1].close()
        await until(lambda: len(carried) == DOOR_CONNECTIONS - 1, 10)
        again = await asyncio.open_connection("127.0.0.1", port)
        await until(lambda: len(carried) == DOOR_CONNECTIONS, 10)
        assert not await closed(again[0], 0.2)
        for _, writer in [*opened, *extra, again]:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for _, w in [*opened, *extra, again]))
    finally:
        # The relay's door-serving child is in the session it started: end them together.
        os.killpg(relay.pid, signal.SIGKILL)
        await relay.wait()
        # Every connection the relay carried now reads its end; none is left for the loop's close.
        await until(lambda: not carried, 10)
        server.close()
        await server.wait_closed()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True
