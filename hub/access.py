"""One access line per request to the Hub, whichever way it came: over HTTP (aiohttp writes it
after the handler, through ``bot.service.logs.AccessLogger``) or through the in-process transport
(``hub.local_transport``). Operators read both the same way: the same logger, message and fields,
so a call is traced by its request id whether or not it crossed a socket.
"""

from __future__ import annotations

import logging

from hub.rpc import RPC_PATH

# aiohttp's own access logger, so filtering or silencing access lines covers in-process calls too.
ACCESS_LOGGER = logging.getLogger("aiohttp.access")

# Workers and watchers hold these open for up to 20 s and ask again at once, so an idle worker
# alone would write a line every 20 s; their successes are logged only at DEBUG.
LONG_POLLS = frozenset(
    RPC_PATH.format(method=method) for method in ("executions.claim", "executions.watch")
)


def log_access(
    logger: logging.Logger,
    method: str,
    path: str,
    status: int,
    request_id: str | None,
    seconds: float,
    **fields: str,
) -> None:
    quiet = path in LONG_POLLS and status < 400
    # Only the path: query strings are the caller's to fill and are not needed here.
    logger.log(
        logging.DEBUG if quiet else logging.INFO,
        "%s %s %s",
        method,
        path,
        status,
        extra={
            "request_id": request_id,
            "method": method,
            "path": path,
            "status": status,
            "duration_ms": round(seconds * 1000, 2),
            **fields,
        },
    )
