"""One pooled HTTP session for every call the bot makes to Feishu.

lark-oapi sends each call on a connection of its own (a module-level ``requests.request`` in its
sync transport, a new ``httpx.AsyncClient`` per call in its async one, the same for its tenant
token fetches), and its ``Config`` has no place for a session: against the real Feishu every card
update paid a TCP and a TLS handshake. amux therefore sends its calls itself, through one
``httpx.AsyncClient`` per process that keeps connections alive and never opens more than
``connections`` at once: the API calls, downloads, uploads and tenant tokens of
:class:`~bot.feishu.client.FeishuClient`, the linked-document reads and the account device flow.
A call that finds every connection busy waits for one, as it waited for a worker thread before.
"""

from __future__ import annotations

import ssl

import httpx

# Calls in flight at once; more wait for a free connection. Pacing holds the bot to 50 calls a
# second per API, which a few kept-alive connections carry.
DEFAULT_CONNECTIONS = 8
# An idle connection is kept this long; Feishu's gateway keeps one open for about a minute.
KEEPALIVE_SECONDS = 30.0
# What a call that sets no timeout of its own gets (the device flow): lark-oapi's default.
DEFAULT_TIMEOUT_SECONDS = 30.0


def call_timeout(seconds: float) -> httpx.Timeout:
    """``seconds`` to connect and between bytes read, as ``requests`` applied it: no bound on
    writing, and none on waiting for a free connection (calls in flight each have theirs)."""
    return httpx.Timeout(connect=seconds, read=seconds, write=None, pool=None)


def pooled_session(
    *,
    connections: int = DEFAULT_CONNECTIONS,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    verify: ssl.SSLContext | bool = True,
) -> httpx.AsyncClient:
    """The session to share; ``verify`` trusts another authority (a test's own, say).

    Raises:
        ValueError: ``connections`` is below 1.
    """
    if connections < 1:
        raise ValueError("a Feishu session needs at least one connection")
    return httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=connections,
            max_keepalive_connections=connections,
            keepalive_expiry=KEEPALIVE_SECONDS,
        ),
        timeout=call_timeout(timeout),
        verify=verify,
        # As requests and aiohttp did; a redirect to another host drops the Authorization header.
        follow_redirects=True,
    )
