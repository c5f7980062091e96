"""Connects an Agent's MCP stdio to its worker's warm ``amux mcp`` host.

Run as ``python -I -S mcp_shim.py SOCKET FALLBACK``: it imports nothing outside the standard
library, so it is ready in milliseconds, where a cold ``amux mcp`` spends about a second importing
the MCP SDK before the Agent may send its first model request. The first line it sends carries
this launch's ``AMUX_*`` connection variables; after that it relays bytes both ways. When the host
cannot be reached it becomes ``FALLBACK mcp`` (the ordinary cold server) instead.
"""

import json
import os
import selectors
import socket
import sys

# A launch's connection, and nothing that could point the host (which runs outside the Agent's
# sandbox) at credentials of its own: no AMUX_HOME, no owner-token fallback.
FORWARDED = (
    "AMUX_HUB_URL",
    "AMUX_TOKEN",
    "AMUX_MEMORY_BINDING",
    "AMUX_MEMORY_UNAVAILABLE",
    "AMUX_TIMEOUT",
)
CHUNK = 65536
# The Hub URL the worker gives its host: the host's servers use it instead of the one a launch
# sends (inside a network namespace of its own, the Agent knows the Hub only by its door).
HOST_HUB_URL = "AMUX_MCP_HOST_HUB_URL"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def relay(conn: socket.socket) -> None:
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "stdin")
    selector.register(conn, selectors.EVENT_READ, "host")
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":
                data = os.read(0, CHUNK)
                if data:
                    conn.sendall(data)
                else:
                    # The Agent closed its side: let the host finish answering, then end.
                    selector.unregister(0)
                    conn.shutdown(socket.SHUT_WR)
            else:
                data = conn.recv(CHUNK)
                if not data:
                    return
                _write_all(1, data)


def main() -> None:
    socket_path, fallback = sys.argv[1], sys.argv[2]
    header = {key: os.environ[key] for key in FORWARDED if key in os.environ}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path)
        conn.sendall(json.dumps(header).encode("utf-8") + b"\n")
    except OSError:
        conn.close()
        os.execv(fallback, [fallback, "mcp"])
    try:
        relay(conn)
    except (BrokenPipeError, ConnectionResetError):
        pass


if __name__ == "__main__":
    main()
