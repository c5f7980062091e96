"""Permission requests of a running Agent, and the socket its in-sandbox helpers ask through.

A launch runs under one of three policies (``agents.permissions``):

- ``ask``: what the provider's own permission system would ask a person (file edits, changing
  shell commands) is asked in the conversation; reads, searches and memory tools run freely;
- ``auto``: everything inside the sandbox runs without asking;
- ``read-only``: the workspace is mounted read-only, so every edit fails.

Codex's requests arrive in the worker over its app-server connection. Claude's permission-prompt
tool and Pi's extension run inside the sandbox, so they ask over a Unix socket in the launch's
run directory, owned by the Agent's user and mode 0600: another user's Agent can neither see nor
connect to it. The wire is one JSON line each way per connection::

    → {"tool": "Write", "input": {...}}
    ← {"allow": true, "message": "..."}

Each provider turns its raw request into an ``ApprovalRequest`` a person can judge (or finds it
needs nobody); an ``Approver`` (the Hub, in a worker) answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hub.contract import MAX_DETAIL_CHARS, MAX_SUBJECT_CHARS, too_long
from runtime_bridge import permission_shim

logger = logging.getLogger("amux.approvals")

ASK = "ask"
AUTO = "auto"
READ_ONLY = "read-only"
POLICIES = (ASK, AUTO, READ_ONLY)

# What a request is about: a shell command, a change to files, or another tool.
COMMAND = "command"
EDIT = "edit"
TOOL = "tool"

SOCKET_NAME = "approvals.sock"
SOCKET_ENV = "AMUX_APPROVAL_SOCKET"
MAX_REQUEST_BYTES = 1 << 20
# The socket is the Agent's to flood: its connections at once, each buffering up to a request,
# and how long one may take to send its request line, are bounded so the worker (whose memory and
# tasks are not the launch's) holds at most this much for it. A helper asks one at a time.
APPROVAL_CONNECTIONS = 16
REQUEST_SECONDS = 30.0
# Bounds on what a request carries to a person: a command or path list, and a diff or a tool's
# input, each whole up to the Hub's bound (a longer one is denied without asking, never cut).
SUBJECT_CHARS = MAX_SUBJECT_CHARS
DETAIL_CHARS = MAX_DETAIL_CHARS


@dataclass(frozen=True)
class ApprovalRequest:
    """One permission request, as a person sees it."""

    # The provider's own name for the tool ("Write", "Bash", "commandExecution"…).
    tool: str
    action: str
    # The exact command line, or the path(s) an edit changes.
    subject: str
    # The diff or new content of an edit, or the tool's input, whole.
    detail: str = ""

    def bounded(self) -> ApprovalRequest:
        """The request with its tool's name bounded; its subject and detail stay whole (see
        ``refusal``)."""
        return ApprovalRequest(
            tool=self.tool[:128], action=self.action, subject=self.subject, detail=self.detail
        )

    def refusal(self) -> ApprovalAnswer | None:
        """The denial of a request too long to show a person whole; None for any other."""
        for part, bound in ((self.subject, SUBJECT_CHARS), (self.detail, DETAIL_CHARS)):
            if len(part) > bound:
                return ApprovalAnswer(False, too_long(len(part), self.action))
        return None


@dataclass(frozen=True)
class ApprovalAnswer:
    """The decision, and what the Agent is told with it (the reason of a denial)."""

    allowed: bool
    message: str = ""


class Approver(Protocol):
    async def __call__(self, request: ApprovalRequest) -> ApprovalAnswer: ...


# A provider's reading of one raw request: what to ask a person, or None when the request needs
# nobody (a read-only command, an amux memory call), so it runs at once.
Describe = Callable[[str, Mapping[str, Any]], "ApprovalRequest | None"]


def deny_all(reason: str) -> Approver:
    """An approver that refuses every request with ``reason`` (nobody can be asked)."""

    async def deny(request: ApprovalRequest) -> ApprovalAnswer:
        return ApprovalAnswer(False, reason)

    return deny


# A socket's address holds at most 108 bytes; a deep run directory is reached through a
# descriptor of its own instead (/proc/self/fd/N/name is short whatever the directory's path).
MAX_ADDRESS_BYTES = 100


@contextlib.contextmanager
def _short_path(path: Path) -> Iterator[str]:
    if len(os.fsencode(path)) <= MAX_ADDRESS_BYTES:
        yield str(path)
        return
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)


def owner_only_socket(path: Path) -> socket.socket:
    """A Unix socket bound at ``path`` (any stale socket there replaced), owner-only from the
    first instant.

    The mode is set on the socket before it is bound, which Linux applies to the file it
    creates. The process's umask is never touched: it is shared by every thread and task of
    the worker, and a directory or memory file made while it was narrowed would keep the
    narrowed mode (directories without their search bit).
    """
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.fchmod(bound.fileno(), 0o600)
        with _short_path(path) as address:
            bound.bind(address)
    except BaseException:
        bound.close()
        raise
    return bound


class ApprovalSocket:
    """Serves one launch's permission requests on a Unix socket until closed."""

    def __init__(
        self,
        path: Path,
        approver: Approver,
        describe: Describe,
        mask: Callable[[str], str] = lambda text: text,
        owner: tuple[int, int] | None = None,
        *,
        connections: int = APPROVAL_CONNECTIONS,
        request_seconds: float = REQUEST_SECONDS,
    ) -> None:
        self.path = path
        self._approver = approver
        self._describe = describe
        self._mask = mask
        self._owner = owner
        self._connections = connections
        self._request_seconds = request_seconds
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._refusals_logged = False

    async def __aenter__(self) -> ApprovalSocket:
        self._server = await asyncio.start_unix_server(
            self._serve, sock=owner_only_socket(self.path), limit=MAX_REQUEST_BYTES
        )
        if self._owner is not None:
            os.chown(self.path, *self._owner, follow_symlinks=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._handlers) >= self._connections:
            # Closed before anything is read: the asking helper takes it as a denial.
            writer.transport.abort()
            if not self._refusals_logged:
                self._refusals_logged = True
                logger.warning(
                    "refused permission requests past %d at once (logged once per launch)",
                    self._connections,
                )
            return
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            answer = await self._answer(reader)
            writer.write(
                (json.dumps({"allow": answer.allowed, "message": answer.message}) + "\n").encode()
            )
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> ApprovalAnswer:
        try:
            async with asyncio.timeout(self._request_seconds):
                line = await reader.readline()
            message = json.loads(line)
        except (ValueError, asyncio.LimitOverrunError, ConnectionError, TimeoutError):
            return ApprovalAnswer(False, "amux could not read this permission request")
        if not isinstance(message, dict) or not isinstance(message.get("tool"), str):
            return ApprovalAnswer(False, "amux could not read this permission request")
        raw_input = message.get("input")
        tool_input: Mapping[str, Any] = raw_input if isinstance(raw_input, dict) else {}
        request = self._describe(message["tool"], tool_input)
        if request is None:
            return ApprovalAnswer(True)
        # Judged before masking, whose cost grows faster than the text.
        refused = request.refusal()
        if refused is not None:
            logger.warning("denied a permission request without asking: too long to show")
            return refused
        masked = ApprovalRequest(
            request.tool, request.action, self._mask(request.subject), self._mask(request.detail)
        ).bounded()
        return await self._approver(masked)


async def ask_over_socket(path: str, tool: str, tool_input: Mapping[str, Any]) -> ApprovalAnswer:
    """The in-sandbox side, as Claude's permission prompt asks (``runtime_bridge.permission_shim``):
    ask the worker through ``path`` and wait for the decision; anything short of a clear answer
    is a denial."""
    allowed, message = await asyncio.to_thread(permission_shim.ask, path, tool, dict(tool_input))
    return ApprovalAnswer(allowed, message)
