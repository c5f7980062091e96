"""Model usage per Principal per UTC day and provider, as the Runtime's model gateway counted it.

A worker reports what its gateway counted for a turn in the turn's completion
(``usage["gateway"]``); ``record`` adds it to the ``usage`` row of whom the turn ran as (its
sender in a shared conversation), in the completion's own transaction, so a turn is counted once
or not at all. The worker is trusted, but what it sends is still checked: a figure that is not a
non-negative whole number of a plausible size is left out, with a warning in the log.

Each Principal may see their own usage; the owner everyone's.

Budgets (``budget.daily_tokens``, ``budget.turn_tokens``) are enforced by the gateway; the Hub
hands each turn its ceiling as the worker claims it, and again with each heartbeat
(``Usage.turn_budget``). One Principal's turns running at once share one day: each heartbeat
reports what the turn's gateway has counted so far, and every other running turn of that
Principal is allowed only what the day has left after it, so together they stay within the
daily budget (to within what they spend between two heartbeats). The owner may add tokens to a
Principal's day (``extend``, the ``budget_extensions`` table): they raise that day's allowance,
or with no daily budget set, the per-turn ceiling of that Principal's turns that day; a running
turn gets them at its next heartbeat. From Feishu the owner answers a request
(``ask_extension``, the ``budget_requests`` table) rather than naming tokens: each request is
granted at most once, and only on the UTC day it was asked.

A turn that would start with nothing of its day left is refused as it is submitted
(``check_start``), with the figures, rather than launched to fail at its first model request.
"""

from __future__ import annotations

import datetime
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hub.contract import UsageReport, UsageRow
from hub.errors import Forbidden, NotFound, QuotaExceeded
from hub.identity import Actor
from hub.state import State

logger = logging.getLogger("amux.hub.usage")

# Far above any one turn, and low enough that a year of sums stays within SQLite's integers.
MAX_FIGURE = 1 << 40
GATEWAY = "gateway"
# The ``limit`` of a turn refused for want of the day's budget.
DAILY_TOKENS = "daily_tokens"


@dataclass(frozen=True)
class Counted:
    """What one turn's model requests came to, as recorded."""

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0


def counted_of(usage: Mapping[str, Any], execution_id: str) -> Counted | None:
    """The gateway's count in a completion's ``usage``; None when there is none to record."""
    gateway = usage.get(GATEWAY)
    if gateway is None:
        return None
    if not isinstance(gateway, Mapping):
        logger.warning("execution %s: gateway usage is not an object; not recorded", execution_id)
        return None
    figures: dict[str, int] = {}
    for name in ("input_tokens", "output_tokens", "requests"):
        value = gateway.get(name, 0)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_FIGURE:
            figures[name] = value
        else:
            logger.warning(
                "execution %s: gateway usage %s is not a plausible count (%.40r); left out",
                execution_id,
                name,
                value,
            )
    if not figures:
        return None
    return Counted(**figures)


def day_of(moment: float) -> str:
    """The UTC day of ``moment`` as an ISO 8601 date."""
    return datetime.datetime.fromtimestamp(moment, datetime.UTC).date().isoformat()


def record(
    db: sqlite3.Connection, principal_id: str, provider: str, counted: Counted, at: float
) -> None:
    """Add one turn's count to its row, inside the caller's transaction."""
    db.execute(
        "INSERT INTO usage (principal_id, day, provider, input_tokens, output_tokens, requests,"
        " turns) VALUES (?, ?, ?, ?, ?, ?, 1) ON CONFLICT (principal_id, day, provider) DO UPDATE"
        " SET input_tokens = input_tokens + excluded.input_tokens,"
        " output_tokens = output_tokens + excluded.output_tokens,"
        " requests = requests + excluded.requests, turns = turns + 1",
        (
            principal_id,
            day_of(at),
            provider,
            counted.input_tokens,
            counted.output_tokens,
            counted.requests,
        ),
    )


@dataclass(frozen=True)
class Standing:
    """Where one Principal's budgets stand on one UTC day: the tokens recorded that day and
    the allowances with the owner's extensions (None: no such budget)."""

    day: str
    day_used: int
    day_allowance: int | None
    turn_allowance: int | None

    def day_share(self, in_flight: int = 0) -> float:
        """How much of the day's allowance is spent (0 without a daily budget)."""
        if not self.day_allowance:
            return 0.0
        return (self.day_used + in_flight) / self.day_allowance


def standing(
    db: sqlite3.Connection, principal_id: str, daily_tokens: int, turn_tokens: int, at: float
) -> Standing:
    day = day_of(at)
    row = db.execute(
        "SELECT COALESCE(SUM(tokens), 0) AS n FROM budget_extensions"
        " WHERE principal_id = ? AND day = ?",
        (principal_id, day),
    ).fetchone()
    extended = int(row["n"])
    used = db.execute(
        "SELECT COALESCE(SUM(input_tokens + output_tokens), 0) AS n FROM usage"
        " WHERE principal_id = ? AND day = ?",
        (principal_id, day),
    ).fetchone()
    return Standing(
        day,
        int(used["n"]),
        daily_tokens + extended if daily_tokens else None,
        turn_tokens + (0 if daily_tokens else extended) if turn_tokens else None,
    )


def ceiling(
    db: sqlite3.Connection,
    principal_id: str,
    daily_tokens: int,
    turn_tokens: int,
    at: float,
    in_flight: int = 0,
) -> int | None:
    """The tokens a turn of ``principal_id`` at ``at`` may use, while its other running turns
    have counted ``in_flight`` not yet recorded; None when unlimited."""
    now = standing(db, principal_id, daily_tokens, turn_tokens, at)
    limits: list[int] = []
    if now.day_allowance is not None:
        limits.append(max(0, now.day_allowance - now.day_used - in_flight))
    if now.turn_allowance is not None:
        limits.append(now.turn_allowance)
    return min(limits) if limits else None


def day_spent(principal_id: str, now: Standing, in_flight: int) -> QuotaExceeded:
    """The refusal of a turn that would start with nothing of its day's budget left."""
    spent = now.day_used + in_flight
    return QuotaExceeded(
        f"today's token budget is spent ({spent}/{now.day_allowance} tokens, UTC day); "
        "the owner may extend it",
        limit=DAILY_TOKENS,
        principal_id=principal_id,
        used=spent,
        allowance=now.day_allowance,
    )


GrantOutcome = Literal["granted", "already", "expired"]


@dataclass(frozen=True)
class Granted:
    """The owner's answer to one extension request: ``granted`` added ``tokens`` now;
    ``already`` had been granted before; ``expired`` was asked on another day than today."""

    outcome: GrantOutcome
    principal_id: str
    day: str
    tokens: int


Listener = Callable[[str, Counted], None]


@dataclass
class Usage:
    """Reports of the ``usage`` table, and who hears of each turn recorded in it."""

    state: State
    clock: Callable[[], float] = time.time
    # Called with the provider and the count once a completion that recorded one is committed
    # (the metrics); never with a Principal, whose name is theirs.
    listeners: list[Listener] = field(default_factory=list)
    # Running turns' counts so far, by execution: (whom it runs as, tokens), from heartbeats.
    # Held in memory only: after a restart each running turn's next heartbeat brings it back.
    _running: dict[str, tuple[str, int]] = field(default_factory=dict)

    def turn_budget(
        self,
        execution_id: str,
        runs_as: str,
        daily_tokens: int,
        turn_tokens: int,
        used_so_far: int | None = None,
    ) -> int | None:
        """The tokens one running turn may use in all, given its Principal's other running
        turns; ``used_so_far`` is what its own gateway has counted (from its heartbeat)."""
        db = self.state.db
        running = {
            row["id"]
            for row in db.execute(
                "SELECT id FROM executions WHERE runs_as = ? AND state = 'running'", (runs_as,)
            )
        }
        for stale in [e for e, (who, _) in self._running.items() if who == runs_as]:
            if stale not in running:
                del self._running[stale]
        if used_so_far is not None and execution_id in running:
            self._running[execution_id] = (runs_as, used_so_far)
        in_flight = self._in_flight(runs_as, execution_id)
        return ceiling(db, runs_as, daily_tokens, turn_tokens, self.clock(), in_flight)

    def _in_flight(self, runs_as: str, besides: str = "") -> int:
        return sum(
            tokens
            for other, (who, tokens) in self._running.items()
            if who == runs_as and other != besides
        )

    def standing(self, principal_id: str, daily_tokens: int, turn_tokens: int) -> Standing:
        return standing(self.state.db, principal_id, daily_tokens, turn_tokens, self.clock())

    def check_start(
        self, db: sqlite3.Connection, runs_as: str, daily_tokens: int, turn_tokens: int
    ) -> None:
        """Refuse a turn of ``runs_as`` that would start with nothing of its day left: a
        launch could only fail at its first model request.

        Raises:
            QuotaExceeded: the day's budget is spent (limit ``daily_tokens``, with ``used``
                and ``allowance``).
        """
        now = standing(db, runs_as, daily_tokens, turn_tokens, self.clock())
        in_flight = self._in_flight(runs_as)
        if now.day_allowance is not None and now.day_used + in_flight >= now.day_allowance:
            raise day_spent(runs_as, now, in_flight)

    async def ask_extension(self, principal_id: str, tokens: int) -> tuple[str, bool]:
        """The id of today's open request to add ``tokens`` to ``principal_id``'s day, and
        whether it is new: the one not yet granted if there is one, so the same shortfall is
        asked once and granted once."""
        day = day_of(self.clock())

        def ask(db: sqlite3.Connection) -> tuple[str, bool]:
            row = db.execute(
                "SELECT id FROM budget_requests WHERE principal_id = ? AND day = ?"
                " AND granted_at IS NULL ORDER BY asked_at LIMIT 1",
                (principal_id, day),
            ).fetchone()
            if row is not None:
                return str(row["id"]), False
            request = uuid.uuid4().hex
            db.execute(
                "INSERT INTO budget_requests (id, principal_id, day, tokens, asked_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (request, principal_id, day, tokens, self.clock()),
            )
            return request, True

        answer: tuple[str, bool] = await self.state.write(ask)
        return answer

    async def grant(self, actor: Actor, request: str) -> Granted:
        """The owner's Extend on request ``request``: its tokens added to its Principal's day,
        once, and only on the day it was asked (an old card extends nothing today).

        Raises:
            Forbidden: the caller is not the owner in person.
            NotFound: no such request.
        """
        if not actor.owner_in_person:
            raise Forbidden("only the owner may extend a budget")
        today = day_of(self.clock())

        def answer(db: sqlite3.Connection) -> Granted:
            row = db.execute("SELECT * FROM budget_requests WHERE id = ?", (request,)).fetchone()
            if row is None:
                raise NotFound("no such budget request", request=request)
            whose, day, tokens = str(row["principal_id"]), str(row["day"]), int(row["tokens"])
            if row["granted_at"] is not None:
                return Granted("already", whose, day, tokens)
            if day != today:
                return Granted("expired", whose, day, tokens)
            db.execute(
                "UPDATE budget_requests SET granted_by = ?, granted_at = ? WHERE id = ?",
                (actor.principal.id, self.clock(), request),
            )
            db.execute(
                "INSERT INTO budget_extensions (principal_id, day, tokens) VALUES (?, ?, ?)"
                " ON CONFLICT (principal_id, day) DO UPDATE SET tokens = tokens + excluded.tokens",
                (whose, day, tokens),
            )
            return Granted("granted", whose, day, tokens)

        granted: Granted = await self.state.write(answer)
        return granted

    def finished(self, execution_id: str) -> None:
        """Forget a turn's running count: its completion recorded the whole of it."""
        self._running.pop(execution_id, None)

    def recorded(self, provider: str, counted: Counted) -> None:
        for listener in self.listeners:
            listener(provider, counted)

    def report(self, actor: Actor, principal: str | None, days: int) -> UsageReport:
        """The last ``days`` UTC days (today included) of one Principal's usage, named by id or
        name; with None, the caller's own, or for the owner everyone's.

        Raises:
            Forbidden: someone other than the owner names another Principal.
            NotFound: the owner names a Principal that does not exist.
        """
        whose = self._whose(actor, principal)
        today = datetime.datetime.fromtimestamp(self.clock(), datetime.UTC).date()
        since = (today - datetime.timedelta(days=days - 1)).isoformat()
        query = (
            "SELECT u.*, p.name FROM usage u LEFT JOIN principals p ON p.id = u.principal_id "
            "WHERE u.day >= ?"
        )
        args: list[str] = [since]
        if whose is not None:
            query += " AND u.principal_id = ?"
            args.append(whose)
        query += " ORDER BY u.day DESC, p.name, u.provider"
        rows = tuple(
            UsageRow(
                day=row["day"],
                principal_id=row["principal_id"],
                # A Principal removed since keeps its figures under its id.
                principal=row["name"] or row["principal_id"],
                provider=row["provider"],
                input_tokens=row["input_tokens"],
                output_tokens=row["output_tokens"],
                requests=row["requests"],
                turns=row["turns"],
            )
            for row in self.state.db.execute(query, args)
        )
        return UsageReport(since=since, until=today.isoformat(), rows=rows)

    async def extend(self, actor: Actor, principal: str, tokens: int) -> dict[str, Any]:
        """Add ``tokens`` to one Principal's budget for today (UTC); the owner only.

        Raises:
            Forbidden: the caller is not the owner in person.
            NotFound: no Principal has that id or name.
        """
        if not actor.owner_in_person:
            raise Forbidden("only the owner may extend a budget")
        whose = self._whose(actor, principal)
        assert whose is not None
        day = day_of(self.clock())

        def add(db: sqlite3.Connection) -> int:
            db.execute(
                "INSERT INTO budget_extensions (principal_id, day, tokens) VALUES (?, ?, ?)"
                " ON CONFLICT (principal_id, day) DO UPDATE SET tokens = tokens + excluded.tokens",
                (whose, day, tokens),
            )
            row = db.execute(
                "SELECT tokens FROM budget_extensions WHERE principal_id = ? AND day = ?",
                (whose, day),
            ).fetchone()
            return int(row["tokens"])

        total = await self.state.write(add)
        return {"principal_id": whose, "day": day, "tokens": total}

    def _whose(self, actor: Actor, principal: str | None) -> str | None:
        """The id of the Principal to report on; None for everyone (the owner only)."""
        own = actor.principal
        if not actor.owner_in_person:
            # Decided before anything is looked up: no answer tells who else exists.
            if principal is not None and principal not in (own.id, own.name):
                raise Forbidden("you may see only your own usage; the owner sees everyone's")
            return own.id
        if principal is None:
            return None
        found = self.state.principal(principal)
        if found is not None:
            return found.id
        try:
            return self.state.principal_by_name(principal).id
        except NotFound:
            raise NotFound(f"no principal with the id or name '{principal}'") from None
