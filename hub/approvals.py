"""Permission requests of running turns, the people's decisions on them, and session rules.

Under the ``ask`` policy an Agent's risky action (a file edit, a changing command) waits for a
decision. Its worker asks the Hub (``executions.ask``) and polls for the answer
(``executions.decision``); the turn's Principal, or the owner, answers
(``executions.approve``) with one of:

- ``allow_once``: this request only;
- ``allow_session``: this request, and from then on the same tool with the same command prefix
  or path in this Session's later turns that run as the same Principal (a rule, listed with
  ``sessions.rules``; a new conversation is a new Session and starts with none);
- ``deny``: refused, with the reason told to the Agent.

A request nobody answers within ``agents.approval_timeout`` is denied, and the Agent is told
why. A turn handed back to the queue (a restart, a lost worker) lapses its pending request: the
new run asks again. Every change of a request is an ``approval`` event of its execution, its
text the request as JSON (see ``Approval``), so ``executions.watch`` shows who decided and when.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hub.contract import (
    ACTIONS,
    ALLOW_SESSION,
    APPROVAL,
    BY_PERSON,
    BY_RULE,
    BY_TIMEOUT,
    DECISIONS,
    DENY,
    LAPSED,
    MAX_DETAIL_CHARS,
    MAX_SUBJECT_CHARS,
    WARNING,
    Approval,
    too_long,
)
from hub.errors import Conflict, Forbidden, InvalidArgument, NotFound, QuotaExceeded
from hub.state import Principal

if TYPE_CHECKING:
    from hub.executions import Executions

MAX_REASON_CHARS = 500
# What one turn may ask: requests, and UTF-8 bytes of the ``approval`` events that record them.
# Each request is recorded whole, as a row and an event or two, past the turn's bound on events
# (a dropped request would leave a person no button to answer it); an Agent holding a rule for
# one file could otherwise write it again and again, each time up to 128 KiB, without end. A
# request is let in only while its own two events (asked, settled) fit the bytes left; past
# either bound it is denied without asking, the Agent told why, and the turn goes on.
MAX_REQUESTS_PER_TURN = 500
MAX_REQUEST_BYTES_PER_TURN = 8 * 1024 * 1024
# Shell syntax after which a command is no longer "the same program with other arguments": a
# rule for ``npm test`` must not allow ``npm test; curl … | sh``.
_SHELL_CONTROL = re.compile(r"[;&|<>`$\n\\()]")


@dataclass(frozen=True)
class Rule:
    """An ``allow_session`` decision kept for a Session's later turns of one Principal."""

    session_id: str
    runs_as: str
    tool: str
    action: str
    pattern: str
    granted_by: str
    granted_at: float

    def describe(self) -> str:
        """The rule as people read it: ``…`` only where it allows more than the words shown
        (a program and subcommand with any arguments), never after a command it matches
        exactly."""
        if self.action == "command" and not self.exact:
            return f"{self.tool}: {self.pattern} …" if self.pattern else self.tool
        return f"{self.tool}: {self.pattern}"

    @property
    def exact(self) -> bool:
        """Whether only the very request it was granted for matches (see ``rule_matches``)."""
        return self.action != "command" or bool(_SHELL_CONTROL.search(self.pattern))

    def to_wire(self) -> dict[str, object]:
        return {
            "session_id": self.session_id,
            "runs_as": self.runs_as,
            "tool": self.tool,
            "action": self.action,
            "pattern": self.pattern,
            "granted_by": self.granted_by,
            "granted_at": self.granted_at,
            "description": self.describe(),
        }


def rule_pattern(action: str, subject: str) -> str:
    """What an ``allow_session`` decision on ``subject`` remembers (pure).

    A plain command is remembered by its program and, when the next word is not an option, its
    subcommand (``git status``, ``npm test``); a command with shell syntax (pipes, lists,
    redirections, substitutions) only exactly. An edit or another tool: exactly its subject.
    """
    if action != "command" or _SHELL_CONTROL.search(subject):
        return subject
    words = subject.split()
    if len(words) >= 2 and not words[1].startswith("-"):
        return " ".join(words[:2])
    return " ".join(words[:1])


def rule_matches(rule: Rule, tool: str, action: str, subject: str) -> bool:
    """Whether ``rule`` allows a request for ``subject`` (pure)."""
    if rule.tool != tool or rule.action != action:
        return False
    if rule.exact:
        return subject == rule.pattern
    if _SHELL_CONTROL.search(subject):
        return False
    normal = " ".join(subject.split())
    return normal == rule.pattern or normal.startswith(rule.pattern + " ")


def _approval(row: sqlite3.Row) -> Approval:
    return Approval(
        execution_id=row["execution_id"],
        request_id=row["request_id"],
        runs_as=row["runs_as"],
        tool=row["tool"],
        action=row["action"],
        subject=row["subject"],
        detail=row["detail"],
        asked_at=row["asked_at"],
        expires_at=row["expires_at"],
        decision=row["decision"],
        via=row["via"],
        decided_by=row["decided_by"],
        decided_by_name=row["decided_by_name"],
        decided_at=row["decided_at"],
        reason=row["reason"],
    )


def lapse_pending(db: sqlite3.Connection, execution_id: str, now: float) -> list[Approval]:
    """Settle ``execution_id``'s pending requests as lapsed, inside the caller's transaction."""
    db.execute(
        "UPDATE approvals SET decision = ?, via = ?, decided_at = ? "
        "WHERE execution_id = ? AND decision IS NULL",
        (DENY, LAPSED, now, execution_id),
    )
    rows = db.execute(
        "SELECT * FROM approvals WHERE execution_id = ? AND via = ? AND decided_at = ?",
        (execution_id, LAPSED, now),
    ).fetchall()
    return [_approval(row) for row in rows]


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def event_text(approval: Approval) -> str:
    return json.dumps(approval.to_wire(), ensure_ascii=False)


class Approvals:
    """Permission requests on the Hub's state database; waits ride the executions' wake-ups."""

    def __init__(
        self,
        executions: Executions,
        timeout_seconds: Callable[[], float],
        most_requests: int = MAX_REQUESTS_PER_TURN,
        most_bytes: int = MAX_REQUEST_BYTES_PER_TURN,
    ) -> None:
        self._executions = executions
        # A callable, so a change of ``agents.approval_timeout`` applies to the next request.
        self._timeout = timeout_seconds
        self._most_requests = most_requests
        self._most_bytes = most_bytes

    @property
    def _db(self) -> sqlite3.Connection:
        return self._executions.db

    def get(self, execution_id: str, request_id: str) -> Approval:
        """Raises: NotFound: no such request of this execution."""
        row = self._db.execute(
            "SELECT * FROM approvals WHERE execution_id = ? AND request_id = ?",
            (execution_id, request_id),
        ).fetchone()
        if row is None:
            raise NotFound(
                "no such permission request", execution_id=execution_id, request_id=request_id
            )
        return _approval(row)

    def of_execution(self, execution_id: str) -> list[Approval]:
        rows = self._db.execute(
            "SELECT * FROM approvals WHERE execution_id = ? ORDER BY asked_at, rowid",
            (execution_id,),
        ).fetchall()
        return [_approval(row) for row in rows]

    def rules(self, session_id: str, runs_as: str | None = None) -> list[Rule]:
        rows = self._db.execute(
            "SELECT * FROM session_rules WHERE session_id = ? AND (? IS NULL OR runs_as = ?) "
            "ORDER BY granted_at",
            (session_id, runs_as, runs_as),
        ).fetchall()
        return [
            Rule(
                row["session_id"],
                row["runs_as"],
                row["tool"],
                row["action"],
                row["pattern"],
                row["granted_by"],
                row["granted_at"],
            )
            for row in rows
        ]

    async def ask(
        self,
        execution_id: str,
        worker_id: str,
        *,
        tool: str,
        action: str,
        subject: str,
        detail: str,
    ) -> Approval:
        """Record a request of the turn ``worker_id`` runs; settled at once by a session rule.

        Raises:
            Conflict: the worker no longer holds the turn's lease.
            InvalidArgument: an unknown action; a subject or detail too long to show whole.
            QuotaExceeded: the turn has asked as much as it may (``limit``
                ``turn_permission_requests``); denied without asking.
        """
        if action not in ACTIONS:
            raise InvalidArgument(f"action must be one of {', '.join(ACTIONS)}")
        for part, bound in ((subject, MAX_SUBJECT_CHARS), (detail, MAX_DETAIL_CHARS)):
            if len(part) > bound:
                # Kept whole or not at all: a person allows what they were shown, all of it.
                raise InvalidArgument(too_long(len(part), action))
        executions = self._executions
        now = executions.now()
        timeout = float(self._timeout())
        # Its events as JSON (a control character takes six bytes there), with room for their
        # other fields: asked, then settled.
        size = 2 * (_bytes(json.dumps([subject, detail], ensure_ascii=False)) + 1024)

        def record(db: sqlite3.Connection) -> Approval | None:
            row = executions.lease_row(execution_id, worker_id)
            if not self._within_bounds(db, execution_id, size):
                return None
            runs_as = str(row["runs_as"])
            session_id = str(row["session_id"])
            rule = next(
                (
                    r
                    for r in self.rules(session_id, runs_as)
                    if rule_matches(r, tool, action, subject)
                ),
                None,
            )
            request_id = uuid.uuid4().hex[:16]
            decided = rule is not None
            db.execute(
                "INSERT INTO approvals (execution_id, request_id, runs_as, tool, action, subject,"
                " detail, asked_at, expires_at, decision, via, decided_by, decided_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    execution_id,
                    request_id,
                    runs_as,
                    tool[:128],
                    action,
                    subject,
                    detail,
                    now,
                    now + timeout,
                    ALLOW_SESSION if decided else None,
                    BY_RULE if decided else None,
                    rule.granted_by if rule is not None else None,
                    now if decided else None,
                ),
            )
            approval = self.get(execution_id, request_id)
            executions.insert_event(db, execution_id, APPROVAL, event_text(approval))
            return approval

        approval: Approval | None = await executions.write(record)
        await executions.changed(execution_id)
        if approval is None:
            raise QuotaExceeded(self.bound_reached(), limit="turn_permission_requests")
        return approval

    def bound_reached(self) -> str:
        """Why a request past the turn's bound was denied without asking (for the Agent too)."""
        return (
            "denied without asking anyone: this turn has reached its bound of "
            f"{self._most_requests} permission requests or {self._most_bytes / (1024 * 1024):g} "
            "MiB of their records, the most amux keeps for one turn; finish this turn, and the "
            "next one may ask again"
        )

    def _within_bounds(self, db: sqlite3.Connection, execution_id: str, size: int) -> bool:
        """Whether one more request whose events take ``size`` bytes fits the turn's bounds
        (``MAX_REQUESTS_PER_TURN``, ``MAX_REQUEST_BYTES_PER_TURN``); the first one
        that does not says so in a warning event of the turn, once, inside the caller's
        transaction."""
        (count,) = db.execute(
            "SELECT COUNT(*) FROM approvals WHERE execution_id = ?", (execution_id,)
        ).fetchone()
        (used,) = db.execute(
            "SELECT COALESCE(SUM(LENGTH(CAST(text AS BLOB))), 0) FROM execution_events "
            "WHERE execution_id = ? AND kind = ?",
            (execution_id, APPROVAL),
        ).fetchone()
        if count < self._most_requests and used + size <= self._most_bytes:
            return True
        notice = self.bound_reached()
        told = db.execute(
            "SELECT 1 FROM execution_events WHERE execution_id = ? AND kind = ? AND text = ?",
            (execution_id, WARNING, notice),
        ).fetchone()
        if told is None:
            self._executions.insert_event(db, execution_id, WARNING, notice)
        return False

    async def decision(
        self, execution_id: str, worker_id: str, request_id: str, wait: float
    ) -> Approval:
        """The request, once settled or after ``wait`` seconds; denied once it has expired.

        Raises:
            Conflict: the worker no longer holds the turn's lease.
            NotFound: no such request.
        """
        executions = self._executions
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            waiter = executions.watch_waiter(execution_id)
            try:
                executions.lease_row(execution_id, worker_id)
                approval = self.get(execution_id, request_id)
                if approval.pending and executions.now() >= approval.expires_at:
                    return await self._expire(approval)
                remaining = min(deadline - loop.time(), approval.expires_at - executions.now())
                if not approval.pending or deadline - loop.time() <= 0 or executions.closing:
                    return approval
                await executions.wait_for(waiter, max(remaining, 0.0))
            finally:
                executions.drop_watch_waiter(execution_id, waiter)

    async def _expire(self, approval: Approval) -> Approval:
        minutes = float(self._timeout()) / 60
        span = f"{minutes:g} min" if minutes >= 1 else f"{float(self._timeout()):g} s"
        reason = f"nobody answered within {span}; denied"
        return await self._settle(approval, DENY, BY_TIMEOUT, None, reason)

    async def decide(
        self,
        execution_id: str,
        request_id: str,
        decision: str,
        by: Principal,
        reason: str | None = None,
    ) -> Approval:
        """Answer a pending request as ``by`` (the turn's Principal or the owner).

        Raises:
            InvalidArgument: an unknown decision.
            Forbidden: ``by`` is neither the turn's Principal nor the owner.
            NotFound: no such request.
            Conflict: the request was already settled (its decision is in the error).
        """
        if decision not in DECISIONS:
            raise InvalidArgument(f"decision must be one of {', '.join(DECISIONS)}")
        approval = self.get(execution_id, request_id)
        if by.id != approval.runs_as and not by.is_owner:
            raise Forbidden("only the person whose turn this is, or the owner, may answer it")
        if not approval.pending:
            raise Conflict(
                "this request was already answered",
                decision=approval.decision,
                decided_by=approval.decided_by_name,
                via=approval.via,
            )
        return await self._settle(approval, decision, BY_PERSON, by, reason)

    async def _settle(
        self,
        approval: Approval,
        decision: str,
        via: str,
        by: Principal | None,
        reason: str | None,
    ) -> Approval:
        executions = self._executions
        now = executions.now()
        reason = reason.strip()[:MAX_REASON_CHARS] if reason and reason.strip() else None

        def settle(db: sqlite3.Connection) -> Approval:
            cursor = db.execute(
                "UPDATE approvals SET decision = ?, via = ?, decided_by = ?, decided_by_name = ?,"
                " decided_at = ?, reason = ? "
                "WHERE execution_id = ? AND request_id = ? AND decision IS NULL",
                (
                    decision,
                    via,
                    by.id if by else None,
                    by.label if by else None,
                    now,
                    reason,
                    approval.execution_id,
                    approval.request_id,
                ),
            )
            settled = self.get(approval.execution_id, approval.request_id)
            if cursor.rowcount == 0:
                raise Conflict(
                    "this request was already answered",
                    decision=settled.decision,
                    decided_by=settled.decided_by_name,
                    via=settled.via,
                )
            if decision == ALLOW_SESSION and by is not None:
                session_id = executions.describe(approval.execution_id).session_id
                db.execute(
                    "INSERT OR IGNORE INTO session_rules (session_id, runs_as, tool, action, "
                    "pattern, granted_by, granted_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        session_id,
                        approval.runs_as,
                        approval.tool,
                        approval.action,
                        rule_pattern(approval.action, approval.subject),
                        by.id,
                        now,
                    ),
                )
            executions.insert_event(db, approval.execution_id, APPROVAL, event_text(settled))
            return settled

        settled: Approval = await executions.write(settle)
        await executions.changed(approval.execution_id)
        return settled
