"""The id that follows one piece of work across processes: Feishu ingress → Hub → worker → back.

It lives in a context variable, so every log line and Hub call made while handling that work carries
it without being passed by hand; HTTP hops send it as ``X-Request-Id``.
"""

from __future__ import annotations

from contextvars import ContextVar

REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID: ContextVar[str | None] = ContextVar("amux_request_id", default=None)
