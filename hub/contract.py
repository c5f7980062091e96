"""The execution contract: what the Hub, its Runtime workers, the bot and the CLI exchange about
Agent turns. Pure data, one ``to_wire`` / ``from_wire`` each, so every side reads the same
fields by name and mypy sees the whole flow.

    submit  →  Execution (+ Session)            the bot, ``amux agent run``
    claim   →  Claim (Execution id, prompt, Session, lease)       a worker
    event   →  ExecutionEvent (progress, warning, status)          a worker, then watchers
            ExecutionEvent (memory: MemoryUse)                      the Hub, on a turn's memory call
    complete ← Outcome (succeeded, TurnResult, error, native id)   a worker
    watch   →  WatchResult (Execution + its new events)            the bot, ``amux agent run``

The wire shapes are the Hub RPC's public JSON; ``from_wire`` rejects an answer that lacks a
field instead of letting a ``KeyError`` surface far from the call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hub.errors import InvalidArgument

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "queued",
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
FINISHED = frozenset({SUCCEEDED, FAILED, CANCELLED})

# The Feishu bot keys a topic's conversation as ``feishu:<chat>:<root message>`` (``#N`` after
# the Nth "New conversation"; see ``bot.conversations``), and its next message continues
# whichever Session holds that origin. The bot queues its turns in the Hub's own process, so
# no RPC caller has a reason to name one; one that did would own the topic's next conversation.
BOT_ORIGIN_PREFIX = "feishu:"


def is_bot_origin(origin: str) -> bool:
    """Whether ``origin`` is in the bot's namespace (in any case, around any spaces)."""
    return origin.strip().lower().startswith(BOT_ORIGIN_PREFIX)


def _field(wire: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = wire.get(name)
    if not isinstance(value, kind):
        raise InvalidArgument(f"malformed execution data: {name} is missing or of the wrong type")
    return value


def _optional(wire: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = wire.get(name)
    return value if isinstance(value, kind) else None


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
        )


@dataclass(frozen=True)
class TurnResult:
    """What a finished turn produced: the answer and what the user should know about it."""

    text: str | None = None
    provider: str | None = None
    binding: str | None = None
    warnings: tuple[str, ...] = ()
    usage: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "usage": dict(self.usage),
            "warnings": list(self.warnings),
            "binding": self.binding,
            "provider": self.provider,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> TurnResult:
        warnings = wire.get("warnings")
        usage = wire.get("usage")
        return cls(
            text=_optional(wire, "text", str),
            provider=_optional(wire, "provider", str),
            binding=_optional(wire, "binding", str),
            warnings=tuple(str(w) for w in warnings) if isinstance(warnings, list) else (),
            usage=dict(usage) if isinstance(usage, Mapping) else {},
        )


@dataclass(frozen=True)
class Execution:
    """One Agent turn in the Hub's queue."""

    id: str
    session_id: str
    state: str
    attempts: int
    result: TurnResult | None
    error: str | None
    submitted_by: str | None

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
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Execution:
        result = wire.get("result")
        return cls(
            id=_field(wire, "id", str),
            session_id=_field(wire, "session_id", str),
            state=_field(wire, "state", str),
            attempts=int(_field(wire, "attempts", int)),
            result=TurnResult.from_wire(result) if isinstance(result, Mapping) else None,
            error=_optional(wire, "error", str),
            submitted_by=_optional(wire, "submitted_by", str),
        )


# The kinds of ExecutionEvent: a worker reports the first three; the Hub adds ``memory`` when the
# turn's delegated credential reads or changes memory.
PROGRESS, WARNING, STATUS, MEMORY = "progress", "warning", "status", "memory"
MEMORY_OPS = ("read", "searched", "saved", "forgot")


@dataclass(frozen=True)
class MemoryUse:
    """One memory call of a turn: ``op`` (read, searched, saved, forgot), the document path (a
    search's path prefix, possibly empty), the revision it read or left (None for a search or a
    forget) and, for a change, the revision before it (None when it created the document): what
    an undo goes back to."""

    op: str
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
        op = _field(wire, "op", str)
        if op not in MEMORY_OPS:
            raise InvalidArgument(f"malformed execution data: unknown memory op {op!r}")
        return cls(
            op,
            _field(wire, "path", str),
            _optional(wire, "revision", str),
            _optional(wire, "previous_revision", str),
        )


@dataclass(frozen=True)
class ExecutionEvent:
    """Something a turn reported while it ran: ``progress``, ``warning``, ``status`` or
    ``memory`` (its text a ``MemoryUse`` as JSON; see ``memory_use``)."""

    seq: int
    kind: str
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

    def to_wire(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "text": self.text, "at": self.at}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ExecutionEvent:
        return cls(
            seq=int(_field(wire, "seq", int)),
            kind=_field(wire, "kind", str),
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

    def to_wire(self) -> dict[str, Any]:
        return {
            "execution": {
                "id": self.execution_id,
                "prompt": self.prompt,
                "request_id": self.request_id,
                "attempt": self.attempt,
            },
            "session": self.session.to_wire(),
            "lease_seconds": self.lease_seconds,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Claim:
        execution = _field(wire, "execution", Mapping)
        return cls(
            execution_id=_field(execution, "id", str),
            prompt=_field(execution, "prompt", str),
            attempt=int(_field(execution, "attempt", int)),
            session=Session.from_wire(_field(wire, "session", Mapping)),
            lease_seconds=float(_field(wire, "lease_seconds", (int, float))),
            request_id=_optional(execution, "request_id", str),
        )


@dataclass(frozen=True)
class Outcome:
    """How a worker's launch of a turn ended, as it reports it with ``executions.complete``."""

    succeeded: bool
    result: TurnResult | None
    error: str | None = None
    native_id: str | None = None
