"""Hub RPC methods for Agent turns: submitting and following them, and the Runtime worker side."""

from __future__ import annotations

import time
from typing import Any

from hub.errors import Forbidden, InvalidArgument, NotFound
from hub.executions import Session, delegation_label
from hub.identity import Actor
from hub.rpc import Call, method
from hub.state import Principal

DELEGATION_SECONDS = 6 * 3600
MAX_WAIT_SECONDS = 30.0


def _text(call: Call, name: str, *, required: bool = False, limit: int = 4096) -> str | None:
    value = call.params.require(name) if required else call.params.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidArgument(f"{name} must be a string of at most {limit} characters")
    return value


def _wait(call: Call, default: float = 0.0) -> float:
    value = call.params.get("wait_seconds")
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidArgument("wait_seconds must be a non-negative number")
    return min(float(value), MAX_WAIT_SECONDS)


def _service(actor: Actor) -> None:
    if actor.principal.kind != "service" or actor.delegated:
        raise Forbidden("only a Runtime service principal can do this")


def _acting_for(call: Call) -> Principal:
    principal_id = _text(call, "principal_id")
    actor = call.actor
    if actor.delegated:
        raise Forbidden("an Agent credential cannot start Agent turns")
    if principal_id is None or principal_id == actor.principal.id:
        return actor.principal
    _service(actor)
    principal = call.hub.state.principal(principal_id)
    if principal is None:
        raise NotFound("no such principal", principal_id=principal_id)
    return principal


def _may_follow(call: Call, session: Session) -> None:
    actor = call.actor
    if actor.delegated:
        raise Forbidden("an Agent credential cannot follow Agent turns")
    if actor.principal.kind == "service" or actor.principal.is_owner:
        return
    if session.principal_id != actor.principal.id:
        raise Forbidden("this conversation belongs to someone else")


@method("executions.submit", "provider", "prompt", "cwd", "session_id", "origin", "principal_id")
async def executions_submit(call: Call) -> dict[str, Any]:
    principal = _acting_for(call)
    cwd = _text(call, "cwd")
    if cwd is not None and not call.actor.principal.is_owner:
        # A directory of the caller's choosing would be bound into the Agent's sandbox.
        raise Forbidden("only the owner may choose an Agent's working directory")
    execution, session = await call.hub.executions.submit(
        principal_id=principal.id,
        submitted_by=call.actor.principal.id,
        provider=_text(call, "provider", required=True, limit=64) or "",
        prompt=_text(call, "prompt", required=True, limit=1 << 20) or "",
        cwd=cwd,
        session_id=_text(call, "session_id", limit=64),
        origin=_text(call, "origin", limit=512),
    )
    return {"execution": execution, "session": session.to_wire()}


@method("executions.watch", "execution_id", "after", "wait_seconds")
async def executions_watch(call: Call) -> dict[str, Any]:
    execution_id = _text(call, "execution_id", required=True, limit=64) or ""
    executions = call.hub.executions
    _may_follow(call, executions.session(executions.describe(execution_id)["session_id"]))
    after = call.params.get("after") or 0
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise InvalidArgument("after must be a non-negative integer")
    return await executions.watch(execution_id, after, _wait(call))


@method("executions.cancel", "execution_id")
async def executions_cancel(call: Call) -> dict[str, Any]:
    execution_id = _text(call, "execution_id", required=True, limit=64) or ""
    executions = call.hub.executions
    _may_follow(call, executions.session(executions.describe(execution_id)["session_id"]))
    return await executions.cancel(execution_id)


@method("sessions.get", "session_id")
async def sessions_get(call: Call) -> dict[str, Any]:
    session = call.hub.executions.session(_text(call, "session_id", required=True, limit=64) or "")
    _may_follow(call, session)
    return session.to_wire()


@method("workers.register", "name")
async def workers_register(call: Call) -> dict[str, Any]:
    _service(call.actor)
    name = _text(call, "name", required=True, limit=128) or ""
    worker_id = call.hub.executions.register_worker(name, call.actor.principal.id)
    return {"worker_id": worker_id, "lease_seconds": call.hub.executions.lease_seconds}


@method("executions.claim", "worker_id", "wait_seconds")
async def executions_claim(call: Call) -> dict[str, Any]:
    _service(call.actor)
    worker_id = _text(call, "worker_id", required=True, limit=64) or ""
    claimed = await call.hub.executions.claim(worker_id, call.actor.principal.id, _wait(call))
    return claimed or {}


@method("executions.heartbeat", "execution_id", "worker_id")
async def executions_heartbeat(call: Call) -> dict[str, Any]:
    _service(call.actor)
    return await call.hub.executions.heartbeat(
        _text(call, "execution_id", required=True, limit=64) or "",
        _text(call, "worker_id", required=True, limit=64) or "",
    )


@method("executions.event", "execution_id", "worker_id", "kind", "text")
async def executions_event(call: Call) -> dict[str, Any]:
    _service(call.actor)
    seq = await call.hub.executions.add_event(
        _text(call, "execution_id", required=True, limit=64) or "",
        _text(call, "worker_id", required=True, limit=64) or "",
        _text(call, "kind", required=True, limit=32) or "",
        _text(call, "text", required=True, limit=1 << 20) or "",
    )
    return {"seq": seq}


@method(
    "executions.complete", "execution_id", "worker_id", "succeeded", "result", "error", "native_id"
)
async def executions_complete(call: Call) -> dict[str, Any]:
    _service(call.actor)
    succeeded = call.params.require("succeeded")
    if not isinstance(succeeded, bool):
        raise InvalidArgument("succeeded must be true or false")
    result = call.params.get("result")
    if result is not None and not isinstance(result, dict):
        raise InvalidArgument("result must be an object")
    return await call.hub.executions.complete(
        _text(call, "execution_id", required=True, limit=64) or "",
        _text(call, "worker_id", required=True, limit=64) or "",
        succeeded=succeeded,
        result=result,
        error=_text(call, "error", limit=16384),
        native_id=_text(call, "native_id", limit=256),
    )


@method("sessions.memory", "session_id", "capable")
async def sessions_memory(call: Call) -> dict[str, Any]:
    """Freeze a fresh Session's binding, or reuse the frozen one, and delegate a credential.

    A bound Session gets its credential even when memory is now off or the policy changed: its
    Agent keeps the protocol, and its data calls fail with the Hub's reason instead of falling
    back to some other memory.
    """
    _service(call.actor)
    hub = call.hub
    capable = call.params.get("capable")
    if capable is None:
        capable = True
    if not isinstance(capable, bool):
        raise InvalidArgument("capable must be true or false")
    session_id = _text(call, "session_id", required=True, limit=64) or ""
    session, warning = hub.executions.freeze_memory(
        session_id,
        enabled=hub.config.memory_enabled,
        isolation=hub.config.isolation,
        capable=capable,
    )
    answer: dict[str, Any] = {
        "memory": session.memory,
        "binding": session.binding,
        "warning": warning,
        "token": None,
        "credential_id": None,
    }
    if session.memory == "bound" and session.binding:
        token, credential = hub.state.issue_credential(
            session.principal_id,
            "delegated",
            binding=session.binding,
            label=delegation_label(session.id),
            expires_at=time.time() + DELEGATION_SECONDS,
            issued_by=call.actor.principal.id,
        )
        answer["token"] = token
        answer["credential_id"] = credential.id
    return answer


@method("sessions.unbind", "session_id")
async def sessions_unbind(call: Call) -> dict[str, Any]:
    """A launch whose memory discovery failed: the Session stays without memory for good."""
    _service(call.actor)
    session_id = _text(call, "session_id", required=True, limit=64) or ""
    call.hub.executions.mark_unbound(session_id)
    return call.hub.executions.session(session_id).to_wire()
