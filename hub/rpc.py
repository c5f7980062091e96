"""Hub RPC over HTTP: ``POST /rpc/v1/<method>`` with a JSON object in and out.

``serve_rpc`` authenticates every call and turns every failure into the one error shape, for the
HTTP route and for a client in the Hub's own process alike. The methods are declared in tables
(name → parameter model and handler) that the app factory passes to ``rpc_handler``; nothing
registers itself by being imported. Each method's parameters are one
pydantic model, checked before its handler runs, so handlers are thin: they get the typed
parameters, call a service and return its result.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hub import __version__
from hub.bodies import read_body
from hub.client import BINDING_HEADER, VIA_HEADER
from hub.contract import DEFAULT_DAYS, MAX_DAYS
from hub.errors import (
    AmuxError,
    BindingMismatch,
    InternalError,
    InvalidArgument,
    MemoryDisabled,
    NotFound,
    PayloadTooLarge,
    StorageUnavailable,
)
from hub.feishu_docs import METHODS as FEISHU_METHODS
from hub.history import via_of
from hub.identity import (
    Actor,
    acting_for,
    bearer_token,
    require_service,
)
from hub.limits import DEFAULT_LIMITS
from hub.memory import (
    ForgetRequest,
    GetRequest,
    HistoryRequest,
    RestoreRequest,
    SearchRequest,
    UpsertRequest,
)
from hub.metrics import METRICS, UNKNOWN_METHOD
from hub.paths import memory_scope
from hub.services import Hub
from hub.state import no_such_credential
from hub.storage import from_sqlite_error, refused
from hub.sysconfig import MAX_TOKENS

logger = logging.getLogger("amux.hub.rpc")

HUB = web.AppKey("hub", Hub)
# How a call came (the client's VIA_HEADER), as the amux CLI and ``amux mcp`` say; anything
# else is logged as ``rpc``.
CLIENT_VIAS = frozenset({"cli", "mcp"})
PROTOCOL_VERSION = 1


class Params(BaseModel):
    """A method's parameters.

    Names the method does not take are refused, not ignored. JSON null means left out, as the
    client leaves out what is None. Types are strict: ``true`` is not a number and ``"1"`` not an
    integer. A field's ``description`` is its rule, and a wrong value is refused with
    "<name> must be <rule>". Fields typed ``object`` are checked by the service they are passed
    to, which owns their rules and codes (a memory path's ``invalid_path``).
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_left_out(cls, body: Any) -> Any:
        if not isinstance(body, dict):
            return body
        # Only known names: an unknown one is refused even when its value is null.
        return {k: v for k, v in body.items() if v is not None or k not in cls.model_fields}


class NoParams(Params):
    pass


def text_field(limit: int, default: Any = ...) -> Any:
    """A string parameter of at most ``limit`` characters (required unless given a default)."""
    return Field(default, max_length=limit, description=f"a string of at most {limit} characters")


def refusal_message(error: ValidationError, model: type[Params]) -> str:
    """The one message a caller gets for parameters ``model`` refused.

    Unknown names come first, all of them, since a misspelt name also makes its correct spelling
    look missing; then the first missing or wrong parameter in the model's order.
    """
    problems = error.errors()
    unknown = sorted(str(p["loc"][0]) for p in problems if p["type"] == "extra_forbidden")
    if unknown:
        return f"unknown parameter(s): {', '.join(unknown)}"
    problem = problems[0]
    name = str(problem["loc"][0]) if problem["loc"] else "parameters"
    if problem["type"] == "missing":
        return f"missing parameter: {name}"
    field = model.model_fields.get(name)
    rule = field.description if field is not None else None
    return f"{name} must be {rule}" if rule else f"{name}: {problem['msg']}"


P = TypeVar("P", bound=Params)


def parse_params(model: type[P], body: dict[str, Any]) -> P:
    """Raises: InvalidArgument: the body does not fit the model (see ``refusal_message``)."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise InvalidArgument(refusal_message(error, model)) from None


@dataclass(frozen=True)
class Call:
    """Who calls, through which Hub, and the memory binding their credential presented."""

    hub: Hub
    actor: Actor
    binding: str | None
    via: str = "rpc"
    # Whether the caller still waits for the answer: a long poll outlives a caller that died.
    connected: Callable[[], bool] = lambda: True


@dataclass(frozen=True)
class Method(Generic[P]):
    """One RPC method: the model its parameters must fit and the handler that gets them."""

    params: type[P]
    handler: Callable[[Call, P], Awaitable[dict[str, Any]]]


Methods = Mapping[str, Method[Any]]


def combine(*tables: Methods) -> Methods:
    """One table from several; a name declared twice fails here rather than one silently winning."""
    combined: dict[str, Method[Any]] = {}
    for table in tables:
        for name, spec in table.items():
            if name in combined:
                raise ValueError(f"RPC method {name} is declared twice")
            combined[name] = spec
    return MappingProxyType(combined)


def error_response(error: AmuxError) -> web.Response:
    return web.Response(
        status=error.status,
        body=dumps(error.to_wire()),
        content_type="application/json",
        charset="utf-8",
    )


# Made once: json.dumps and json.loads with options build a new encoder or decoder per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(value: object) -> bytes:
    return _ENCODER.encode(value).encode("utf-8")


@dataclass(frozen=True)
class RpcRequest:
    """One call as a transport delivers it: the HTTP route (``rpc_handler``) or a client in the
    Hub's own process (``hub.local_transport``). Both are served by ``serve_rpc``, so neither
    skips a step the other takes: authentication above all."""

    name: str
    # The ``Authorization`` header as sent: checked here, whoever carried it.
    authorization: str | None
    # Read only once the caller is authenticated and the method known.
    read_body: Callable[[], Awaitable[bytes]]
    binding: str | None = None
    via: str = ""
    verb: str = "POST"
    path: str = ""
    # Whether the caller still waits for the answer: a long poll outlives a caller that died.
    connected: Callable[[], bool] = lambda: True


@dataclass(frozen=True)
class RpcAnswer:
    """The JSON answer of one call, with its HTTP status and, for a failure, its error code."""

    status: int
    body: bytes
    error_code: str | None = None


async def serve_rpc(app: web.Application, methods: Methods, request: RpcRequest) -> RpcAnswer:
    """Serve one call from ``methods``: the metrics around the error mapping around
    authentication and dispatch."""
    metrics = app.get(METRICS)
    started = time.perf_counter()
    answer = await _answer(app, methods, request)
    if metrics is not None:
        # Unknown names are the caller's to choose; one label keeps the series count bounded.
        label = request.name if request.name in methods else UNKNOWN_METHOD
        metrics.observe_rpc(
            label,
            answer.status,
            time.perf_counter() - started,
            answer.error_code,
            answer.body,
        )
    return answer


async def _answer(app: web.Application, methods: Methods, request: RpcRequest) -> RpcAnswer:
    """Every failure as the one error shape."""
    try:
        return RpcAnswer(200, dumps(await _dispatch(app, methods, request)))
    except AmuxError as error:
        return _failed(app, error)
    except web.HTTPRequestEntityTooLarge:
        return _failed(app, PayloadTooLarge("request body is too large"))
    except web.HTTPException as http:
        if http.status == 404:
            return _failed(app, NotFound(f"no such RPC route: {request.path}"))
        if http.status == 405:
            return _failed(app, InvalidArgument("Hub RPC calls use POST"))
        raise
    except sqlite3.Error as error:
        # A statement outside State.transaction meets the state database's disk failing too.
        failure = from_sqlite_error(error)
        if failure is None:
            logger.exception("RPC %s failed", request.path)
            return _failed(app, InternalError("internal error; see the Hub log"))
        return _failed(app, refused(failure, app[HUB].state.path))
    except Exception:
        logger.exception("RPC %s failed", request.path)
        return _failed(app, InternalError("internal error; see the Hub log"))


def _failed(app: web.Application, error: AmuxError) -> RpcAnswer:
    metrics = app.get(METRICS)
    if metrics is not None and isinstance(error, StorageUnavailable):
        metrics.storage_refused(error.disk, error.cause)
    return RpcAnswer(error.status, dumps(error.to_wire()), error.code)


def _refuse_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity, which JSON does not; a NaN wait never ends.
    raise InvalidArgument(f"request body contains {name}, which is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        # 1e999 parses to infinity: as unusable as a literal Infinity.
        raise InvalidArgument(f"request body contains a number out of range: {text[:40]}")
    return value


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def parse_body(raw: bytes) -> dict[str, Any]:
    """A call's JSON object; anything else, however malformed, is ``invalid_argument``."""
    if not raw.strip():
        return {}
    try:
        # As json.loads reads bytes: UTF-8, -16 or -32, by their first bytes.
        body = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
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


async def _dispatch(app: web.Application, methods: Methods, request: RpcRequest) -> Any:
    # Authenticated first: an unknown method or a malformed body tells a stranger nothing.
    hub = app[HUB]
    actor = hub.authenticate(bearer_token(request.authorization))
    if request.verb != "POST":
        raise InvalidArgument("Hub RPC calls use POST")
    spec = methods.get(request.name)
    if spec is None:
        raise NotFound(f"unknown RPC method '{request.name}'")
    params = parse_params(spec.params, parse_body(await request.read_body()))
    via = request.via if request.via in CLIENT_VIAS else "rpc"
    call = Call(hub, actor, request.binding, via, connected=request.connected)
    return await spec.handler(call, params)


RPC_PATH = "/rpc/v1/{method}"
# The table ``add_hub`` serves, for a transport in the Hub's own process to serve from too.
RPC_METHODS = web.AppKey("rpc_methods", Mapping[str, Method[Any]])


def rpc_handler(methods: Methods) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The HTTP endpoint serving ``methods`` through ``serve_rpc``. Applied to the one RPC route
    only, not through a sub-application: routing a request through a second router is a
    measurable share of a small read."""

    async def endpoint(request: web.Request) -> web.StreamResponse:
        async def body() -> bytes:
            settings = request.app[HUB].settings
            return await read_body(
                request, settings.max_request_bytes, settings.request_body_seconds
            )

        answer = await serve_rpc(
            request.app,
            methods,
            RpcRequest(
                name=request.match_info.get("method", ""),
                authorization=request.headers.get("Authorization"),
                read_body=body,
                binding=request.headers.get(BINDING_HEADER) or None,
                via=request.headers.get(VIA_HEADER, ""),
                verb=request.method,
                path=request.path,
                connected=lambda: (
                    request.transport is not None and not request.transport.is_closing()
                ),
            ),
        )
        return web.Response(
            status=answer.status,
            body=answer.body,
            content_type="application/json",
            charset="utf-8",
        )

    return endpoint


# -- memory ---------------------------------------------------------------------------------------
# Each handler hands the typed parameters to the memory service, which owns every rule.


class SearchParams(Params):
    query: object
    path_prefix: object = None
    limit: object = None


async def memory_search(call: Call, params: SearchParams) -> dict[str, Any]:
    p = params
    request = SearchRequest(p.query, p.path_prefix, p.limit)
    return (await call.hub.memory.search(call.actor, call.binding, request)).to_wire()


class GetParams(Params):
    path: object
    start_line: object = None
    end_line: object = None
    offset: object = None


async def memory_get(call: Call, params: GetParams) -> dict[str, Any]:
    p = params
    request = GetRequest(p.path, p.start_line, p.end_line, p.offset)
    return (await call.hub.memory.get(call.actor, call.binding, request)).to_wire()


class UpsertParams(Params):
    path: object
    content: object
    expected_revision: object


async def memory_upsert(call: Call, params: UpsertParams) -> dict[str, Any]:
    p = params
    request = UpsertRequest(p.path, p.content, p.expected_revision)
    saved = await call.hub.memory.upsert(call.actor, call.binding, request, via_of(call.via))
    return saved.to_wire()


class ForgetParams(Params):
    path: object
    expected_revision: object


async def memory_forget(call: Call, params: ForgetParams) -> dict[str, Any]:
    request = ForgetRequest(params.path, params.expected_revision)
    forgotten = await call.hub.memory.forget(call.actor, call.binding, request, via_of(call.via))
    return forgotten.to_wire()


class HistoryParams(Params):
    path: object = None
    limit: int = Field(20, ge=1, le=200, description="an integer from 1 to 200")
    before: int | None = Field(None, ge=1, description="a positive integer (a next_before)")


async def memory_history(call: Call, params: HistoryParams) -> dict[str, Any]:
    request = HistoryRequest(params.path, params.limit, params.before)
    return call.hub.memory.history(call.actor, call.binding, request).to_wire()


class RestoreParams(Params):
    path: object
    # A revision or a unique prefix of one: checked with its rules by the memory service.
    revision: object
    expected_revision: object


async def memory_restore(call: Call, params: RestoreParams) -> dict[str, Any]:
    p = params
    request = RestoreRequest(p.path, p.revision, p.expected_revision)
    restored = await call.hub.memory.restore(call.actor, call.binding, request, via_of(call.via))
    return restored.to_wire()


class EraseParams(Params):
    # Left out: the caller's whole scope ("forget me").
    path: object = None


async def memory_erase(call: Call, params: EraseParams) -> dict[str, Any]:
    receipt = await call.hub.memory.erase(call.actor, call.binding, params.path, via_of(call.via))
    logger.info("memory erased by %s", call.actor.principal.name)
    return receipt.to_wire()


class ErasePrincipalParams(Params):
    principal_id: str = text_field(64)


async def memory_erase_principal(call: Call, params: ErasePrincipalParams) -> dict[str, Any]:
    """The owner erases everything one Principal wrote to memory, whatever the running policy."""
    memory = call.hub.memory
    receipt = await memory.erase_principal(call.actor, params.principal_id, via_of(call.via))
    # Their Feishu connection goes with them: nothing of theirs is read as them again.
    await call.hub.user_tokens.erase(params.principal_id)
    logger.info("memory of a principal erased by %s", call.actor.principal.name)
    return receipt.to_wire()


MEMORY_METHODS: Methods = MappingProxyType(
    {
        "memory.search": Method(SearchParams, memory_search),
        "memory.get": Method(GetParams, memory_get),
        "memory.upsert": Method(UpsertParams, memory_upsert),
        "memory.forget": Method(ForgetParams, memory_forget),
        "memory.history": Method(HistoryParams, memory_history),
        "memory.restore": Method(RestoreParams, memory_restore),
        "memory.erase": Method(EraseParams, memory_erase),
    }
)

# Owner administration of memory; not one of the memory tools a Principal calls on its own scope.
MEMORY_ADMIN_METHODS: Methods = MappingProxyType(
    {
        "memory.erase_principal": Method(ErasePrincipalParams, memory_erase_principal),
    }
)


# -- system ---------------------------------------------------------------------------------------


async def system_capabilities(call: Call, params: NoParams) -> dict[str, Any]:
    hub = call.hub
    limits = DEFAULT_LIMITS
    result: dict[str, Any] = {
        "version": __version__,
        "protocol_version": PROTOCOL_VERSION,
        "memory": {
            "enabled": hub.config.memory_enabled,
            "isolation": "on" if hub.config.isolation else "off",
            "methods": list(MEMORY_METHODS),
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
    # Whether the Feishu tools can read: only with a Feishu app beside this Hub.
    result["feishu"] = {"available": hub.feishu_docs is not None, "methods": list(FEISHU_METHODS)}
    # What the next turn runs under, so a plan or a client can say so before it starts.
    result["agents"] = {
        "permissions": hub.config.permissions,
        "approval_timeout": hub.config.approval_timeout,
    }
    for hook in hub.capability_hooks:
        result.update(hook())
    return result


async def system_whoami(call: Call, params: NoParams) -> dict[str, Any]:
    actor = call.actor
    hub = call.hub
    return {
        "principal": actor.principal.to_wire(),
        "credential": {"id": actor.credential.id, "kind": actor.credential.kind},
        "memory_scope": memory_scope(actor.principal.id, hub.config.isolation),
        "aliases": [{"kind": k, "value": v} for k, v in hub.state.aliases(actor.principal.id)],
    }


async def system_config_get(call: Call, params: NoParams) -> dict[str, Any]:
    return {key: view.to_wire() for key, view in call.hub.config.describe().items()}


class ConfigSetParams(Params):
    # The settings check their own keys and values, for the CLI and the cards alike.
    key: object
    value: object


async def system_config_set(call: Call, params: ConfigSetParams) -> dict[str, Any]:
    call.hub.require_owner(call.actor)
    saved = call.hub.config.save(params.key, params.value)
    logger.info("setting %s saved by %s", params.key, call.actor.principal.name)
    described = saved.to_wire()
    if saved.key == "memory.isolation" and saved.saved == "on" and not call.hub.config.isolation:
        # What per-person scopes will not see once it applies: the CLI warns with it.
        described["global_documents"] = await call.hub.memory.global_documents()
    return {saved.key: described}


async def system_restart(call: Call, params: NoParams) -> dict[str, Any]:
    call.hub.require_owner(call.actor)
    logger.info("restart requested by %s", call.actor.principal.name)
    call.hub.restart_requested.set()
    return {"restarting": True}


SYSTEM_METHODS: Methods = MappingProxyType(
    {
        "system.capabilities": Method(NoParams, system_capabilities),
        "system.whoami": Method(NoParams, system_whoami),
        "system.config.get": Method(NoParams, system_config_get),
        "system.config.set": Method(ConfigSetParams, system_config_set),
        "system.restart": Method(NoParams, system_restart),
    }
)


# -- usage ------------------------------------------------------------------------------------


class UsageParams(Params):
    # A Principal's id or name; left out: the caller's own (the owner's: everyone's).
    principal: str | None = text_field(128, None)
    days: int = Field(
        DEFAULT_DAYS, ge=1, le=MAX_DAYS, description=f"an integer from 1 to {MAX_DAYS}"
    )


async def usage_report(call: Call, params: UsageParams) -> dict[str, Any]:
    return call.hub.usage.report(call.actor, params.principal, params.days).to_wire()


class ExtendParams(Params):
    # A Principal's id or name.
    principal: str = text_field(128)
    tokens: int = Field(
        ge=1, le=MAX_TOKENS, description=f"a whole number of tokens from 1 to {MAX_TOKENS}"
    )


async def usage_extend(call: Call, params: ExtendParams) -> dict[str, Any]:
    return await call.hub.usage.extend(call.actor, params.principal, params.tokens)


USAGE_METHODS: Methods = MappingProxyType(
    {
        "usage.report": Method(UsageParams, usage_report),
        "usage.extend": Method(ExtendParams, usage_extend),
    }
)


# -- identity ----------------------------------------------------------------------------------

MAX_DELEGATION_SECONDS = 7 * 24 * 3600


class ResolveParams(Params):
    principal_id: str | None = Field(None, description="a string")


async def memory_binding_resolve(call: Call, params: ResolveParams) -> dict[str, Any]:
    """The binding a fresh execution for this Principal freezes; refused while memory is off."""
    principal = acting_for(call.actor, call.hub.state, params.principal_id)
    hub = call.hub
    if not hub.config.memory_enabled:
        raise MemoryDisabled("Agent memory is disabled on this Hub; new conversations get none")
    binding = memory_scope(principal.id, hub.config.isolation)
    return {"binding": binding, "principal_id": principal.id}


class DelegateParams(Params):
    principal_id: str | None = Field(None, description="a string")
    binding: str = Field(description="a string")
    # Default: the Hub's delegated_credential_seconds, the one lifetime of Agent credentials.
    ttl_seconds: int | None = Field(
        None,
        ge=1,
        le=MAX_DELEGATION_SECONDS,
        description=f"between 1 and {MAX_DELEGATION_SECONDS}",
    )
    label: str = Field("", max_length=200, description="a short string")


async def credentials_delegate(call: Call, params: DelegateParams) -> dict[str, Any]:
    """Issue an Agent credential for one managed execution, bound to its Principal and binding."""
    require_service(call.actor)
    principal = acting_for(call.actor, call.hub.state, params.principal_id)
    hub = call.hub
    binding = params.binding
    if not hub.config.memory_enabled:
        raise MemoryDisabled("Agent memory is disabled on this Hub; no new bindings are issued")
    expected = memory_scope(principal.id, hub.config.isolation)
    if binding != expected:
        raise BindingMismatch(
            "the binding does not match this principal under the Hub's policy", binding=binding
        )
    token, credential = hub.state.issue_credential(
        principal.id,
        "delegated",
        binding=binding,
        label=params.label,
        expires_at=time.time() + (params.ttl_seconds or hub.settings.delegated_credential_seconds),
        issued_by=call.actor.principal.id,
    )
    return {"token": token, **credential.to_wire(), "principal_id": principal.id}


class RevokeParams(Params):
    id: str = Field(description="a string")


async def credentials_revoke(call: Call, params: RevokeParams) -> dict[str, Any]:
    """Revoke a delegated credential this service issued (or any, for the owner).

    Who may revoke is settled before the id is looked up, and a credential another service
    issued answers as an unknown id: no answer tells a caller which credential ids exist.
    """
    hub = call.hub
    actor = call.actor
    if not actor.owner_in_person:
        require_service(actor)
        try:
            issuer = hub.state.credential_issuer(params.id)
        except NotFound:
            issuer = None
        if issuer != actor.principal.id:
            raise no_such_credential(params.id)
    return hub.state.revoke_credential(params.id).to_wire()


IDENTITY_METHODS: Methods = MappingProxyType(
    {
        "memory.binding.resolve": Method(ResolveParams, memory_binding_resolve),
        "credentials.delegate": Method(DelegateParams, credentials_delegate),
        "credentials.revoke": Method(RevokeParams, credentials_revoke),
    }
)
