"""A warm ``amux mcp`` per worker: the MCP SDK imported once, one forked server per launch.

Claude and Codex wait for their MCP servers before the first model request, and a cold
``amux mcp`` spends about a second importing the SDK. The host imports it once and listens on a
private Unix socket; for each connection from ``mcp_shim`` it forks a child that takes the
launch's ``AMUX_*`` variables from the shim's first line, puts the connection on its stdin and
stdout, and serves ``amux mcp`` there: the server the host built once before forking, bound to
this launch's own bridge. The host itself never speaks to the
Hub: every child authenticates with its own launch's delegated credential.

A root worker runs each Principal's Agents as a uid of their own, so the socket is open to any
user that reaches it (its directory is root's alone: only sandboxes it is bound into reach it),
and each child first becomes the user at the other end of its connection (``SO_PEERCRED``): an
Agent's server has that Agent's rights and no more.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import socket
import struct
import sys

from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import jsonrpc_message_adapter

from runtime_bridge import mcp_server
from runtime_bridge.launch_env import NO_OWNER_TOKEN
from runtime_bridge.mcp_paging import CONTINUE_TOOL
from runtime_bridge.mcp_shim import FORWARDED, HOST_HUB_URL

HEADER_LIMIT = 64 * 1024
READY = "ready"


def _read_header(conn: socket.socket) -> dict[str, str]:
    # Byte by byte: whatever follows the newline is the Agent's MCP traffic, not ours to read.
    raw = bytearray()
    while not raw.endswith(b"\n"):
        byte = conn.recv(1)
        if not byte or len(raw) > HEADER_LIMIT:
            raise ConnectionError("the shim closed before sending its settings")
        raw += byte
    header = json.loads(raw)
    if not isinstance(header, dict):
        raise ConnectionError("the shim's settings are not an object")
    return {k: v for k, v in header.items() if k in FORWARDED and isinstance(v, str)}


def _become_peer(conn: socket.socket) -> None:
    """Drop to the connecting process's uid and gid when the host runs as root."""
    if os.geteuid() != 0:
        return
    credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, gid = struct.unpack("3i", credentials)
    if uid == 0:
        return
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _child(conn: socket.socket, built: tuple[MCPServer, mcp_server.BridgeSlot]) -> None:
    """Serve one launch on ``conn`` with the server built before the fork; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _become_peer(conn)
        header = _read_header(conn)
        for key in FORWARDED:
            os.environ.pop(key, None)
        os.environ.update(header)
        own_hub = os.environ.get(HOST_HUB_URL)
        if own_hub:
            os.environ["AMUX_HUB_URL"] = own_hub
        # Whoever reaches the socket (any sandboxed Agent of this worker) speaks only with the
        # credential it sends: never with a token file the host's user could read.
        os.environ.pop("AMUX_HOME", None)
        os.environ.update(NO_OWNER_TOKEN)
        os.dup2(conn.fileno(), 0)
        os.dup2(conn.fileno(), 1)
        conn.close()
        mcp_server.main(built)
        code = 0
    except BaseException:
        # A forked child must never return into the host's accept loop.
        code = 1
    finally:
        os._exit(code)


def _warm_up() -> tuple[MCPServer, mcp_server.BridgeSlot]:
    """Do once, before forking, what every server would otherwise repeat: settings parsing,
    the transport's imports, and the server itself with its tool schemas; each child binds its
    own launch's bridge to it."""
    import mcp.server.stdio  # noqa: F401

    # A cold `amux mcp` imports the HTTP client at its first tool call; a child has it already.
    import hub.client  # noqa: F401
    from hub.config import ClientSettings

    # As ``amux mcp`` does before building a server, whose own logging set-up then stays out.
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    from hub.errors import InvalidArgument

    ClientSettings()
    # Answers only if a child failed to bind its launch's bridge, which it never serves without.
    slot = mcp_server.BridgeSlot(mcp_server.MemoryBridge(None, refusal=InvalidArgument("unbound")))
    server = mcp_server.build_server(slot)
    asyncio.run(_rehearse(server))
    return server, slot


async def _rehearse(server: MCPServer) -> None:
    """One whole session in memory: the SDK builds its message validators and serializers on
    first use, which would otherwise happen again in every child before it can answer."""
    async with Client(server) as client:
        await client.list_tools()
        await client.call_tool(CONTINUE_TOOL, {"cursor": "rehearsal"})
    line = '{"jsonrpc": "2.0", "id": 1, "method": "ping"}'
    jsonrpc_message_adapter.validate_json(line, by_name=False).model_dump_json(
        by_alias=True, exclude_unset=True
    )


def serve(socket_path: str) -> None:
    """Listen on ``socket_path`` and fork one server per connection.

    The socket is owner-only unless the host runs as root: then its private directory is what
    keeps others out, and Agents of other uids, bound to it in their sandbox, may connect.
    """
    built = _warm_up()
    # Children share the host's memory copy-on-write; a collection in a child walking what the
    # host imported would copy those pages and spend a launch's time on them.
    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o111 if os.geteuid() == 0 else 0o177)
    try:
        listener.bind(socket_path)
    finally:
        os.umask(previous)
    listener.listen(64)
    print(READY, flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            _child(conn, built)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
