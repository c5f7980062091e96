"""The model gateway: the only way an Agent's model requests leave the worker.

One aiohttp server per worker, on a random loopback port. Each launch is given fresh random
placeholder credentials, one per route (``anthropic``, ``openai``, ``pi:<provider>``), live from
``open`` until the grant is closed; its environment holds those and the gateway's URL, never a
real key. A request presenting a live placeholder (``x-api-key`` or ``Authorization: Bearer``)
is forwarded to that route's upstream with the operator's real credential in its place; anything
else is refused in the provider's own error shape, so the CLI reports it plainly.

Real credentials come from the worker's environment, read once when the worker starts
(``ANTHROPIC_API_KEY``, else ``ANTHROPIC_AUTH_TOKEN``, else ``CLAUDE_CODE_OAUTH_TOKEN``;
``OPENAI_API_KEY``), or from the operator's own CLI configuration (the Codex provider's
``env_key``, a Pi provider's ``apiKey``). They are never in a plan, a log line, an error or a
sandbox. With none configured (offline, tests) requests are forwarded without one.

Upstreams: ``AMUX_RUNTIME_ANTHROPIC_BASE_URL`` / ``AMUX_RUNTIME_OPENAI_BASE_URL``, else the
worker's ``ANTHROPIC_BASE_URL`` / ``OPENAI_BASE_URL``, else the providers' public APIs; a Codex
or Pi provider the operator configured with its own base URL keeps it.

Only the model endpoints are forwarded (``MODEL_ENDPOINTS``); responses stream back chunk by
chunk as they came. The usage each response reports is read on the way through, untouched, and
summed per launch (``Grant.usage``).

A launch may have a budget (``Grant.budget``, the tokens its turn may use): once the launch's
count has reached it, a model request is answered in the provider's own error shape, one its
CLI treats as final, and the grant records that the budget was reached.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from runtime_bridge.providers.plan import GatewayPass

logger = logging.getLogger("amux.gateway")

Api = Literal["anthropic", "openai"]
ANTHROPIC: Final = "anthropic"
OPENAI: Final = "openai"
Scheme = Literal["x-api-key", "bearer", "oauth"]

PUBLIC_BASE: dict[str, str] = {
    ANTHROPIC: "https://api.anthropic.com",
    OPENAI: "https://api.openai.com/v1",
}
# (method, path) the gateway forwards; the query string rides along (``?beta=true``).
MODEL_ENDPOINTS = frozenset(
    {
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
    }
)
# The endpoints whose answers are model turns, and so carry usage.
COUNTED = {"/v1/messages": ANTHROPIC, "/v1/responses": "responses", "/v1/chat/completions": "chat"}
PLACEHOLDER_PREFIX = "amux-placeholder-"
# Claude Code sends subscription tokens only with this beta; the Agent believes it holds a key.
OAUTH_BETA = "oauth-2025-04-20"
# Headers that belong to one connection, not to the request.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
CREDENTIAL_HEADERS = frozenset({"x-api-key", "authorization"})
# Share of a budget past which the launch's user is warned once.
WARN_SHARE = 0.8
# The provider SDKs (Anthropic's and OpenAI's, used by Claude Code and Pi) retry a 429 or a 5xx
# unless told not to; this header tells them.
NO_RETRY = {"x-should-retry": "false"}
# A JSON (not streamed) answer is read for usage only up to this size.
JSON_USAGE_LIMIT = 4 * 1024 * 1024
CONNECT_SECONDS = 30.0
# A model may think for minutes between two chunks of one answer.
READ_SECONDS = 900.0


@dataclass(frozen=True)
class Upstream:
    """Where one route's requests go, and the credential added there."""

    api: Api
    # The upstream URL standing for the gateway's ``/v1`` (``https://api.anthropic.com/v1``).
    base: str
    credential: str | None = field(default=None, repr=False)
    scheme: Scheme = "bearer"

    @property
    def shown(self) -> str:
        """The upstream's origin, for messages: no path, user or password."""
        parts = urlsplit(self.base)
        host = parts.hostname or "?"
        return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


def _v1(base: str, api: Api) -> str:
    """The URL standing for ``/v1``: Anthropic base URLs stop before it, OpenAI's include it."""
    base = base.rstrip("/")
    return f"{base}/v1" if api == ANTHROPIC else base


def operator_upstreams(
    env: Mapping[str, str], anthropic_base: str | None = None, openai_base: str | None = None
) -> dict[str, Upstream]:
    """The default ``anthropic`` and ``openai`` routes, from the worker's own environment."""
    anthropic_url = anthropic_base or env.get("ANTHROPIC_BASE_URL") or PUBLIC_BASE[ANTHROPIC]
    credential: str | None = None
    scheme: Scheme = "x-api-key"
    if env.get("ANTHROPIC_API_KEY"):
        credential = env["ANTHROPIC_API_KEY"]
    elif env.get("ANTHROPIC_AUTH_TOKEN"):
        credential, scheme = env["ANTHROPIC_AUTH_TOKEN"], "bearer"
    elif env.get("CLAUDE_CODE_OAUTH_TOKEN"):
        credential, scheme = env["CLAUDE_CODE_OAUTH_TOKEN"], "oauth"
    openai_url = openai_base or env.get("OPENAI_BASE_URL") or PUBLIC_BASE[OPENAI]
    return {
        ANTHROPIC: Upstream(ANTHROPIC, _v1(anthropic_url, ANTHROPIC), credential, scheme),
        OPENAI: Upstream(OPENAI, _v1(openai_url, OPENAI), env.get("OPENAI_API_KEY") or None),
    }


@dataclass(frozen=True)
class LaunchRoutes:
    """The routes of one launch, what the Agent's config needs besides, and which variables of
    the worker's environment hold the credentials those routes add."""

    upstreams: Mapping[str, Upstream]
    hidden: tuple[str, ...] = ()
    pi_providers: Mapping[str, Any] = field(default_factory=dict)


def codex_route(
    config: Path | None, defaults: Mapping[str, Upstream], env: Mapping[str, str]
) -> tuple[Upstream, tuple[str, ...]]:
    """The upstream of a Codex launch: the provider the operator's ``config.toml`` selects, when
    it is one of the operator's own with a base URL, else the default OpenAI route."""
    try:
        loaded = tomllib.loads(config.read_text(encoding="utf-8")) if config else {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        loaded = {}
    chosen = loaded.get("model_provider")
    providers = loaded.get("model_providers")
    entry = providers.get(chosen) if isinstance(providers, dict) and chosen else None
    if not isinstance(entry, dict) or not isinstance(entry.get("base_url"), str):
        return defaults[OPENAI], ()
    env_key = entry.get("env_key")
    key = env.get(env_key) if isinstance(env_key, str) else None
    hidden = (env_key,) if isinstance(env_key, str) else ()
    return Upstream(OPENAI, _v1(entry["base_url"], OPENAI), key or None), hidden


# Pi's APIs the gateway carries, and the shape each speaks.
PI_APIS: dict[str, Api] = {
    "anthropic-messages": ANTHROPIC,
    "openai-completions": OPENAI,
    "openai-responses": OPENAI,
}


def pi_routes(
    agent_dir: Path | None, defaults: Mapping[str, Upstream], env: Mapping[str, str]
) -> tuple[dict[str, Upstream], dict[str, Any], tuple[str, ...]]:
    """The routes of the operator's Pi providers (``models.json``), those providers with their
    keys left out, and the variables their keys were read from.

    A provider's ``apiKey`` names a variable of the worker's environment or is the key itself; a
    ``!command`` is not run by the worker, so such a provider is forwarded without a key.
    """
    try:
        text = (agent_dir / "models.json").read_text(encoding="utf-8") if agent_dir else "{}"
        loaded = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        loaded = {}
    found = loaded.get("providers") if isinstance(loaded, dict) else None
    routes: dict[str, Upstream] = {}
    providers: dict[str, Any] = {}
    hidden: list[str] = []
    for name, entry in (found if isinstance(found, dict) else {}).items():
        if not isinstance(entry, dict):
            continue
        api = PI_APIS.get(str(entry.get("api") or _pi_default_api(str(name))))
        if api is None:
            # Not carried: the provider keeps its own settings, key included (the plan warns).
            providers[str(name)] = dict(entry)
            continue
        providers[str(name)] = {k: v for k, v in entry.items() if k != "apiKey"}
        raw = entry.get("apiKey")
        base = entry.get("baseUrl")
        own_base = isinstance(base, str) and bool(base)
        default = defaults[api]
        key: str | None = None
        scheme: Scheme = "x-api-key" if api == ANTHROPIC else "bearer"
        if isinstance(raw, str) and raw:
            if raw.startswith("!"):
                key = None
            elif raw in env:
                key = env[raw] or None
                hidden.append(raw)
            else:
                key = raw
        elif not own_base:
            # A built-in provider at its usual upstream: the worker's own key for it.
            key, scheme = default.credential, default.scheme
        # Never the worker's key to a host of the provider's own choosing.
        routes[f"pi:{name}"] = Upstream(
            api, _v1(str(base), api) if own_base else default.base, key, scheme
        )
    return routes, providers, tuple(hidden)


def _pi_default_api(name: str) -> str:
    return {"anthropic": "anthropic-messages", "openai": "openai-responses"}.get(name, "")


def launch_routes(
    provider: str,
    defaults: Mapping[str, Upstream],
    env: Mapping[str, str],
    home_source: Path | None = None,
) -> LaunchRoutes:
    """The gateway routes a launch of ``provider`` is given (``home_source``: the operator's
    Codex ``config.toml`` or Pi agent directory)."""
    if provider == "codex":
        upstream, hidden = codex_route(home_source, defaults, env)
        return LaunchRoutes({OPENAI: upstream}, hidden)
    if provider == "pi":
        routes, providers, hidden = pi_routes(home_source, defaults, env)
        return LaunchRoutes({**defaults, **routes}, hidden, providers)
    return LaunchRoutes(dict(defaults))


@dataclass
class Usage:
    """Tokens the model reported for a launch's requests, as they passed the gateway."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    requests: int = 0

    def add(self, counted: Mapping[str, int]) -> None:
        self.requests += 1
        self.input_tokens += counted.get("input_tokens", 0)
        self.output_tokens += counted.get("output_tokens", 0)
        self.cache_read_input_tokens += counted.get("cache_read_input_tokens", 0)
        self.cache_creation_input_tokens += counted.get("cache_creation_input_tokens", 0)

    def to_dict(self) -> dict[str, int]:
        out = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "requests": self.requests,
        }
        for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class UsageReader:
    """Reads the usage of one answer from its bytes as they stream past, changing nothing."""

    def __init__(self, kind: str, streamed: bool) -> None:
        self.kind = kind
        self.streamed = streamed
        self._pending = b""
        self._body = bytearray()
        self._usage: dict[str, Any] = {}
        self.seen = False

    def feed(self, chunk: bytes) -> None:
        if not self.streamed:
            if len(self._body) + len(chunk) <= JSON_USAGE_LIMIT:
                self._body.extend(chunk)
            return
        data = self._pending + chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()
        for line in lines:
            # Most events carry no usage: only those lines are parsed.
            if line.startswith(b"data:") and b'"usage"' in line:
                self._event(line[5:])

    def _event(self, payload: bytes) -> None:
        try:
            event = json.loads(payload)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if self.kind == ANTHROPIC:
            if event.get("type") == "message_start":
                message = event.get("message")
                self._merge(message.get("usage") if isinstance(message, dict) else None)
            elif event.get("type") == "message_delta":
                self._merge(event.get("usage"))
        elif self.kind == "responses":
            response = event.get("response")
            if isinstance(response, dict) and isinstance(response.get("usage"), dict):
                self._usage = dict(response["usage"])
                self.seen = True
        elif isinstance(event.get("usage"), dict):
            self._usage = dict(event["usage"])
            self.seen = True

    def _merge(self, usage: Any) -> None:
        # message_delta's counts are cumulative for the message: they replace message_start's.
        if isinstance(usage, dict):
            self._usage.update({k: v for k, v in usage.items() if v is not None})
            self.seen = True

    def counted(self) -> dict[str, int] | None:
        """The answer's usage in the gateway's terms, or None when it reported none."""
        if not self.streamed:
            try:
                body = json.loads(bytes(self._body))
            except ValueError:
                return None
            usage = body.get("usage") if isinstance(body, dict) else None
            if not isinstance(usage, dict):
                return None
            self._usage, self.seen = usage, True
        elif self._pending.startswith(b"data:") and b'"usage"' in self._pending:
            self._event(self._pending[5:])
        if not self.seen:
            return None
        usage = self._usage
        if self.kind == "chat":
            return {
                "input_tokens": _int(usage.get("prompt_tokens")),
                "output_tokens": _int(usage.get("completion_tokens")),
            }
        counted = {
            "input_tokens": _int(usage.get("input_tokens")),
            "output_tokens": _int(usage.get("output_tokens")),
        }
        if self.kind == ANTHROPIC:
            for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
                counted[key] = _int(usage.get(key))
        return counted


class Grant:
    """One launch's placeholders, registered with the gateway until ``close``."""

    def __init__(self, gateway: Gateway, routes: LaunchRoutes, budget: int | None = None) -> None:
        self._gateway = gateway
        self.usage = Usage()
        self.budget = budget
        self.budget_reached = False
        self._warned = False
        self.keys = {
            route: PLACEHOLDER_PREFIX + secrets.token_urlsafe(24) for route in routes.upstreams
        }
        self.routes = routes
        self.access = GatewayPass(
            url=gateway.url,
            keys=dict(self.keys),
            hidden=routes.hidden,
            pi_providers=routes.pi_providers,
        )

    @property
    def used(self) -> int:
        """The tokens the budget counts: input and output."""
        return self.usage.input_tokens + self.usage.output_tokens

    def warn_due(self) -> bool:
        """True once, the first time this is asked after the count passed WARN_SHARE of the
        budget."""
        if self._warned or self.budget is None or self.used < WARN_SHARE * self.budget:
            return False
        self._warned = True
        return True

    def close(self) -> None:
        """End the placeholders: a request presenting one from now on is refused."""
        self._gateway._forget(self.keys.values())

    def __enter__(self) -> Grant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _error(
    api: Api,
    status: int,
    kind: str,
    message: str,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An error in the shape the provider's own clients parse and show."""
    if api == ANTHROPIC:
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "param": None, "code": kind}}
    return web.json_response(
        body, status=status, headers=headers, dumps=lambda o: json.dumps(o) + "\n"
    )


def _budget_reached(api: Api, grant: Grant) -> web.Response:
    """The answer to a request past the launch's budget, one its CLI gives up on at once.

    Anthropic: Claude Code retries a 429 or a 5xx with backoff for minutes (a rate limit
    passes), but takes a 400 as final: it may try one or two fallback requests at once, each
    refused alike, and ends the turn. OpenAI: a 429 ``insufficient_quota`` is the provider's own
    answer when money, not rate, runs out; Codex ends the turn on it at once. The SDKs behind
    Pi are told not to retry either.
    """
    message = f"amux budget reached: {grant.used}/{grant.budget} tokens used by this turn"
    if api == ANTHROPIC:
        return _error(api, 400, "invalid_request_error", message, NO_RETRY)
    return _error(api, 429, "insufficient_quota", message, NO_RETRY)


def _presented(headers: Mapping[str, str]) -> str | None:
    key = headers.get("x-api-key")
    if key:
        return key
    authorization = headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _connection_tokens(headers: Mapping[str, str]) -> set[str]:
    return {t.strip().lower() for t in headers.get("connection", "").split(",") if t.strip()}


def forwarded_headers(incoming: Mapping[str, str], upstream: Upstream) -> dict[str, str]:
    """The request's headers as sent upstream: no hop-by-hop header, no placeholder, the real
    credential added; identity encoding, so the bytes streamed back are readable for usage."""
    drop = HOP_BY_HOP | CREDENTIAL_HEADERS | _connection_tokens(incoming) | {"accept-encoding"}
    out = {k: v for k, v in incoming.items() if k.lower() not in drop}
    out["Accept-Encoding"] = "identity"
    credential = upstream.credential
    if credential:
        if upstream.scheme == "x-api-key":
            out["x-api-key"] = credential
        else:
            out["Authorization"] = f"Bearer {credential}"
        if upstream.scheme == "oauth":
            betas = [b.strip() for b in out.pop("anthropic-beta", "").split(",") if b.strip()]
            out["anthropic-beta"] = ",".join(
                [*betas, *([OAUTH_BETA] if OAUTH_BETA not in betas else [])]
            )
    return out


def returned_headers(upstream: Mapping[str, str]) -> dict[str, str]:
    drop = HOP_BY_HOP | _connection_tokens(upstream)
    return {k: v for k, v in upstream.items() if k.lower() not in drop}


class Gateway:
    """The worker's model gateway; ``await start()`` once, ``open`` a grant per launch."""

    def __init__(
        self,
        defaults: Mapping[str, Upstream],
        host: str = "127.0.0.1",
        port: int = 0,
        advertised: str | None = None,
    ) -> None:
        """Listening on ``host``:``port`` (0: any free port); Agents are told ``advertised``
        (default ``host``): an address of the worker's own pod when they run in pods."""
        self.defaults = dict(defaults)
        self._host = host
        self._bind_port = port
        self._advertised = advertised or host
        self._live: dict[str, tuple[Grant, Upstream]] = {}
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self._starting = asyncio.Lock()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self._advertised}:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        async with self._starting:
            if self._runner is not None:
                return
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, self._host, self._bind_port)
            await site.start()
            server = site._server
            sockets = getattr(server, "sockets", None)
            assert sockets
            self.port = int(sockets[0].getsockname()[1])
            self._client = aiohttp.ClientSession(
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=CONNECT_SECONDS, sock_read=READ_SECONDS
                ),
                skip_auto_headers=("User-Agent",),
            )
            self._runner = runner

    async def stop(self) -> None:
        async with self._starting:
            runner, client = self._runner, self._client
            self._runner = self._client = None
            if runner is not None:
                await runner.cleanup()
            if client is not None:
                await client.close()
            self._live.clear()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def open(self, routes: LaunchRoutes | None = None, budget: int | None = None) -> Grant:
        """Fresh placeholders for one launch, live until the grant is closed; ``budget``: the
        tokens its model requests may use (None: no limit)."""
        assert self.running, "the gateway is not started"
        grant = Grant(self, routes or LaunchRoutes(self.defaults), budget)
        for route, key in grant.keys.items():
            self._live[key] = (grant, grant.routes.upstreams[route])
        return grant

    def _forget(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._live.pop(key, None)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        shape: Api = (
            ANTHROPIC
            if path.startswith("/v1/messages") or "anthropic-version" in request.headers
            else OPENAI
        )
        if (request.method, path) not in MODEL_ENDPOINTS:
            return _error(
                shape,
                404,
                "not_found_error" if shape == ANTHROPIC else "not_found",
                f"the model gateway forwards only model endpoints; {request.method} {path} "
                "is not one",
            )
        presented = _presented(request.headers)
        entry = self._live.get(presented) if presented else None
        if entry is None:
            return _error(
                shape,
                401,
                "authentication_error" if shape == ANTHROPIC else "invalid_api_key",
                "the model gateway does not know this credential: it is not this launch's, "
                "or the launch has ended",
            )
        grant, upstream = entry
        kind = COUNTED.get(path)
        if kind is not None and grant.budget is not None and grant.used >= grant.budget:
            grant.budget_reached = True
            logger.info(
                "model gateway: %s %s refused: the launch's budget is spent", request.method, path
            )
            return _budget_reached(upstream.api, grant)
        client = self._client
        assert client is not None
        url = upstream.base + path[len("/v1") :]
        if request.query_string:
            url += "?" + request.query_string
        body = await request.read()
        try:
            async with client.request(
                request.method,
                url,
                headers=forwarded_headers(request.headers, upstream),
                data=body if body else None,
                allow_redirects=False,
            ) as answer:
                return await self._relay(request, answer, grant, kind)
        except (aiohttp.ClientError, TimeoutError) as error:
            logger.warning(
                "model gateway: %s %s to %s failed: %s",
                request.method,
                path,
                upstream.shown,
                type(error).__name__,
            )
            return _error(
                upstream.api,
                502,
                "api_error",
                f"the model gateway cannot reach {upstream.shown} ({type(error).__name__})",
            )

    async def _relay(
        self,
        request: web.Request,
        answer: aiohttp.ClientResponse,
        grant: Grant,
        kind: str | None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=answer.status, headers=returned_headers(answer.headers)
        )
        await response.prepare(request)
        streamed = answer.content_type == "text/event-stream"
        reader = UsageReader(kind, streamed) if kind and answer.status < 300 else None
        try:
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
                if reader is not None:
                    reader.feed(chunk)
            await response.write_eof()
        except (ConnectionResetError, aiohttp.ClientError, TimeoutError) as error:
            # The Agent went away, or the upstream broke off, mid-answer: the status is sent,
            # so the Agent sees a cut stream; what passed still counts.
            logger.info("model gateway: an answer was cut off (%s)", type(error).__name__)
        finally:
            counted = reader.counted() if reader is not None else None
            if counted is not None:
                grant.usage.add(counted)
        return response
