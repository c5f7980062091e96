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

A child is part of the launch that connected, not of the worker: it first joins the control
group of the process at the other end (``cgroups.launch_group_of``), so the launch's memory and
task bounds count it and the launch's end kills it; a child that cannot join serves nothing. An
Agent may connect as often as it likes, so each launch (its group; its pid namespace where
there is no group) has at most ``CONNECTIONS_PER_LAUNCH`` children at once: a connection past
that is closed at once, logged once per launch, and never waits for a turn. The other end is
known by a pidfd the kernel took at ``connect`` (``SO_PEERPIDFD``, Linux 6.5 and later), so an
Agent cannot exit and leave its pid to a process outside its launch to be mistaken for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import select
import signal
import socket
import struct
import sys
from collections.abc import Callable, Hashable
from pathlib import Path
from types import FrameType

from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import jsonrpc_message_adapter

from runtime_bridge import mcp_server
from runtime_bridge.cgroups import launch_group_of
from runtime_bridge.launch_env import NO_OWNER_TOKEN
from runtime_bridge.mcp_paging import CONTINUE_TOOL
from runtime_bridge.mcp_shim import FORWARDED, HOST_HUB_URL

HEADER_LIMIT = 64 * 1024
# The shim sends its line at once; a connection that does not is holding a child.
HEADER_SECONDS = 10.0
READY = "ready"
# An Agent's CLI starts one amux server; a few more allow for restarts and subagents.
CONNECTIONS_PER_LAUNCH = 8
# Not in Python's socket module before 3.14; Linux 6.5 and later.
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)

logger = logging.getLogger("amux.mcp_host")


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


def _peer_pid(conn: socket.socket) -> tuple[int, int | None]:
    """The pid at the other end of ``conn`` and a pidfd of that very process (None on a kernel
    without ``SO_PEERPIDFD``, where the pid is the one it had at ``connect``)."""
    credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid = struct.unpack("3i", credentials)[0]
    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        return pid, None
    try:
        with open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as info:
            for line in info:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
    except (OSError, ValueError):
        os.close(pidfd)
        raise
    return pid, pidfd


def _peer_launch(conn: socket.socket) -> tuple[Hashable, tuple[Path, ...]]:
    """Which launch ``conn`` comes from (a key to count its connections by) and the procs
    files of its group to join (none where it is in no launch group).

    Raises:
        OSError: the other end is gone (or, without pidfds, cannot be told apart).
    """
    pid, pidfd = _peer_pid(conn)
    try:
        if pid <= 0:
            raise OSError("the other end is outside this pid namespace")
        procs = launch_group_of(pid) or ()
        key: Hashable = procs or ("pidns", os.stat(f"/proc/{pid}/ns/pid").st_ino)
        # Read while the process was alive: its pid then named it, not a later process.
        if pidfd is not None and select.select([pidfd], [], [], 0)[0]:
            raise OSError("the other end exited")
        return key, procs
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _join(procs: tuple[Path, ...]) -> None:
    """Move this process into the launch's group (as root, before it becomes the peer)."""
    for path in procs:
        with open(path, "w", encoding="ascii") as file:
            file.write(str(os.getpid()))


def _child(
    conn: socket.socket,
    built: tuple[MCPServer, mcp_server.BridgeSlot],
    procs: tuple[Path, ...] = (),
) -> None:
    """Serve one launch on ``conn`` with the server built before the fork; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # The host's own leave-taking is not a launch's server's.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        _join(procs)
        _become_peer(conn)
        conn.settimeout(HEADER_SECONDS)
        header = _read_header(conn)
        # Back to blocking: stdin and stdout share this socket's file status flags.
        conn.setblocking(True)
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


class Children:
    """The host's children by launch, reaped as they end."""

    def __init__(self, limit: int = CONNECTIONS_PER_LAUNCH) -> None:
        self.limit = limit
        self._launch: dict[int, Hashable] = {}
        self._count: dict[Hashable, int] = {}
        self._logged: set[Hashable] = set()

    def full(self, key: Hashable) -> bool:
        return self._count.get(key, 0) >= self.limit

    def add(self, pid: int, key: Hashable) -> None:
        self._launch[pid] = key
        self._count[key] = self._count.get(key, 0) + 1

    def refused(self, key: Hashable) -> None:
        if key in self._logged:
            return
        if len(self._logged) > 4096:
            self._logged.clear()
        self._logged.add(key)
        logger.warning(
            "an Agent opened more than %d connections to the warm MCP host at once; the rest "
            "are closed (logged once per launch)",
            self.limit,
        )

    def reap(self, signum: int = 0, frame: FrameType | None = None) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            key = self._launch.pop(pid, None)
            if key is not None:
                self._count[key] -= 1
                if not self._count[key]:
                    del self._count[key]


def _leave_then_die(socket_path: Path) -> Callable[[int, FrameType | None], None]:
    """A SIGTERM handler that removes the host's socket and its private directory first.

    The worker removes both when it stops the host; a worker killed outright cannot, and its
    host then ends on the death signal alone, which would leave them behind in the temporary
    directory.
    """

    host = os.getpid()

    def leave(signum: int, frame: FrameType | None) -> None:
        # A server just forked, before it set its own handler, is not the host.
        if os.getpid() == host:
            with contextlib.suppress(OSError):
                socket_path.unlink()
            with contextlib.suppress(OSError):
                socket_path.parent.rmdir()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    return leave


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
    children = Children()
    signal.signal(signal.SIGCHLD, children.reap)
    signal.signal(signal.SIGTERM, _leave_then_die(Path(socket_path)))
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
        try:
            key, procs = _peer_launch(conn)
        except OSError:
            conn.close()
            continue
        # Until the child is counted, its end must not be reaped uncounted.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            if children.full(key):
                children.refused(key)
            else:
                with contextlib.suppress(OSError):
                    pid = os.fork()
                    if pid == 0:
                        listener.close()
                        _child(conn, built, procs)
                    children.add(pid, key)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
