"""A small typed JSON-RPC client for ``codex app-server`` over a subprocess's stdio.

The app-server speaks newline-delimited JSON-RPC 2.0 without the ``"jsonrpc"`` member. Messages
carrying ``id`` and ``method`` are requests from the server (approvals, elicitations): each goes
to the installed request handler in a task of its own, so that reading goes on while a person
takes minutes to answer; a request the handler does not take (or any, without a handler) is
declined with "method not found". Responses resolve the pending call with the same id;
everything else is a notification, shown to the observer as it is read and queued for
``notifications()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hub.errors import Unavailable

logger = logging.getLogger("amux.codex")

METHOD_NOT_FOUND = -32601
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603


class RpcError(Exception):
    """The app-server answered a call with a JSON-RPC error."""

    def __init__(self, method: str, code: int, message: str) -> None:
        super().__init__(f"{method}: {message} (code {code})")
        self.method = method
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Notification:
    method: str
    params: dict[str, Any]


class Unhandled(Exception):
    """Raised by a request handler for a request it does not answer: it is declined."""


# Answers one server request (method, params) with its result; raises ``Unhandled`` to decline.
RequestHandler = Callable[[str, dict[str, Any]], Awaitable[Any]]
# Sees each notification as it is read, before any request that follows it is handled.
Observer = Callable[[Notification], None]


class Writer(Protocol):
    """The app-server's stdin: a local pipe, or a command's input streamed to a pod."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class CodexRpc:
    """JSON-RPC over the stdio pipes of one running ``codex app-server``."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: Writer,
        *,
        call_timeout: float = 60.0,
        on_request: RequestHandler | None = None,
        observe: Observer | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._call_timeout = call_timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self._queue: asyncio.Queue[Notification | None] = asyncio.Queue()
        self._closed: Exception | None = None
        self._on_request = on_request
        self._observe = observe
        self._handlers: set[asyncio.Task[None]] = set()
        self._task = asyncio.create_task(self._read())

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send a request and wait for its result.

        Raises:
            RpcError: the server answered with an error.
            Unavailable: the server went away or did not answer in time.
        """
        if self._closed is not None:
            raise Unavailable(f"codex app-server is gone: {self._closed}")
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (method, future)
        try:
            await self._send({"id": request_id, "method": method, "params": params or {}})
            async with asyncio.timeout(self._call_timeout):
                return await future
        except TimeoutError:
            raise Unavailable(f"codex app-server did not answer {method} in time") from None
        finally:
            self._pending.pop(request_id, None)

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        """Send a notification (no answer expected)."""
        message: dict[str, Any] = {"method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    async def notifications(self) -> AsyncIterator[Notification]:
        """Server notifications in arrival order, until the server closes its output."""
        while (item := await self._queue.get()) is not None:
            yield item
        self._queue.put_nowait(None)

    async def close(self) -> None:
        """Stop reading and answering; pending calls fail."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            self._writer.write((json.dumps(message) + "\n").encode())
            await self._writer.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise Unavailable("codex app-server closed its input") from exc

    async def _read(self) -> None:
        reason: Exception = Unavailable("codex app-server exited")
        try:
            while line := await self._reader.readline():
                try:
                    message = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(message, dict):
                    await self._dispatch(message)
        except asyncio.CancelledError:
            reason = Unavailable("codex app-server connection closed")
            raise
        finally:
            self._closed = reason
            for _, future in self._pending.values():
                if not future.done():
                    future.set_exception(reason)
            self._queue.put_nowait(None)

    async def _dispatch(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if "id" in message and method is not None:
            params = message.get("params")
            task = asyncio.create_task(
                self._answer(message["id"], str(method), params if isinstance(params, dict) else {})
            )
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        elif "id" in message:
            pending = self._pending.get(message["id"])
            if pending is None or pending[1].done():
                return
            method_name, future = pending
            error = message.get("error")
            if isinstance(error, dict):
                future.set_exception(
                    RpcError(
                        method_name,
                        int(error.get("code", 0)),
                        str(error.get("message", "")),
                    )
                )
            else:
                future.set_result(message.get("result"))
        elif method is not None:
            params = message.get("params")
            note = Notification(str(method), params if isinstance(params, dict) else {})
            if self._observe is not None:
                self._observe(note)
            self._queue.put_nowait(note)

    async def _answer(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        if self._on_request is None:
            await self._decline(request_id, method)
            return
        try:
            result = await self._on_request(method, params)
        except Unhandled:
            await self._decline(request_id, method)
            return
        except Exception:
            # Never left hanging: the app-server would wait on this request for ever.
            logger.exception("answering codex's %s failed", method)
            await self._reply(
                {
                    "id": request_id,
                    "error": {"code": INTERNAL_ERROR, "message": f"amux failed to answer {method}"},
                }
            )
            return
        await self._reply({"id": request_id, "result": result})

    async def _reply(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(Unavailable):
            await self._send(message)

    async def _decline(self, request_id: Any, method: str) -> None:
        await self._reply(
            {
                "id": request_id,
                "error": {
                    "code": METHOD_NOT_FOUND,
                    "message": f"amux does not answer {method} in a managed launch",
                },
            }
        )
