"""Hub RPC methods for Agent turns: submitting and following them, and the Runtime worker side."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from hub import usage
from hub.approvals import MAX_REASON_CHARS
from hub.contract import (
    BOT_ORIGIN_PREFIX,
    MAX_DETAIL_CHARS,
    MAX_SUBJECT_CHARS,
    Session,
    TurnOutcome,
    TurnResult,
    is_bot_origin,
)
from hub.errors import Forbidden, InvalidArgument, NotFound
from hub.executions import delegation_label, no_such_execution, no_such_session
from hub.identity import acting_for, require_service
from hub.rpc import Call, Method, Methods, Params, text_field
from hub.services import Hub
from hub.state import Principal

MAX_WAIT_SECONDS = 30.0
ID_CHARS = 64
PROMPT_CHARS = 1 << 20


def _at_most_max_wait(seconds: float) -> float:
    return min(seconds, MAX_WAIT_SECONDS)


# A longer wait is shortened, not refused: the caller simply polls again sooner.
WaitSeconds = Annotated[float, AfterValidator(_at_most_max_wait)]


def wait_field() -> Any:
    return Field(0.0, ge=0, allow_inf_nan=False, description="a non-negative number")


def _acting_for(call: Call, principal_id: str | None) -> Principal:
    if call.actor.delegated:
        raise Forbidden("an Agent credential cannot start Agent turns")
    return acting_for(call.actor, call.hub.state, principal_id)


# Who may see what, decided before anything is looked up, so that no answer tells a caller whether
# an id exists: a caller that may follow no turn at all (an Agent credential) is refused whatever
# the id, and one that may follow only its own gets, for someone else's, the very answer an
# unknown id gets.


def _may_follow_turns(call: Call) -> None:
    if call.actor.delegated:
        raise Forbidden("an Agent credential cannot follow Agent turns")


def _sees_every_session(call: Call) -> bool:
    principal = call.actor.principal
    return principal.kind == "service" or principal.is_owner


def _visible_session(call: Call, session_id: str) -> Session:
    """Raises: Forbidden: an Agent credential. NotFound: no such Session, or not the caller's."""
    _may_follow_turns(call)
    session = call.hub.executions.session(session_id)
    if not _sees_every_session(call) and session.principal_id != call.actor.principal.id:
        raise no_such_session(session_id)
    return session


def _visible_execution(call: Call, execution_id: str) -> None:
    """Raises: Forbidden: an Agent credential. NotFound: no such execution, or not the caller's."""
    _may_follow_turns(call)
    executions = call.hub.executions
    session = executions.session(executions.describe(execution_id).session_id)
    if not _sees_every_session(call) and session.principal_id != call.actor.principal.id:
        raise no_such_execution(execution_id)


class SubmitParams(Params):
    provider: str = text_field(ID_CHARS)
    prompt: str = text_field(PROMPT_CHARS)
    cwd: str | None = text_field(4096, None)
    session_id: str | None = text_field(ID_CHARS, None)
    origin: str | None = text_field(512, None)
    principal_id: str | None = text_field(4096, None)
    # A new conversation in a checkout of this project (the owner only; a Feishu chat's come
    # from its binding).
    project: str | None = text_field(64, None)


async def executions_submit(call: Call, params: SubmitParams) -> dict[str, Any]:
    principal = _acting_for(call, params.principal_id)
    if params.origin is not None and is_bot_origin(params.origin):
        raise Forbidden(
            f"origins starting with {BOT_ORIGIN_PREFIX!r} are the Feishu bot's conversations; "
            "leave origin out or choose another"
        )
    if params.cwd is not None and not call.actor.principal.is_owner:
        # A directory of the caller's choosing would be bound into the Agent's sandbox.
        raise Forbidden("only the owner may choose an Agent's working directory")
    if params.cwd is not None and not params.cwd.startswith("/"):
        # Whether it exists is the worker's to say: it may run on another host.
        raise InvalidArgument(f"cwd {params.cwd!r} is not an absolute path")
    if params.project is not None:
        if not call.actor.principal.is_owner:
            # A project's checkouts and branches are the owner's to hand out, as its chats are.
            raise Forbidden("only the owner may start a conversation in a project")
        if params.session_id is not None or params.cwd is not None:
            raise InvalidArgument(
                "a project starts a new conversation in its own checkout: "
                "leave out session_id and cwd"
            )
    if params.session_id is not None:
        # Someone else's conversation answers as an unknown one; the service and the owner,
        # who see every Session, hear below that it belongs to someone else.
        _visible_session(call, params.session_id)
    execution, session = await call.hub.executions.submit(
        principal_id=principal.id,
        submitted_by=call.actor.principal.id,
        provider=params.provider,
        prompt=params.prompt,
        cwd=params.cwd,
        session_id=params.session_id,
        origin=params.origin,
        project=params.project,
    )
    return {"execution": execution.to_wire(), "session": session.to_wire()}


class WatchParams(Params):
    execution_id: str = text_field(ID_CHARS)
    after: int = Field(0, ge=0, description="a non-negative integer")
    wait_seconds: WaitSeconds = wait_field()


async def executions_watch(call: Call, params: WatchParams) -> dict[str, Any]:
    execution_id = params.execution_id
    _visible_execution(call, execution_id)
    watched = await call.hub.executions.watch(execution_id, params.after, params.wait_seconds)
    return watched.to_wire()


class ExecutionParams(Params):
    execution_id: str = text_field(ID_CHARS)


async def executions_cancel(call: Call, params: ExecutionParams) -> dict[str, Any]:
    _visible_execution(call, params.execution_id)
    cancelled = await call.hub.executions.cancel(params.execution_id, call.actor.principal.id)
    return cancelled.to_wire()


class SessionParams(Params):
    session_id: str = text_field(ID_CHARS)


async def sessions_get(call: Call, params: SessionParams) -> dict[str, Any]:
    return _visible_session(call, params.session_id).to_wire()


class RegisterParams(Params):
    name: str = text_field(128)


async def workers_register(call: Call, params: RegisterParams) -> dict[str, Any]:
    require_service(call.actor)
    worker_id = call.hub.executions.register_worker(params.name, call.actor.principal.id)
    return {"worker_id": worker_id, "lease_seconds": call.hub.executions.lease_seconds}


class ClaimParams(Params):
    worker_id: str = text_field(ID_CHARS)
    wait_seconds: WaitSeconds = wait_field()


async def executions_claim(call: Call, params: ClaimParams) -> dict[str, Any]:
    require_service(call.actor)
    claimed = await call.hub.executions.claim(
        params.worker_id, call.actor.principal.id, params.wait_seconds, call.connected
    )
    if claimed is None:
        return {}
    # Read as the turn starts: a change of the policy or a budget applies to turns started after.
    hub = call.hub
    row = hub.executions.db.execute(
        "SELECT runs_as FROM executions WHERE id = ?", (claimed.execution_id,)
    ).fetchone()
    budget = hub.usage.turn_budget(
        claimed.execution_id, row["runs_as"], hub.config.daily_tokens, hub.config.turn_tokens
    )
    permissions = hub.config.permissions
    source = None
    project = hub.projects.find(claimed.session.project) if claimed.session.project else None
    if project is not None:
        # A project's own policy, when it has one, is the one its conversations run under.
        permissions = project.permissions or permissions
        source = project.source_for_worker(hub.config.worktree_days)
    return dataclasses.replace(
        claimed, permissions=permissions, budget=budget, project=source
    ).to_wire()


class LeaseParams(Params):
    execution_id: str = text_field(ID_CHARS)
    worker_id: str = text_field(ID_CHARS)


class HeartbeatParams(LeaseParams):
    # What the turn's model gateway has counted so far; absent from a worker without one.
    used_tokens: int | None = Field(
        None, ge=0, le=usage.MAX_FIGURE, description=f"an integer from 0 to {usage.MAX_FIGURE}"
    )
    # How long the beat may wait for a cancel before answering (0: answer at once).
    wait_seconds: WaitSeconds = wait_field()


async def executions_heartbeat(call: Call, params: HeartbeatParams) -> dict[str, Any]:
    require_service(call.actor)
    hub = call.hub
    cancel = await hub.executions.heartbeat(
        params.execution_id, params.worker_id, params.wait_seconds
    )
    answer: dict[str, Any] = {"cancel_requested": cancel}
    if params.used_tokens is not None:
        row = hub.executions.db.execute(
            "SELECT runs_as FROM executions WHERE id = ?", (params.execution_id,)
        ).fetchone()
        # The turn's whole allowance as of now: its Principal's other running turns have
        # spent part of the same day since it was claimed, or the owner extended it.
        answer["budget"] = hub.usage.turn_budget(
            params.execution_id,
            row["runs_as"],
            hub.config.daily_tokens,
            hub.config.turn_tokens,
            params.used_tokens,
        )
    return answer


class EventParams(LeaseParams):
    kind: str = text_field(32)
    text: str = text_field(PROMPT_CHARS)


async def executions_event(call: Call, params: EventParams) -> dict[str, Any]:
    require_service(call.actor)
    p = params
    seq = await call.hub.executions.add_event(p.execution_id, p.worker_id, p.kind, p.text)
    return {"seq": seq}


class CompleteParams(LeaseParams):
    succeeded: bool = Field(description="true or false")
    result: dict[str, Any] | None = Field(None, description="an object")
    error: str | None = text_field(16384, None)
    native_id: str | None = text_field(256, None)


async def executions_complete(call: Call, params: CompleteParams) -> dict[str, Any]:
    require_service(call.actor)
    outcome = TurnOutcome(
        succeeded=params.succeeded,
        result=TurnResult.from_wire(params.result) if params.result is not None else None,
        error=params.error,
        native_id=params.native_id,
    )
    completed = await call.hub.executions.complete(params.execution_id, params.worker_id, outcome)
    call.hub.usage.finished(params.execution_id)
    return completed.to_wire()


class MemoryParams(SessionParams):
    capable: bool = Field(True, description="true or false")
    # The turn this launch runs, so the memory changes its credential makes name it.
    execution_id: str | None = text_field(ID_CHARS, None)


async def sessions_memory(call: Call, params: MemoryParams) -> dict[str, Any]:
    """Freeze a fresh Session's binding, or reuse the frozen one, and delegate a credential.

    A bound Session gets its credential even when memory is now off or the policy changed: its
    Agent keeps the protocol, and its data calls fail with the Hub's reason instead of falling
    back to some other memory.
    """
    require_service(call.actor)
    hub = call.hub
    session, warning = hub.executions.freeze_memory(
        params.session_id,
        enabled=hub.config.memory_enabled,
        isolation=hub.config.isolation,
        capable=params.capable,
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
            _runs_as(hub, session, params.execution_id),
            "delegated",
            binding=session.binding,
            label=delegation_label(session.id),
            expires_at=time.time() + hub.settings.delegated_credential_seconds,
            issued_by=call.actor.principal.id,
        )
        hub.state.record_launch(credential.id, session.id, params.execution_id)
        answer["token"] = token
        answer["credential_id"] = credential.id
    return answer


def _runs_as(hub: Hub, session: Session, execution_id: str | None) -> str:
    """Whom a launch's credential is for: in a shared conversation (a group topic) the sender
    of the turn, when the turn is one of this Session's; else the Session's Principal. A bound
    group's conversation is its project's service Principal's, and so is its memory: its
    credential is that Principal's, whoever sent the turn."""
    if session.workspace is not None and session.project is None and execution_id is not None:
        with contextlib.suppress(NotFound):
            execution = hub.executions.describe(execution_id)
            if execution.session_id == session.id and execution.submitted_by:
                return execution.submitted_by
    return session.principal_id


async def sessions_unbind(call: Call, params: SessionParams) -> dict[str, Any]:
    """A launch whose memory discovery failed: the Session stays without memory for good."""
    require_service(call.actor)
    call.hub.executions.mark_unbound(params.session_id)
    return call.hub.executions.session(params.session_id).to_wire()


class AskParams(LeaseParams):
    tool: str = text_field(128)
    action: Literal["command", "edit", "tool"] = Field(description="command, edit or tool")
    subject: str = text_field(MAX_SUBJECT_CHARS)
    detail: str = text_field(MAX_DETAIL_CHARS, "")


async def executions_ask(call: Call, params: AskParams) -> dict[str, Any]:
    """A running turn's permission request; settled at once when a session rule allows it."""
    require_service(call.actor)
    p = params
    approval = await call.hub.approvals.ask(
        p.execution_id,
        p.worker_id,
        tool=p.tool,
        action=p.action,
        subject=p.subject,
        detail=p.detail,
    )
    return approval.to_wire()


class DecisionParams(LeaseParams):
    request_id: str = text_field(ID_CHARS)
    wait_seconds: WaitSeconds = wait_field()


async def executions_decision(call: Call, params: DecisionParams) -> dict[str, Any]:
    """The request once answered (or denied at its timeout); pending after ``wait_seconds``."""
    require_service(call.actor)
    p = params
    approval = await call.hub.approvals.decision(
        p.execution_id, p.worker_id, p.request_id, p.wait_seconds
    )
    return approval.to_wire()


class ApproveParams(ExecutionParams):
    request_id: str = text_field(ID_CHARS)
    decision: Literal["allow_once", "allow_session", "deny"] = Field(
        description="allow_once, allow_session or deny"
    )
    reason: str | None = text_field(MAX_REASON_CHARS, None)
    principal_id: str | None = text_field(4096, None)


async def executions_approve(call: Call, params: ApproveParams) -> dict[str, Any]:
    """Answer a pending permission request: only the turn's Principal or the owner may."""
    _may_follow_turns(call)
    deciding = acting_for(call.actor, call.hub.state, params.principal_id)
    if params.principal_id is None:
        _visible_execution_or_turn(call, params.execution_id)
    if deciding.kind == "service":
        raise Forbidden("a permission request is answered by a person, not a service")
    approval = await call.hub.approvals.decide(
        params.execution_id, params.request_id, params.decision, deciding, params.reason
    )
    return approval.to_wire()


async def sessions_rules(call: Call, params: SessionParams) -> dict[str, Any]:
    """What "allow for this conversation" answers left in a Session: every rule for the
    service and the owner, else the caller's own."""
    _may_follow_turns(call)
    approvals = call.hub.approvals
    if _sees_every_session(call):
        call.hub.executions.session(params.session_id)
        rules = approvals.rules(params.session_id)
    else:
        _visible_session_or_turn(call, params.session_id)
        rules = approvals.rules(params.session_id, call.actor.principal.id)
    return {"rules": [rule.to_wire() for rule in rules]}


def _visible_execution_or_turn(call: Call, execution_id: str) -> None:
    """Like ``_visible_execution``, also letting a shared conversation's sender see the turn
    they sent (it runs as them).

    Raises: NotFound: no such execution, or neither theirs nor a turn that runs as them.
    """
    try:
        _visible_execution(call, execution_id)
    except NotFound:
        row = call.hub.executions.db.execute(
            "SELECT runs_as FROM executions WHERE id = ?", (execution_id,)
        ).fetchone()
        if row is None or row["runs_as"] != call.actor.principal.id:
            raise


def _visible_session_or_turn(call: Call, session_id: str) -> None:
    try:
        _visible_session(call, session_id)
    except NotFound:
        row = call.hub.executions.db.execute(
            "SELECT 1 FROM executions WHERE session_id = ? AND runs_as = ? LIMIT 1",
            (session_id, call.actor.principal.id),
        ).fetchone()
        if row is None:
            raise


EXECUTION_METHODS: Methods = MappingProxyType(
    {
        "executions.submit": Method(SubmitParams, executions_submit),
        "executions.watch": Method(WatchParams, executions_watch),
        "executions.cancel": Method(ExecutionParams, executions_cancel),
        "sessions.get": Method(SessionParams, sessions_get),
        "workers.register": Method(RegisterParams, workers_register),
        "executions.claim": Method(ClaimParams, executions_claim),
        "executions.heartbeat": Method(HeartbeatParams, executions_heartbeat),
        "executions.event": Method(EventParams, executions_event),
        "executions.complete": Method(CompleteParams, executions_complete),
        "sessions.memory": Method(MemoryParams, sessions_memory),
        "sessions.unbind": Method(SessionParams, sessions_unbind),
        "executions.ask": Method(AskParams, executions_ask),
        "executions.decision": Method(DecisionParams, executions_decision),
        "executions.approve": Method(ApproveParams, executions_approve),
        "sessions.rules": Method(SessionParams, sessions_rules),
    }
)
