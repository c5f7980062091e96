"""The execution contract: what the Hub, its Runtime workers, the bot and the CLI exchange about
Agent turns. Pure data, one ``to_wire`` / ``from_wire`` each, so every side reads the same
fields by name and mypy sees the whole flow.

    submit  →  Execution (+ Session)            the bot, ``amux agent run``
    claim   →  Claim (Execution id, prompt, Session, lease)       a worker
    event   →  ExecutionEvent (progress, warning, status)          a worker, then watchers
            ExecutionEvent (memory: MemoryUse)                      the Hub, on a turn's memory call
    complete ← TurnOutcome (succeeded, TurnResult, error, native id)   a worker
    watch   →  WatchResult (Execution + its new events)            the bot, ``amux agent run``
    usage   →  UsageReport (UsageRow per Principal, day, provider)  ``amux usage``

The wire shapes are the Hub RPC's public JSON; ``from_wire`` rejects an answer that lacks a
field instead of letting a ``KeyError`` surface far from the call.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, TypeVar, get_args

from hub.errors import InvalidArgument

T = TypeVar("T")

ExecutionState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
QUEUED: Final = "queued"
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
EXECUTION_STATES: tuple[ExecutionState, ...] = get_args(ExecutionState)
FINISHED: frozenset[ExecutionState] = frozenset({SUCCEEDED, FAILED, CANCELLED})

# The Feishu bot keys a topic's conversation as ``feishu:<chat>:<root message>`` (``#N`` after
# the Nth "New conversation"; see ``bot.conversations``), and its next message continues
# whichever Session holds that origin. The bot queues its turns in the Hub's own process, so
# no RPC caller has a reason to name one; one that did would own the topic's next conversation.
BOT_ORIGIN_PREFIX = "feishu:"

# What may name an Agent provider: a worker's declared providers and every submitted turn's.
# It becomes part of an environment variable's name (AMUX_RUNTIME_<NAME>) and of paths.
PROVIDER_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")


def provider_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a provider, in one line; None when it can."""
    if PROVIDER_NAME.fullmatch(name):
        return None
    return (
        f"{name!r} is not a provider name: up to 32 of a-z, 0-9 and -, starting with a letter, "
        "such as claude, codex or pi"
    )


def is_bot_origin(origin: str) -> bool:
    """Whether ``origin`` is in the bot's namespace (in any case, around any spaces)."""
    return origin.strip().lower().startswith(BOT_ORIGIN_PREFIX)


def _field(wire: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = wire.get(name)
    if not isinstance(value, kind):
        raise InvalidArgument(f"malformed execution data: {name} is missing or of the wrong type")
    return value


def _known(wire: Mapping[str, Any], name: str, allowed: tuple[T, ...]) -> T:
    """The field's value as one of ``allowed`` (the members of a ``Literal``), typed as such."""
    value = _field(wire, name, str)
    for each in allowed:
        if each == value:
            return each
    raise InvalidArgument(f"malformed execution data: unknown {name} {value!r}")


def _optional(wire: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = wire.get(name)
    return value if isinstance(value, kind) else None


ProjectKind = Literal["path", "remote"]
PROJECT_KINDS: tuple[ProjectKind, ...] = get_args(ProjectKind)
# How long a conversation's checkout may go unused before a worker removes it (its branch stays).
DEFAULT_WORKTREE_DAYS = 14


@dataclass(frozen=True)
class ProjectSource:
    """Where a project's conversations check out from, as a worker needs it."""

    name: str
    kind: ProjectKind
    # The absolute path of a git repository on the worker's host, or a remote URL (never with
    # credentials in it).
    source: str
    default_branch: str
    # A variable of the WORKER's environment holding the remote's token; the value is never
    # sent to or stored by the Hub.
    credential_env: str | None = None
    worktree_days: int = DEFAULT_WORKTREE_DAYS

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "source": self.source,
            "default_branch": self.default_branch,
            "credential_env": self.credential_env,
            "worktree_days": self.worktree_days,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ProjectSource:
        days = wire.get("worktree_days")
        return cls(
            name=_field(wire, "name", str),
            kind=_known(wire, "kind", PROJECT_KINDS),
            source=_field(wire, "source", str),
            default_branch=_field(wire, "default_branch", str),
            credential_env=_optional(wire, "credential_env", str),
            worktree_days=(
                days
                if isinstance(days, int) and not isinstance(days, bool) and days > 0
                else DEFAULT_WORKTREE_DAYS
            ),
        )


@dataclass(frozen=True)
class Session:
    """A conversation with one Agent: its Principal, provider and frozen memory binding."""

    id: str
    principal_id: str
    provider: str
    cwd: str | None
    origin: str | None
    native_id: str | None
    memory: str
    binding: str | None
    # A shared conversation's own workspace (a group topic's), by key; None: its Principal's.
    workspace: str | None = None
    # The project whose repository the conversation checks out (its chat's binding when the
    # Session was created, frozen); None: no project, the Principal's or the topic's workspace.
    project: str | None = None
    # The model its turns ask their Agent for (chosen with ``/model``); None: the Agent's default.
    model: str | None = None
    # The Session this one forks (a side question's, ``/btw``): its turns resume a copy of that
    # Session's native one, in that Session's home, and leave it as it was.
    fork_of: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "principal_id": self.principal_id,
            "provider": self.provider,
            "cwd": self.cwd,
            "origin": self.origin,
            "native_id": self.native_id,
            "memory": self.memory,
            "binding": self.binding,
            "workspace": self.workspace,
            "project": self.project,
            "model": self.model,
            "fork_of": self.fork_of,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Session:
        return cls(
            id=_field(wire, "id", str),
            principal_id=_field(wire, "principal_id", str),
            provider=_field(wire, "provider", str),
            cwd=_optional(wire, "cwd", str),
            origin=_optional(wire, "origin", str),
            native_id=_optional(wire, "native_id", str),
            memory=_field(wire, "memory", str),
            binding=_optional(wire, "binding", str),
            workspace=_optional(wire, "workspace", str),
            project=_optional(wire, "project", str),
            model=_optional(wire, "model", str),
            fork_of=_optional(wire, "fork_of", str),
        )


# What a project turn's result carries of its branch at most: files listed, bytes of diff.
BRANCH_FILES_MAX = 50
BRANCH_DIFF_MAX = 256 * 1024


@dataclass(frozen=True)
class ChangedFile:
    """One file a project turn's branch changed against its base; None counts: a binary file,
    or one ``too_large`` to be diffed (over 1 MiB on either side), whose content was never read."""

    path: str
    added: int | None
    removed: int | None
    too_large: bool = False

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"path": self.path, "added": self.added, "removed": self.removed}
        if self.too_large:
            wire["too_large"] = True
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ChangedFile:
        return cls(
            path=_field(wire, "path", str),
            added=_count(wire, "added"),
            removed=_count(wire, "removed"),
            too_large=wire.get("too_large") is True,
        )


def _count(wire: Mapping[str, Any], name: str) -> int | None:
    value = wire.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class BranchWork:
    """What a project turn left on its conversation's branch."""

    project: str
    branch: str  # amux/<short conversation id>
    base: str  # the default branch it started from
    commit: str | None  # the branch's head after the turn
    files: tuple[ChangedFile, ...]  # against base, at most BRANCH_FILES_MAX
    files_total: int
    diff: str | None  # unified diff against base, at most BRANCH_DIFF_MAX bytes
    diff_truncated: bool

    def to_wire(self) -> dict[str, Any]:
        return {
            "project": self.project,
            "branch": self.branch,
            "base": self.base,
            "commit": self.commit,
            "files": [f.to_wire() for f in self.files],
            "files_total": self.files_total,
            "diff": self.diff,
            "diff_truncated": self.diff_truncated,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> BranchWork:
        files = wire.get("files")
        listed = tuple(
            ChangedFile.from_wire(f)
            for f in (files if isinstance(files, list) else [])
            if isinstance(f, Mapping)
        )
        total = _count(wire, "files_total")
        return cls(
            project=_field(wire, "project", str),
            branch=_field(wire, "branch", str),
            base=_field(wire, "base", str),
            commit=_optional(wire, "commit", str),
            files=listed,
            files_total=total if total is not None else len(listed),
            diff=_optional(wire, "diff", str),
            diff_truncated=wire.get("diff_truncated") is True,
        )


@dataclass(frozen=True)
class TurnResult:
    """What a finished turn produced: the answer and what the user should know about it."""

    text: str | None = None
    provider: str | None = None
    binding: str | None = None
    warnings: tuple[str, ...] = ()
    usage: Mapping[str, Any] = field(default_factory=dict)
    # The tokens the turn was allowed (its Claim's budget), and whether its model requests
    # reached them, so the gateway refused the rest.
    budget: int | None = None
    budget_reached: bool = False
    # A project turn's branch: what it changed there; None for every other turn.
    branch: BranchWork | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "text": self.text,
            "usage": dict(self.usage),
            "warnings": list(self.warnings),
            "binding": self.binding,
            "provider": self.provider,
        }
        if self.budget is not None:
            wire["budget"] = self.budget
        if self.budget_reached:
            wire["budget_reached"] = True
        if self.branch is not None:
            wire["branch"] = self.branch.to_wire()
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> TurnResult:
        warnings = wire.get("warnings")
        usage = wire.get("usage")
        budget = wire.get("budget")
        branch = wire.get("branch")
        return cls(
            text=_optional(wire, "text", str),
            provider=_optional(wire, "provider", str),
            binding=_optional(wire, "binding", str),
            warnings=tuple(str(w) for w in warnings) if isinstance(warnings, list) else (),
            usage=dict(usage) if isinstance(usage, Mapping) else {},
            budget=budget if isinstance(budget, int) and not isinstance(budget, bool) else None,
            budget_reached=wire.get("budget_reached") is True,
            branch=BranchWork.from_wire(branch) if isinstance(branch, Mapping) else None,
        )


@dataclass(frozen=True)
class Execution:
    """One Agent turn in the Hub's queue."""

    id: str
    session_id: str
    state: ExecutionState
    attempts: int
    result: TurnResult | None
    error: str | None
    submitted_by: str | None
    # Whose Stop cancelled it (a Principal id); None when nobody's did.
    cancelled_by: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session_id": self.session_id,
            "state": self.state,
            "attempts": self.attempts,
            "result": self.result.to_wire() if self.result is not None else None,
            "error": self.error,
            "submitted_by": self.submitted_by,
            "cancelled_by": self.cancelled_by,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Execution:
        result = wire.get("result")
        return cls(
            id=_field(wire, "id", str),
            session_id=_field(wire, "session_id", str),
            state=_known(wire, "state", EXECUTION_STATES),
            attempts=int(_field(wire, "attempts", int)),
            result=TurnResult.from_wire(result) if isinstance(result, Mapping) else None,
            error=_optional(wire, "error", str),
            submitted_by=_optional(wire, "submitted_by", str),
            cancelled_by=_optional(wire, "cancelled_by", str),
        )


# The kinds of ExecutionEvent: a worker reports progress, warning, status, egress (a network
# host its Agent was refused) and plan (the Agent's checklist as it now stands, as JSON: a list of
# {"step", "status"} with status pending, in_progress or completed) and step (one tool call, as
# JSON: {"action", "subject"}, action read, edit, run, search or tool); the Hub adds ``memory``
# when the turn's delegated credential reads or changes memory.
EventKind = Literal["progress", "warning", "status", "memory", "approval", "egress", "plan", "step"]
PROGRESS: Final = "progress"
WARNING: Final = "warning"
STATUS: Final = "status"
MEMORY: Final = "memory"
APPROVAL: Final = "approval"
EGRESS: Final = "egress"
PLAN: Final = "plan"
STEP: Final = "step"
STEP_ACTIONS = ("read", "edit", "run", "search", "tool", "compact")
PLAN_STATUSES = ("pending", "in_progress", "completed")
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)
WORKER_EVENT_KINDS = frozenset({PROGRESS, WARNING, STATUS, EGRESS, PLAN, STEP})
MemoryOp = Literal["read", "searched", "saved", "forgot"]
MEMORY_OPS: tuple[MemoryOp, ...] = get_args(MemoryOp)


@dataclass(frozen=True)
class MemoryUse:
    """One memory call of a turn: ``op`` (read, searched, saved, forgot), the document path (a
    search's path prefix, possibly empty), the revision it read or left (None for a search or a
    forget) and, for a change, the revision before it (None when it created the document): what
    an undo goes back to."""

    op: MemoryOp
    path: str
    revision: str | None = None
    previous_revision: str | None = None

    @property
    def changed(self) -> bool:
        return self.op in ("saved", "forgot")

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"op": self.op, "path": self.path, "revision": self.revision}
        if self.changed:
            wire["previous_revision"] = self.previous_revision
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> MemoryUse:
        return cls(
            _known(wire, "op", MEMORY_OPS),
            _field(wire, "path", str),
            _optional(wire, "revision", str),
            _optional(wire, "previous_revision", str),
        )


@dataclass(frozen=True)
class ExecutionEvent:
    """Something a turn reported while it ran: ``progress``, ``warning``, ``status``,
    ``memory`` (its text a ``MemoryUse`` as JSON; see ``memory_use``) or ``approval`` (a
    permission request as JSON, pending or settled; see ``approval``)."""

    seq: int
    kind: EventKind
    text: str
    at: float

    def memory_use(self) -> MemoryUse | None:
        """The memory call a ``memory`` event records; None for any other kind (or a malformed
        one, which a watcher skips rather than fail the turn over)."""
        if self.kind != MEMORY:
            return None
        try:
            wire = json.loads(self.text)
            return MemoryUse.from_wire(wire) if isinstance(wire, Mapping) else None
        except (ValueError, InvalidArgument):
            return None

    def plan_steps(self) -> tuple[tuple[str, str], ...] | None:
        """The checklist a ``plan`` event records, as (step, status) pairs; None for any other
        kind (or a malformed one, which a watcher skips rather than fail the turn over)."""
        if self.kind != PLAN:
            return None
        try:
            wire = json.loads(self.text)
        except ValueError:
            return None
        if not isinstance(wire, list):
            return None
        steps = []
        for item in wire:
            if not isinstance(item, Mapping):
                return None
            step, status = item.get("step"), item.get("status")
            if not isinstance(step, str) or status not in PLAN_STATUSES:
                return None
            steps.append((step, str(status)))
        return tuple(steps)

    def tool_step(self) -> tuple[str, str] | None:
        """The (action, subject) a ``step`` event records; None for any other kind (or a
        malformed one)."""
        if self.kind != STEP:
            return None
        try:
            wire = json.loads(self.text)
        except ValueError:
            return None
        if not isinstance(wire, Mapping):
            return None
        action, subject = wire.get("action"), wire.get("subject")
        if action not in STEP_ACTIONS or not isinstance(subject, str):
            return None
        return str(action), subject

    def approval(self) -> Approval | None:
        """The permission request an ``approval`` event records, as it stood then; None for
        any other kind (or a malformed one)."""
        if self.kind != APPROVAL:
            return None
        try:
            wire = json.loads(self.text)
            return Approval.from_wire(wire) if isinstance(wire, Mapping) else None
        except (ValueError, InvalidArgument):
            return None

    def to_wire(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "text": self.text, "at": self.at}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ExecutionEvent:
        return cls(
            seq=int(_field(wire, "seq", int)),
            kind=_known(wire, "kind", EVENT_KINDS),
            text=_field(wire, "text", str),
            at=float(_field(wire, "at", (int, float))),
        )


@dataclass(frozen=True)
class WatchResult:
    """A turn as it stands, with the events after the watcher's last one."""

    execution: Execution
    events: tuple[ExecutionEvent, ...]

    def to_wire(self) -> dict[str, Any]:
        return {**self.execution.to_wire(), "events": [e.to_wire() for e in self.events]}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> WatchResult:
        events = wire.get("events")
        return cls(
            execution=Execution.from_wire(wire),
            events=tuple(
                ExecutionEvent.from_wire(e) for e in (events if isinstance(events, list) else [])
            ),
        )

    @property
    def last_seq(self) -> int:
        return max((e.seq for e in self.events), default=0)


@dataclass(frozen=True)
class Claim:
    """A turn leased to one worker: what to run, for whom, and how long the lease lasts."""

    execution_id: str
    prompt: str
    attempt: int
    session: Session
    lease_seconds: float
    request_id: str | None = None
    # The permission policy the turn runs under (``agents.permissions`` when it was claimed).
    permissions: str = "ask"
    # Tokens the turn may use (the per-turn ceiling or what is left of its Principal's day,
    # whichever is lower); None when no budget is set.
    budget: int | None = None
    # The Session's project as the worker checks it out; None when the Session has none.
    project: ProjectSource | None = None
    # The worker that held the project Session's checkout when this claim took the Session
    # from it (that worker was gone): the claiming worker makes the checkout again from the
    # conversation's branch. None when the Session stays where it was.
    moved_from: str | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "execution": {
                "id": self.execution_id,
                "prompt": self.prompt,
                "request_id": self.request_id,
                "attempt": self.attempt,
            },
            "session": self.session.to_wire(),
            "lease_seconds": self.lease_seconds,
            "permissions": self.permissions,
        }
        if self.budget is not None:
            wire["budget"] = self.budget
        if self.project is not None:
            wire["project"] = self.project.to_wire()
        if self.moved_from is not None:
            wire["moved_from"] = self.moved_from
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Claim:
        budget = wire.get("budget")
        project = wire.get("project")
        execution = _field(wire, "execution", Mapping)
        return cls(
            execution_id=_field(execution, "id", str),
            prompt=_field(execution, "prompt", str),
            attempt=int(_field(execution, "attempt", int)),
            session=Session.from_wire(_field(wire, "session", Mapping)),
            lease_seconds=float(_field(wire, "lease_seconds", (int, float))),
            request_id=_optional(execution, "request_id", str),
            permissions=_optional(wire, "permissions", str) or "ask",
            budget=budget if isinstance(budget, int) and not isinstance(budget, bool) else None,
            project=ProjectSource.from_wire(project) if isinstance(project, Mapping) else None,
            moved_from=_optional(wire, "moved_from", str),
        )


@dataclass(frozen=True)
class TurnOutcome:
    """How a worker's launch of a turn ended, as it reports it with ``executions.complete``."""

    succeeded: bool
    result: TurnResult | None
    error: str | None = None
    native_id: str | None = None


ALLOW_ONCE, ALLOW_SESSION, DENY = "allow_once", "allow_session", "deny"
DECISIONS = (ALLOW_ONCE, ALLOW_SESSION, DENY)
ACTIONS = ("command", "edit", "tool")
# How a request was settled: by a person, by a session rule, by the timeout, or lapsed with the
# run that asked (a restart or a lost worker).
BY_PERSON, BY_RULE, BY_TIMEOUT, LAPSED = "person", "rule", "timeout", "lapsed"
# The longest command (or path list) a permission request carries, and the longest detail (an
# edit's diff or new content, a tool's input): stored, shown and matched whole. A longer one is
# denied without asking anyone, never cut: a cut one would be allowed for what a person saw and
# run with what they did not.
MAX_SUBJECT_CHARS = 64 * 1024
MAX_DETAIL_CHARS = 64 * 1024
# What an Agent is told to do instead, by what it asked to do.
_SMALLER = {
    "command": "put the command in a script file and run that",
    "edit": "make the change in smaller edits",
}


def too_long(chars: int, action: str = "command") -> str:
    """Why a request of ``chars`` characters was denied without asking (for the Agent too)."""
    return (
        f"denied without asking anyone: this request is {chars:,} characters long, more than "
        f"the {MAX_SUBJECT_CHARS:,} amux shows a person whole; "
        + _SMALLER.get(action, "give the tool a smaller input")
    )


@dataclass(frozen=True)
class Approval:
    """One permission request and, once settled, its decision."""

    execution_id: str
    request_id: str
    runs_as: str
    tool: str
    action: str
    subject: str
    detail: str
    asked_at: float
    expires_at: float
    decision: str | None = None
    via: str | None = None
    decided_by: str | None = None
    decided_by_name: str | None = None
    decided_at: float | None = None
    reason: str | None = None

    @property
    def pending(self) -> bool:
        return self.decision is None

    @property
    def allowed(self) -> bool:
        return self.decision in (ALLOW_ONCE, ALLOW_SESSION)

    def message(self) -> str:
        """What the Agent is told with the decision."""
        if self.allowed:
            if self.via == BY_RULE:
                return "allowed by a rule of this conversation"
            return f"allowed by {self.decided_by_name or 'its user'}"
        if self.via == BY_TIMEOUT:
            return self.reason or "nobody answered in time; denied"
        if self.via == LAPSED:
            return "the request lapsed when the turn was handed back; denied"
        said = f"denied by {self.decided_by_name or 'its user'}"
        return f"{said}: {self.reason}" if self.reason else said

    def to_wire(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "request_id": self.request_id,
            "runs_as": self.runs_as,
            "tool": self.tool,
            "action": self.action,
            "subject": self.subject,
            "detail": self.detail,
            "asked_at": self.asked_at,
            "expires_at": self.expires_at,
            "decision": self.decision,
            "via": self.via,
            "decided_by": self.decided_by,
            "decided_by_name": self.decided_by_name,
            "decided_at": self.decided_at,
            "reason": self.reason,
            "message": self.message() if self.decision else None,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Approval:
        def text(name: str) -> str:
            value = wire.get(name)
            if not isinstance(value, str):
                raise InvalidArgument(f"malformed approval: {name} is missing")
            return value

        def optional(name: str, kind: type | tuple[type, ...] = str) -> Any:
            value = wire.get(name)
            return value if isinstance(value, kind) else None

        return cls(
            execution_id=text("execution_id"),
            request_id=text("request_id"),
            runs_as=text("runs_as"),
            tool=text("tool"),
            action=text("action"),
            subject=text("subject"),
            detail=text("detail"),
            asked_at=float(optional("asked_at", (int, float)) or 0.0),
            expires_at=float(optional("expires_at", (int, float)) or 0.0),
            decision=optional("decision"),
            via=optional("via"),
            decided_by=optional("decided_by"),
            decided_by_name=optional("decided_by_name"),
            decided_at=optional("decided_at", (int, float)),
            reason=optional("reason"),
        )


@dataclass(frozen=True)
class UsageRow:
    """What the model gateway counted for one Principal's turns on one UTC day with one
    provider. ``day`` is an ISO 8601 date (2026-12-02); ``principal`` the Principal's name."""

    day: str
    principal_id: str
    principal: str
    provider: str
    input_tokens: int
    output_tokens: int
    requests: int
    turns: int

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> UsageRow:
        return cls(
            day=_field(wire, "day", str),
            principal_id=_field(wire, "principal_id", str),
            principal=_field(wire, "principal", str),
            provider=_field(wire, "provider", str),
            input_tokens=int(_field(wire, "input_tokens", int)),
            output_tokens=int(_field(wire, "output_tokens", int)),
            requests=int(_field(wire, "requests", int)),
            turns=int(_field(wire, "turns", int)),
        )


@dataclass(frozen=True)
class UsageReport:
    """Usage from ``since`` to ``until`` (UTC days, both included), newest day first."""

    since: str
    until: str
    rows: tuple[UsageRow, ...]

    def total(self, figure: str) -> int:
        """One figure (``input_tokens``, ``output_tokens``, ``requests``, ``turns``) summed."""
        return sum(int(getattr(row, figure)) for row in self.rows)

    def to_wire(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "until": self.until,
            "rows": [row.to_wire() for row in self.rows],
            "total": {figure: self.total(figure) for figure in USAGE_FIGURES},
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> UsageReport:
        rows = _field(wire, "rows", list)
        return cls(
            since=_field(wire, "since", str),
            until=_field(wire, "until", str),
            rows=tuple(UsageRow.from_wire(row) for row in rows if isinstance(row, Mapping)),
        )


USAGE_FIGURES = ("input_tokens", "output_tokens", "requests", "turns")
# How many UTC days a usage report spans unless asked (``usage.report`` ``days``), and at most.
DEFAULT_DAYS = 7
MAX_DAYS = 366


# Characters that change how the text around them looks instead of showing themselves: controls
# (Cc: ESC, CR, BS, C0 and C1), formats (Cf: bidi overrides and isolates, zero-width spaces and
# joiners, the BOM), line and paragraph separators, lone surrogates and unassigned code points.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"})
# Kept as they are: a command's own line breaks and indentation move nothing else on the screen.
_SHOWN_AS_IS = frozenset("\n\t")


def _escape_char(ch: str) -> str:
    point = ord(ch)
    if point <= 0xFF:
        return f"\\x{point:02x}"
    if point <= 0xFFFF:
        return f"\\u{point:04x}"
    return f"\\U{point:08x}"


def visible(text: str) -> str:
    """``text`` with every character that could hide or rearrange what is shown written as an
    escape (``\\x1b``, ``\\u202e``), for a person judging it on a card, a terminal or in a log
    (pure).

    An Agent's command could otherwise clear its own line with ESC or CR and redraw itself as
    something harmless, or reorder itself with a bidi override; escaped, what is shown is every
    character that will run. Backslashes are left alone, so a command's own ``\\n`` reads as
    typed; a literal ``\\x1b`` in it looks like an escape, which hides nothing.
    """
    if text.isprintable():  # the common case: nothing of the kinds escaped below
        return text
    return "".join(
        _escape_char(ch)
        if ch not in _SHOWN_AS_IS and unicodedata.category(ch) in _HIDDEN_CATEGORIES
        else ch
        for ch in text
    )
