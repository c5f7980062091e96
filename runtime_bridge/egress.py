"""The egress door's proxy: what an Agent in its own network namespace may reach beyond amux.

It speaks ``CONNECT host:port`` (HTTPS and anything tunnelled) and absolute-form requests
(``GET http://host/path``). A host on ``AMUX_RUNTIME_EGRESS_ALLOW`` is connected to; any other is
answered ``403`` with a one-line body naming that setting, and reported (``refused``) as an
``egress`` event of the turn. Under the ``ask`` policy a refused host is first asked of the
conversation's person as an approval: allowed, the connection proceeds and the host stays
allowed for the rest of the launch (an "allow for this conversation" answer is a rule the Hub
applies to the conversation's later asks); denied or unanswered, ``403``.

The name is resolved here and the connection made to the very address that was checked, so a
name cannot turn into another address between the check and the connection; loopback,
link-local (cloud metadata) and other local addresses are refused unless an entry names that
host itself, or a person allowed that very address (a name they allowed may resolve to a local
address they never saw, and stays refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable

from hub.errors import InvalidArgument
from runtime_bridge.approvals import TOOL, ApprovalRequest, Approver
from runtime_bridge.network import EGRESS_SETTING, AllowList, local_address, split_host_port

logger = logging.getLogger("amux.egress")

HEAD_LIMIT = 64 * 1024
# A request's head arrives at once from any client; one that trickles in is holding a door.
HEAD_SECONDS = 5.0
CONNECT_SECONDS = 15.0
CHUNK = 65536
# The tool an egress approval is asked under, so "allow for this conversation" rules of network
# hosts never match a command or an edit.
NETWORK_TOOL = "network"
# Request headers meant for the proxy, never passed on.
HOP_HEADERS = frozenset({b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive"})

Report = Callable[[str, int, str], Awaitable[None]]


class Refused(Exception):
    """A target the proxy does not connect to; ``reason`` is what the Agent is told."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def refusal_text(target: str) -> str:
    return f"amux refused {target}: it is not on {EGRESS_SETTING}; ask the operator to add it"


def local_refusal_text(target: str) -> str:
    return (
        f"amux refused {target}: it is a local address, reached only when "
        f"{EGRESS_SETTING} names it exactly"
    )


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until its end, then half-close ``writer``."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """Both directions until both ends are done."""
    await asyncio.gather(pipe(a[0], b[1]), pipe(b[0], a[1]))


async def answer(writer: asyncio.StreamWriter, status: int, body: str) -> None:
    """A short plain-text answer, after which the connection closes."""
    phrases = {
        400: "Bad Request",
        403: "Forbidden",
        404: "Not Found",
        411: "Length Required",
        431: "Too Large",
        502: "Bad Gateway",
    }
    data = (body + "\n").encode("utf-8")
    writer.write(
        f"HTTP/1.1 {status} {phrases.get(status, 'Error')}\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n".encode("latin-1")
        + data
    )
    with contextlib.suppress(ConnectionError):
        await writer.drain()


class Egress:
    """One launch's egress proxy."""

    def __init__(
        self,
        allow: AllowList,
        report: Report,
        approver: Approver | None = None,
    ) -> None:
        self._allow = allow
        self._report = report
        self._approver = approver
        # Hosts allowed for this launch by a person's answer.
        self._approved: set[tuple[str, int]] = set()
        self._asking: dict[tuple[str, int], asyncio.Lock] = {}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection. Raises TimeoutError when its head is not complete within
        ``HEAD_SECONDS`` (the connection is closed; the door logs it)."""
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
        if len(head) > HEAD_LIMIT:
            await answer(writer, 431, "request head too large")
            return
        request_line, *header_lines = head[:-4].split(b"\r\n")
        words = request_line.split(b" ")
        if len(words) != 3:
            await answer(writer, 400, "not an HTTP proxy request")
            return
        method, target, version = (w.decode("latin-1") for w in words)
        if method == "CONNECT":
            try:
                host, port = split_host_port(target)
            except InvalidArgument:
                port = None
            if port is None:
                await answer(writer, 400, "CONNECT needs host:port")
                return
            path = ""
        elif target.startswith("http://"):
            authority, slash, rest = target[len("http://") :].partition("/")
            path = slash + rest or "/"
            try:
                host, named_port = split_host_port(authority.rpartition("@")[2])
            except InvalidArgument:
                await answer(writer, 400, "not an absolute http:// URL")
                return
            port = named_port or 80
        else:
            await answer(writer, 400, "a proxy request is CONNECT host:port or http://…")
            return
        try:
            address = await self._permitted(host, port)
            upstream = await asyncio.wait_for(
                asyncio.open_connection(address, port), CONNECT_SECONDS
            )
        except Refused as refused:
            await answer(writer, 403, refused.reason)
            return
        except (OSError, TimeoutError) as error:
            await answer(writer, 502, f"amux could not reach {host}:{port} ({error})")
            return
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                kept = [
                    line
                    for line in header_lines
                    if line.split(b":", 1)[0].strip().lower() not in HOP_HEADERS
                ]
                # One request per connection: the next may be for another host.
                request = [f"{method} {path} {version}".encode("latin-1"), *kept]
                request.append(b"Connection: close")
                upstream[1].write(b"\r\n".join(request) + b"\r\n\r\n")
                await upstream[1].drain()
            await splice((reader, writer), upstream)
        finally:
            upstream[1].close()
            with contextlib.suppress(ConnectionError, OSError):
                await upstream[1].wait_closed()

    async def _permitted(self, host: str, port: int) -> str:
        """The address to connect to for ``host:port``, once allowed.

        Raises:
            Refused: not allowed (reported as an egress event), or a local address not named.
            OSError: the name does not resolve.
        """
        target = f"{host}:{port}"
        if not (self._allow.allows(host, port) or (host, port) in self._approved):
            await self._ask_or_refuse(host, port)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [str(info[4][0]) for info in infos]
        # A person who allowed a local address saw that address; a name they allowed may
        # resolve to one they never saw.
        seen = (host, port) in self._approved and local_address(host)
        named = seen or self._allow.names_explicitly(host, port)
        if any(local_address(a) for a in addresses) and not named:
            reason = local_refusal_text(target)
            await self._report(host, port, reason)
            raise Refused(reason)
        return addresses[0]

    async def _ask_or_refuse(self, host: str, port: int) -> None:
        target = f"{host}:{port}"
        if self._approver is None:
            reason = refusal_text(target)
            await self._report(host, port, reason)
            raise Refused(reason)
        lock = self._asking.setdefault((host, port), asyncio.Lock())
        async with lock:
            if (host, port) in self._approved:
                return
            answer = await self._approver(
                ApprovalRequest(
                    tool=NETWORK_TOOL,
                    action=TOOL,
                    subject=target,
                    detail=f"allow {target} for this conversation? ({EGRESS_SETTING} does not "
                    "name it)",
                )
            )
            if answer.allowed:
                self._approved.add((host, port))
                return
        reason = f"{refusal_text(target)} ({answer.message or 'denied'})"
        await self._report(host, port, reason)
        raise Refused(reason)
