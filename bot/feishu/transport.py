"""One pooled HTTP session for every call the bot makes to Feishu.

lark-oapi sends each call on a connection of its own (a module-level ``requests.request`` in its
sync transport, a new ``httpx.AsyncClient`` per call in its async one, the same for its tenant
token fetches), and its ``Config`` has no place for a session: against the real Feishu every card
update paid a TCP and a TLS handshake. amux therefore sends its calls itself, through one
``httpx.AsyncClient`` per process that keeps connections alive and never opens more than
``connections`` at once: the API calls, downloads, uploads and tenant tokens of
:class:`~bot.feishu.client.FeishuClient`, the linked-document reads and the account device flow.
A call that finds every connection busy waits for one, as it waited for a worker thread before.

Its connections are aiohttp's (:class:`AiohttpTransport`) under httpx's client: httpcore's pool
spent about 4.8 ms of the event loop's CPU per call in a burst of 50 (it walks every waiting
request and asks every connection whether it expired, through anyio, for each one it assigns),
aiohttp's about 0.4 ms. httpx keeps what it did above the connections: its API, redirects,
cookies, decoding and its error types, and a proxy from the environment, whose calls go on
httpx's own proxy transport as before.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.parse
import weakref
from collections.abc import AsyncIterator, Sequence

import aiohttp
import httpx
from httpx._utils import get_environment_proxies
from multidict import CIMultiDict
from yarl import URL

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
    transport = AiohttpTransport(connections=connections, verify=verify)
    limits = httpx.Limits(
        max_connections=connections,
        max_keepalive_connections=connections,
        keepalive_expiry=KEEPALIVE_SECONDS,
    )
    # httpx reads no proxy from the environment once it is given a transport: the proxies it
    # would have read (HTTPS_PROXY and the rest, NO_PROXY's hosts going direct) are mounted
    # here as it mounts them, each on httpx's own transport.
    mounts: dict[str, httpx.AsyncBaseTransport | None] = {
        pattern: None
        if proxy is None
        else httpx.AsyncHTTPTransport(verify=verify, limits=limits, proxy=proxy)
        for pattern, proxy in get_environment_proxies().items()
    }
    client = httpx.AsyncClient(
        timeout=call_timeout(timeout),
        verify=verify,
        transport=transport,
        mounts=mounts,
        # As requests and aiohttp did; a redirect to another host drops the Authorization header.
        follow_redirects=True,
    )
    _TRANSPORTS[client] = transport
    return client


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx's calls sent on one aiohttp pool of at most ``connections`` kept-alive connections.

    The pool is made on the first call, on that call's event loop (aiohttp binds it there).
    httpx has built each request whole (headers, body, the final URL) and follows redirects
    itself, so aiohttp only carries bytes: it adds no header, follows nothing, keeps no cookie
    and decodes nothing.
    """

    def __init__(self, *, connections: int, verify: ssl.SSLContext | bool = True) -> None:
        self._connections = connections
        # The same authorities httpx trusts: certifi, or SSL_CERT_FILE / SSL_CERT_DIR.
        self._ssl = httpx.create_ssl_context(verify=verify)
        self._session: aiohttp.ClientSession | None = None
        # Per origin, whether the client sends its calls here (no proxy mount took it).
        self.routes: dict[str, bool] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def _pool(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise RuntimeError("the Feishu session is closed")
        if self._session is None or self._loop is not loop or self._session.closed:
            self._loop = loop
            connector = aiohttp.TCPConnector(
                limit=self._connections,
                limit_per_host=0,
                keepalive_timeout=KEEPALIVE_SECONDS,
                ssl=self._ssl,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(
            total=None,
            # Waiting for a free connection is unbounded, as httpx's pool=None left it.
            connect=None,
            sock_connect=timeouts.get("connect"),
            sock_read=timeouts.get("read"),
        )
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in request.headers.raw
            # The body goes whole, its length known: aiohttp frames it.
            if name.lower() != b"transfer-encoding"
        ]
        body = await request.aread()
        try:
            response = await self._pool().request(
                request.method,
                URL(str(request.url), encoded=True),
                headers=CIMultiDict(headers),
                data=body or None,
                allow_redirects=False,
                skip_auto_headers=("Content-Type", "User-Agent", "Accept-Encoding", "Accept"),
                timeout=timeout,
            )
        except (TimeoutError, aiohttp.ClientError) as error:
            raise _translated(error, request) from error
        return httpx.Response(
            response.status,
            headers=response.raw_headers,
            stream=_Body(response, request),
            request=request,
        )

    async def exchange(
        self,
        method: str,
        url: str,
        queries: Sequence[tuple[str, str | int | float | bool | None]],
        headers: dict[str, str],
        body: bytes | None,
        bounds: httpx.Timeout,
    ) -> tuple[int, dict[str, str], bytes]:
        """One call answered whole, straight on the pool: status, headers (names lower-cased,
        repeated ones joined as httpx joins them) and the decoded body.

        What httpx's client did above the connections costs the event loop about as much as
        the pool itself, for a JSON call that needs none of it: the query is encoded as httpx
        encodes it, redirects are followed (dropping the Authorization header on the way to
        another host) and the body is decoded, by aiohttp.

        Raises:
            httpx.TransportError: as from httpx's client.
        """
        if queries:
            url += "?" + urllib.parse.urlencode([(k, _primitive(v)) for k, v in queries])
        try:
            async with self._pool().request(
                method,
                URL(url, encoded=True),
                headers=headers,
                data=body,
                allow_redirects=True,
                max_redirects=MAX_REDIRECTS,
                auto_decompress=True,
                skip_auto_headers=("Content-Type",),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=None,
                    sock_connect=bounds.connect,
                    sock_read=bounds.read,
                ),
            ) as response:
                content = await response.read()
        except (TimeoutError, aiohttp.ClientError) as error:
            raise _translated(error, httpx.Request(method, url)) from error
        answered: dict[str, str] = {}
        for name, value in response.headers.items():
            name = name.lower()
            answered[name] = f"{answered[name]}, {value}" if name in answered else value
        return response.status, answered, content

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()


# httpx's own bound on redirects in a row.
MAX_REDIRECTS = 20
# The pooled sessions' own transports, for :func:`direct_transport`.
_TRANSPORTS: weakref.WeakKeyDictionary[httpx.AsyncClient, AiohttpTransport] = (
    weakref.WeakKeyDictionary()
)


def direct_transport(http: httpx.AsyncClient, url: str) -> AiohttpTransport | None:
    """``http``'s aiohttp pool when it is a pooled session and ``url`` goes out on that pool
    (no proxy from the environment takes it): a call may then skip httpx's client."""
    transport = _TRANSPORTS.get(http)
    if transport is None:
        return None
    origin = url.split("/", 3)[:3]
    key = "/".join(origin)
    routed = transport.routes.get(key)
    if routed is None:
        choose = getattr(http, "_transport_for_url", None)
        # An httpx without it: every call goes through the client, as before.
        routed = callable(choose) and choose(httpx.URL(key)) is transport
        transport.routes[key] = routed
    return transport if routed else None


def _primitive(value: str | int | float | bool | None) -> str:
    """A query value as httpx writes it."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return ""
    return str(value)


class _Body(httpx.AsyncByteStream):
    """An answer's body as it arrives; closing it early drops its connection, as httpx's did."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._response.content.iter_any():
                yield piece
        except (TimeoutError, aiohttp.ClientError) as error:
            raise _translated(error, self._request) from error

    async def aclose(self) -> None:
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


def _translated(error: Exception, request: httpx.Request) -> httpx.TransportError:
    """aiohttp's error as the httpx one callers catch."""
    if isinstance(error, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(str(error) or "connect timeout", request=request)
    if isinstance(error, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(error), request=request)
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError(str(error), request=request)
    if isinstance(error, aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(str(error), request=request)
    if isinstance(error, TimeoutError):  # aiohttp's SocketTimeoutError is one.
        return httpx.ReadTimeout(str(error) or "read timeout", request=request)
    return httpx.NetworkError(str(error), request=request)
