"""Hub RPC over HTTP: ``POST /rpc/v1/<method>`` with a JSON object in and out.

Middleware authenticates every call and turns every failure into the one error shape; handlers are
thin: check parameters, call a service, return its result.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from hub import __version__
from hub.errors import (
    AmuxError,
    BindingMismatch,
    Forbidden,
    InternalError,
    InvalidArgument,
    MemoryDisabled,
    NotFound,
    PayloadTooLarge,
)
from hub.identity import Actor, bearer_token, memory_scope
from hub.limits import DEFAULT_LIMITS
from hub.metrics import METRICS, UNKNOWN_METHOD
from hub.paths import GLOBAL_SCOPE, principal_scope
from hub.services import Hub
from hub.state import Principal

logger = logging.getLogger("amux.hub.rpc")

HUB = web.AppKey("hub", Hub)
ACTOR_KEY = web.RequestKey("actor", Actor)
ERROR_CODE_KEY = web.RequestKey("error_code", str)
BINDING_HEADER = "X-Amux-Memory-Binding"
PROTOCOL_VERSION = 1


class Params:
    """A call's parameters; names the method does not take are refused, not ignored."""

    def __init__(self, body: dict[str, Any], allowed: frozenset[str]) -> None:
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise InvalidArgument(f"unknown parameter(s): {', '.join(unknown)}")
        self._body = body

    def get(self, name: str) -> Any:
        return self._body.get(name)

    def require(self, name: str) -> Any:
        if self._body.get(name) is None:
            raise InvalidArgument(f"missing parameter: {name}")
        return self._body[name]


@dataclass(frozen=True)
class Call:
    hub: Hub
    actor: Actor
    binding: str | None
    params: Params


Handler = Callable[[Call], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Method:
    handler: Handler
    params: frozenset[str]


METHODS: dict[str, Method] = {}


def method(name: str, *params: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        METHODS[name] = Method(handler, frozenset(params))
        return handler

    return register


def error_response(error: AmuxError) -> web.Response:
    return web.Response(
        status=error.status,
        body=dumps(error.to_wire()),
        content_type="application/json",
        charset="utf-8",
    )


def dumps(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


@web.middleware
async def errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except AmuxError as error:
        return _failed(request, error)
    except web.HTTPRequestEntityTooLarge:
        return _failed(request, PayloadTooLarge("request body is too large"))
    except web.HTTPException as http:
        if http.status == 404:
            return _failed(request, NotFound(f"no such RPC route: {request.path}"))
        if http.status == 405:
            return _failed(request, InvalidArgument("Hub RPC calls use POST"))
        raise
    except Exception:
        logger.exception("RPC %s failed", request.path)
        return _failed(request, InternalError("internal error; see the Hub log"))


def _failed(request: web.Request, error: AmuxError) -> web.Response:
    # The metrics middleware outside this one counts outcomes by code.
    request[ERROR_CODE_KEY] = error.code
    return error_response(error)


@web.middleware
async def metrics_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    metrics = request.app.get(METRICS)
    if metrics is None:
        return await handler(request)
    started = time.perf_counter()
    response = await handler(request)
    name = request.match_info.get("method", "")
    # Unknown names are the caller's to choose; one label keeps the series count bounded.
    label = name if name in METHODS else UNKNOWN_METHOD
    body = response.body if isinstance(response, web.Response) else b""
    metrics.observe_rpc(
        label,
        response.status,
        time.perf_counter() - started,
        request.get(ERROR_CODE_KEY),
        body if isinstance(body, bytes) else b"",
    )
    return response


@web.middleware
async def auth_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    hub = request.app[HUB]
    token = bearer_token(request.headers.get("Authorization"))
    request[ACTOR_KEY] = hub.authenticate(token)
    return await handler(request)


def _refuse_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity, which JSON does not; a NaN wait never ends.
    raise InvalidArgument(f"request body contains {name}, which is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        # 1e999 parses to infinity: as unusable as a literal Infinity.
        raise InvalidArgument(f"request body contains a number out of range: {text[:40]}")
    return value


def parse_body(raw: bytes) -> dict[str, Any]:
    """A call's JSON object; anything else, however malformed, is ``invalid_argument``."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise InvalidArgument("request body is nested too deeply") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidArgument("request body is not valid JSON") from None
    except ValueError:
        # What remains is int()'s digit limit on a huge integer literal.
        raise InvalidArgument("request body contains an integer with too many digits") from None
    if not isinstance(body, dict):
        raise InvalidArgument("request body must be a JSON object")
    return body


async def dispatch(request: web.Request) -> web.Response:
    if request.method != "POST":
        raise InvalidArgument("Hub RPC calls use POST")
    name = request.match_info["method"]
    spec = METHODS.get(name)
    if spec is None:
        raise NotFound(f"unknown RPC method '{name}'")
    body = parse_body(await request.read())
    binding = request.headers.get(BINDING_HEADER) or None
    hub = request.app[HUB]
    result = await spec.handler(Call(hub, request[ACTOR_KEY], binding, Params(body, spec.params)))
    return web.Response(body=dumps(result), content_type="application/json", charset="utf-8")


RPC_PATH = "/rpc/v1/{method}"
# Outermost first. Applied to the one RPC route only, not through a sub-application: routing a
# request through a second router is a measurable share of a small read.
RPC_MIDDLEWARES = (metrics_middleware, errors_middleware, auth_middleware)


def rpc_handler() -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The RPC endpoint with its middleware chain (metrics → errors → auth → dispatch)."""
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]] = dispatch
    for middleware in reversed(RPC_MIDDLEWARES):
        handler = functools.partial(middleware, handler=handler)
    return handler


# -- memory ---------------------------------------------------------------------------------------


@method("memory.search", "query", "path_prefix", "limit")
async def memory_search(call: Call) -> dict[str, Any]:
    scope = call.hub.memory_scope_for(call.actor, call.binding)
    p = call.params
    return await call.hub.store.search(
        scope, p.require("query"), p.get("path_prefix"), p.get("limit")
    )


@method("memory.get", "path", "start_line", "end_line", "offset")
async def memory_get(call: Call) -> dict[str, Any]:
    scope = call.hub.memory_scope_for(call.actor, call.binding)
    p = call.params
    return await call.hub.store.get(
        scope, p.require("path"), p.get("start_line"), p.get("end_line"), p.get("offset")
    )


@method("memory.upsert", "path", "content", "expected_revision")
async def memory_upsert(call: Call) -> dict[str, Any]:
    scope = call.hub.memory_scope_for(call.actor, call.binding)
    p = call.params
    content = p.get("content")
    if content is None:
        raise InvalidArgument("missing parameter: content")
    return await call.hub.store.upsert(
        scope, p.require("path"), content, p.require("expected_revision")
    )


@method("memory.forget", "path", "expected_revision")
async def memory_forget(call: Call) -> dict[str, Any]:
    scope = call.hub.memory_scope_for(call.actor, call.binding)
    p = call.params
    return await call.hub.store.forget(scope, p.require("path"), p.require("expected_revision"))


# -- system ---------------------------------------------------------------------------------------


@method("system.capabilities")
async def system_capabilities(call: Call) -> dict[str, Any]:
    hub = call.hub
    limits = DEFAULT_LIMITS
    result: dict[str, Any] = {
        "version": __version__,
        "protocol_version": PROTOCOL_VERSION,
        "memory": {
            "enabled": hub.config.memory_enabled,
            "isolation": "on" if hub.config.isolation else "off",
            "methods": ["memory.search", "memory.get", "memory.upsert", "memory.forget"],
        },
        "limits": {
            "entry_bytes": limits.entry_bytes,
            "entry_lines": limits.entry_lines,
            "document_bytes": limits.document_bytes,
            "scope_documents": limits.scope_documents,
            "scope_bytes": limits.scope_bytes,
            "query_bytes": limits.query_bytes,
            "query_terms": limits.query_terms,
            "search_max_results": limits.search_max_results,
            "response_bytes": limits.response_bytes,
        },
    }
    result["runtime"] = {"workers": hub.executions.connected_workers()}
    for hook in hub.capability_hooks:
        result.update(hook())
    return result


@method("system.whoami")
async def system_whoami(call: Call) -> dict[str, Any]:
    actor = call.actor
    hub = call.hub
    return {
        "principal": actor.principal.to_wire(),
        "credential": {"id": actor.credential.id, "kind": actor.credential.kind},
        "memory_scope": memory_scope(actor, hub.config.isolation),
        "aliases": [{"kind": k, "value": v} for k, v in hub.state.aliases(actor.principal.id)],
    }


@method("system.config.get")
async def system_config_get(call: Call) -> dict[str, Any]:
    return call.hub.config.describe()


@method("system.config.set", "key", "value")
async def system_config_set(call: Call) -> dict[str, Any]:
    call.hub.require_owner(call.actor)
    key = call.params.require("key")
    described = call.hub.config.save(key, call.params.require("value"))
    logger.info("setting %s saved by %s", key, call.actor.principal.name)
    return {key: described}


@method("system.restart")
async def system_restart(call: Call) -> dict[str, Any]:
    call.hub.require_owner(call.actor)
    logger.info("restart requested by %s", call.actor.principal.name)
    call.hub.restart_requested.set()
    return {"restarting": True}


# -- identity ----------------------------------------------------------------------------------

DEFAULT_DELEGATION_SECONDS = 12 * 3600
MAX_DELEGATION_SECONDS = 7 * 24 * 3600


def _require_service(actor: Actor) -> None:
    if actor.principal.kind != "service" or actor.delegated:
        raise Forbidden("only a Runtime service principal can do this")


def _effective_principal(call: Call) -> Principal:
    """The Principal a Runtime acts for: itself by default, or the one it names (services only)."""
    principal_id = call.params.get("principal_id")
    if principal_id is None or principal_id == call.actor.principal.id:
        return call.actor.principal
    _require_service(call.actor)
    if not isinstance(principal_id, str):
        raise InvalidArgument("principal_id must be a string")
    principal = call.hub.state.principal(principal_id)
    if principal is None:
        raise NotFound("no such principal", principal_id=principal_id)
    return principal


@method("memory.binding.resolve", "principal_id")
async def memory_binding_resolve(call: Call) -> dict[str, Any]:
    """The binding a fresh execution for this Principal freezes; refused while memory is off."""
    principal = _effective_principal(call)
    hub = call.hub
    if not hub.config.memory_enabled:
        raise MemoryDisabled("Agent memory is disabled on this Hub; new conversations get none")
    binding = principal_scope(principal.id) if hub.config.isolation else GLOBAL_SCOPE
    return {"binding": binding, "principal_id": principal.id}


@method("credentials.delegate", "principal_id", "binding", "ttl_seconds", "label")
async def credentials_delegate(call: Call) -> dict[str, Any]:
    """Issue an Agent credential for one managed execution, bound to its Principal and binding."""
    _require_service(call.actor)
    principal = _effective_principal(call)
    hub = call.hub
    binding = call.params.require("binding")
    if not isinstance(binding, str):
        raise InvalidArgument("binding must be a string")
    if not hub.config.memory_enabled:
        raise MemoryDisabled("Agent memory is disabled on this Hub; no new bindings are issued")
    expected = principal_scope(principal.id) if hub.config.isolation else GLOBAL_SCOPE
    if binding != expected:
        raise BindingMismatch(
            "the binding does not match this principal under the Hub's policy", binding=binding
        )
    ttl = call.params.get("ttl_seconds")
    if ttl is None:
        ttl = DEFAULT_DELEGATION_SECONDS
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= MAX_DELEGATION_SECONDS:
        raise InvalidArgument(f"ttl_seconds must be between 1 and {MAX_DELEGATION_SECONDS}")
    label = call.params.get("label") or ""
    if not isinstance(label, str) or len(label) > 200:
        raise InvalidArgument("label must be a short string")
    token, credential = hub.state.issue_credential(
        principal.id,
        "delegated",
        binding=binding,
        label=label,
        expires_at=time.time() + ttl,
        issued_by=call.actor.principal.id,
    )
    return {"token": token, **credential.to_wire(), "principal_id": principal.id}


@method("credentials.revoke", "id")
async def credentials_revoke(call: Call) -> dict[str, Any]:
    """Revoke a delegated credential this service issued (or any, for the owner)."""
    credential_id = call.params.require("id")
    if not isinstance(credential_id, str):
        raise InvalidArgument("id must be a string")
    hub = call.hub
    issuer = hub.state.credential_issuer(credential_id)
    if not (call.actor.principal.is_owner and not call.actor.delegated):
        _require_service(call.actor)
        if issuer != call.actor.principal.id:
            raise Forbidden("a service can revoke only the credentials it issued")
    return hub.state.revoke_credential(credential_id).to_wire()
