"""Sessions and executions: the Hub's queue of Agent turns that Runtime workers claim.

A Session is one native Agent conversation. Its memory binding is frozen at its first execution
and reused by every resume; an unbound Session stays unbound. An execution is one turn: queued,
claimed by a worker under a lease kept alive by heartbeats, and finished with a result. A worker
that stops heart-beating loses its lease; the turn is retried once elsewhere, then failed visibly,
unless its user had asked to stop it: then it ends cancelled, never run again.
A project Session's turns go to the worker holding its checkout (its home, named at its first
claim); a home not seen for ``home_worker_seconds`` while the Hub runs is gone, and the next
worker to claim such a turn becomes the Session's home, making its checkout from its branch.

A free worker slot gets the oldest claimable turn of the Principal with the fewest running
turns, and among Principals alike in that, of the one served least recently: Principals with
queued turns take turns, so one's backlog never holds up another's next turn for longer than a
slot takes to free. A turn counts for whom it runs as: its Session's Principal, or in a shared
conversation (a group topic) its sender. Each Principal may have ``max_queued_per_principal``
turns waiting; a submit beyond that is refused with ``quota_exceeded`` and a ``retry_after``.

A graceful stop or restart first drains: no turn is claimed any more, running turns may finish
(a restart waits up to AMUX_DRAIN_SECONDS, a stop not at all), and those still running then are
handed back to the queue (the attempt is not counted) with a status event saying so, so the next
Hub process runs them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from hub.approvals import event_text, lapse_pending
from hub.contract import (
    APPROVAL,
    CANCELLED,
    FAILED,
    MEMORY,
    QUEUED,
    RUNNING,
    STATUS,
    SUCCEEDED,
    WARNING,
    WORKER_EVENT_KINDS,
    Claim,
    Execution,
    ExecutionEvent,
    Session,
    TurnOutcome,
    TurnResult,
    WatchResult,
    provider_name_problem,
)
from hub.errors import Conflict, Forbidden, InvalidArgument, NotFound, QuotaExceeded
from hub.eventbudget import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_EVENTS,
    EventBudget,
    cut_to_bytes,
    text_bytes,
)
from hub.paths import memory_scope
from hub.requestid import REQUEST_ID
from hub.state import State
from hub.usage import Counted, Usage, counted_of, record

MAX_ATTEMPTS = 2
MAX_PROMPT_BYTES = 256 * 1024
WORKER_FRESH_SECONDS = 60.0
TOUCH_SECONDS = 5.0
# How soon a Principal at the queued cap is told to try again: about when a slot usually frees.
QUEUED_RETRY_SECONDS = 30
NO_WORKER = "no Runtime worker is connected; this turn waits until one is"
HANDED_BACK = (
    "the Hub restarted before this turn finished; it runs again from the start after the restart"
)
# A turn its user asked to stop is never run again, whatever happened to its run.
STOPPED_LOST = "the worker running this turn was lost after it was asked to stop; it is not retried"
STOPPED_HANDED_BACK = (
    "the Hub restarted after this turn was asked to stop; it is not run again after the restart"
)


# Writes what started a turn (a schedule's firing) in the transaction that queues it, given the
# turn's id; whoever hands one to ``submit`` never touches the database itself.
Recorder = Callable[[sqlite3.Connection, str], None]


def no_such_execution(execution_id: str) -> NotFound:
    """The answer for an execution that does not exist, or that the caller may not see."""
    return NotFound("no such execution", execution_id=execution_id)


def no_such_session(session_id: str) -> NotFound:
    """The answer for a Session that does not exist, or that the caller may not see."""
    return NotFound("no such session", session_id=session_id)


def delegation_label(session_id: str) -> str:
    """The label of a Session's delegated Agent credentials, so a lost launch's can be found."""
    return f"session {session_id}"


class Executions:
    """Durable queue of executions with long-poll wake-ups, on the Hub's state database."""

    def __init__(
        self,
        state: State,
        lease_seconds: float = 30.0,
        clock: Callable[[], float] = time.time,
        queue_seconds: float = 900.0,
        providers: Iterable[str] = (),
        max_queued_per_principal: int = 0,
        usage: Usage | None = None,
        home_worker_seconds: float = 300.0,
        event_bounds: Callable[[], tuple[int, int]] = lambda: (
            DEFAULT_MAX_EVENTS,
            DEFAULT_MAX_BYTES,
        ),
        budgets: Callable[[], tuple[int, int]] = lambda: (0, 0),
    ) -> None:
        # The Agents turns may name (the composition root knows its workers' adapters); a turn
        # naming any other is refused, so no caller picks a program for a worker to run.
        self.providers = tuple(providers)
        self.db = state.db
        self._state = state
        self.lease_seconds = lease_seconds
        self.queue_seconds = queue_seconds
        self.home_worker_seconds = home_worker_seconds
        self._clock = clock
        # A worker's absence counts only from this process's start: while the Hub was down no
        # worker could be seen, and none of them is gone for that.
        self._started = clock()
        # Opening the State brought these tables up to date (see hub.migrations).
        self._changed = asyncio.Condition()
        self._version = 0
        # Long polls wait on futures that only the changes they care about resolve: a claim on
        # a change to the queue, a watch on a change to its own execution. Waking every poll on
        # every change made each one re-query SQLite, and each claim write, once per change.
        self._claim_waiters: set[asyncio.Future[None]] = set()
        self._watch_waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._closing = False
        self._claiming = True
        # Turns one Principal may have waiting (0: no cap).
        self.max_queued_per_principal = max_queued_per_principal
        # When each Principal was last given a slot, in claims counted by this process. Only an
        # order among them, so starting over from nothing after a restart is harmless.
        self._served: dict[str, int] = {}
        self._claims = 0
        # What the model gateway counted for each completed turn goes there.
        self.usage = usage if usage is not None else Usage(state, clock)
        # A turn's bound on events (count, bytes), read when a worker claims it: a change of the
        # settings applies to turns started after it.
        self._event_bounds = event_bounds
        self._budgets: dict[str, EventBudget] = {}
        # The token budgets (per day, per turn; 0: none), read as each turn is submitted.
        self._token_budgets = budgets

    async def _notify(self, execution_id: str | None = None, *, queue: bool = True) -> None:
        """Wake the waiters a change concerns: claims if ``queue``, watches of ``execution_id``
        (of every execution when None), and every ``_wait_change``."""
        async with self._changed:
            self._version += 1
            self._changed.notify_all()
        if queue:
            waiters, self._claim_waiters = self._claim_waiters, set()
            _wake(waiters)
        if execution_id is None:
            for waiters in self._watch_waiters.values():
                _wake(waiters)
            self._watch_waiters.clear()
        else:
            _wake(self._watch_waiters.pop(execution_id, ()))

    async def _wait(self, waiter: asyncio.Future[None], seconds: float) -> None:
        """Wait until ``waiter`` is woken, or time runs out."""
        if self._closing:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter, seconds)

    def _watch_waiter(self, execution_id: str) -> asyncio.Future[None]:
        waiter = asyncio.get_running_loop().create_future()
        self._watch_waiters.setdefault(execution_id, set()).add(waiter)
        return waiter

    def _drop_watch_waiter(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        waiters = self._watch_waiters.get(execution_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._watch_waiters[execution_id]

    @property
    def closing(self) -> bool:
        return self._closing

    # -- for services that keep per-turn state beside the queue (hub.approvals) -----------------

    def now(self) -> float:
        return self._clock()

    def lease_row(self, execution_id: str, worker_id: str) -> sqlite3.Row:
        """The turn's row while ``worker_id`` holds its lease.

        Raises:
            NotFound: no such execution. Conflict: the lease is another worker's, or gone.
        """
        return self._owned(execution_id, worker_id)

    async def write(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``work`` in one write transaction of the state database."""
        return await self._state.write(work)

    def insert_event(self, db: sqlite3.Connection, execution_id: str, kind: str, text: str) -> int:
        """Record an event of the caller's own (a permission request as it stands), whole and
        outside the turn's bound: its caller bounds what it holds."""
        return self._insert_event(db, execution_id, kind, text)

    async def changed(self, execution_id: str) -> None:
        """Wake whoever follows ``execution_id`` (no claim has anything new to look at)."""
        await self._notify(execution_id, queue=False)

    def watch_waiter(self, execution_id: str) -> asyncio.Future[None]:
        return self._watch_waiter(execution_id)

    def drop_watch_waiter(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        self._drop_watch_waiter(execution_id, waiter)

    async def wait_for(self, waiter: asyncio.Future[None], seconds: float) -> None:
        await self._wait(waiter, seconds)

    def _lapse_approvals(self, execution_id: str) -> None:
        """A turn handed back loses its pending permission requests: the next run asks anew."""
        with self._state.transaction() as db:
            for approval in lapse_pending(db, execution_id, self._clock()):
                self._insert_event(db, execution_id, APPROVAL, event_text(approval))

    async def close(self) -> None:
        """Release every long poll now, so a graceful shutdown does not wait them out."""
        self._closing = True
        await self._notify()

    def stop_claiming(self) -> None:
        """No turn is claimed from now on (a drain before a stop or restart); running ones go on."""
        self._claiming = False

    def running_count(self) -> int:
        row = self.db.execute(
            "SELECT COUNT(*) AS n FROM executions WHERE state = ?", (RUNNING,)
        ).fetchone()
        return int(row["n"])

    async def wait_until_idle(self, seconds: float) -> bool:
        """Wait until no turn is running; False if some still are after ``seconds``."""
        deadline = asyncio.get_running_loop().time() + seconds
        while True:
            seen = self._version
            if self.running_count() == 0:
                return True
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            # Bounded: a turn whose worker vanished finishes only through the lease sweeper.
            await self._wait_change(seen, min(remaining, 1.0))

    async def hand_back(self) -> list[str]:
        """Re-queue every running turn (its attempt not counted), or end it cancelled if its user
        asked to stop it; returns their ids.

        The worker's next heart-beat finds the lease gone and stops the Agent; its delegated
        credential is revoked now so it cannot write memory beside the next run.
        """
        rows = self.db.execute(
            "SELECT id, session_id, cancel_requested FROM executions WHERE state = ?", (RUNNING,)
        ).fetchall()
        now = self._clock()
        for row in rows:
            self._revoke_delegations(row["session_id"])
            self._lapse_approvals(row["id"])
            if row["cancel_requested"]:
                self._stop_unfinished(row["id"], STOPPED_HANDED_BACK)
                continue
            self.db.execute(
                "UPDATE executions SET state = ?, worker_id = NULL, lease_expires_at = NULL, "
                "attempts = MAX(attempts - 1, 0), updated_at = ? WHERE id = ? AND state = ?",
                (QUEUED, now, row["id"], RUNNING),
            )
            self._append_event(row["id"], STATUS, HANDED_BACK)
        if rows:
            await self._notify()
        return [str(row["id"]) for row in rows]

    async def _wait_change(self, seen: int, seconds: float) -> None:
        """Wait until something changed after version ``seen`` was observed, or time runs out."""
        if self._closing:
            return
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._version != seen), seconds
                )

    # -- sessions --------------------------------------------------------------------------------

    def session(self, session_id: str) -> Session:
        """Raises: NotFound: no such session."""
        row = self.db.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise no_such_session(session_id)
        return Session(
            row["id"],
            row["principal_id"],
            row["provider"],
            row["cwd"],
            row["origin"],
            row["native_id"],
            row["memory"],
            row["binding"],
            row["workspace"],
            row["project"],
            row["model"],
            row["fork_of"],
        )

    async def fork(self, parent_id: str) -> Session:
        """A new Session whose turns resume a fork of ``parent_id``'s native session (its
        Principal, Agent, workspace, model and memory binding), leaving the parent as it was.

        Raises:
            NotFound: no such session.
            InvalidArgument: the parent has no native session to fork yet, or is a project's.
        """
        parent = self.session(parent_id)
        if parent.native_id is None:
            raise InvalidArgument("this conversation has no Agent session to fork yet")
        if parent.project is not None:
            raise InvalidArgument("a project conversation's session cannot be forked")
        session_id = uuid.uuid4().hex

        def write(db: sqlite3.Connection) -> None:
            now = self._clock()
            db.execute(
                "INSERT INTO sessions (id, principal_id, provider, cwd, origin, native_id, memory,"
                " binding, workspace, model, fork_of, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    parent.principal_id,
                    parent.provider,
                    parent.cwd,
                    parent.native_id,
                    parent.memory,
                    parent.binding,
                    parent.workspace,
                    parent.model,
                    parent.id,
                    now,
                    now,
                ),
            )

        await self._state.write(write)
        return self.session(session_id)

    async def set_model(self, session_id: str, model: str | None) -> Session:
        """The model ``session``'s next turns ask their Agent for (None: its default); a turn
        already running keeps the one it was launched with.

        Raises:
            NotFound: no such session.
        """
        self.session(session_id)

        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE sessions SET model = ?, updated_at = ? WHERE id = ?",
                (model, self._clock(), session_id),
            )

        await self._state.write(write)
        return self.session(session_id)

    def session_by_origin(self, origin: str) -> Session | None:
        row = self.db.execute("SELECT id FROM sessions WHERE origin = ?", (origin,)).fetchone()
        return self.session(row["id"]) if row else None

    def _create_session(
        self,
        principal_id: str,
        provider: str,
        cwd: str | None,
        origin: str | None,
        workspace: str | None = None,
        project: str | None = None,
    ) -> Session:
        now = self._clock()
        session_id = uuid.uuid4().hex
        self.db.execute(
            "INSERT INTO sessions (id, principal_id, provider, cwd, origin, workspace, project,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (session_id, principal_id, provider, cwd, origin, workspace, project, now, now),
        )
        return self.session(session_id)

    def freeze_memory(
        self, session_id: str, *, enabled: bool, isolation: bool, capable: bool
    ) -> tuple[Session, str | None]:
        """Decide a fresh Session's binding once; later calls return what was frozen.

        Returns the Session and a warning for the user, if any. Memory off means unbound with
        no warning: people who never turned memory on hear nothing about it.
        """
        session = self.session(session_id)
        if session.memory != "pending":
            return session, None
        warning = None
        if enabled and capable:
            binding = memory_scope(session.principal_id, isolation)
            memory: str = "bound"
        else:
            binding = None
            memory = "unbound"
            if enabled:
                warning = (
                    f"memory capability missing for provider {session.provider}: "
                    "this conversation runs without amux memory"
                )
        self.db.execute(
            "UPDATE sessions SET memory = ?, binding = ?, updated_at = ? "
            "WHERE id = ? AND memory = 'pending'",
            (memory, binding, self._clock(), session_id),
        )
        return self.session(session_id), warning

    def mark_unbound(self, session_id: str) -> None:
        """A launch whose memory discovery failed leaves its Session unbound for good."""
        self.db.execute(
            "UPDATE sessions SET memory = 'unbound', updated_at = ? "
            "WHERE id = ? AND memory = 'pending'",
            (self._clock(), session_id),
        )

    # -- submitting and following ----------------------------------------------------------------

    async def submit(
        self,
        *,
        principal_id: str,
        submitted_by: str,
        provider: str,
        prompt: str,
        cwd: str | None = None,
        session_id: str | None = None,
        origin: str | None = None,
        workspace: str | None = None,
        project: str | None = None,
        record: Recorder | None = None,
    ) -> tuple[Execution, Session]:
        """Queue one turn, in a new Session or resuming one of this Principal's.

        ``record`` writes what started the turn (a schedule's firing) in the transaction that
        queues it, given the turn's id: if it raises, nothing of the turn is written.

        A new Session made with a ``workspace`` is a shared conversation (a group topic, which
        only the bot makes): its turns run as whoever ``submitted_by`` names, each its sender.
        A new Session made with a ``project`` works in a checkout of that project's repository;
        an existing Session keeps the project it was created with.

        Raises:
            InvalidArgument: bad prompt or provider, or a provider change on an existing Session.
            Forbidden: the Session belongs to another Principal.
            NotFound: no such project.
            QuotaExceeded: too many turns waiting, or the day's token budget of whom it would
                run as is spent.
        """
        if not prompt.strip():
            raise InvalidArgument("the prompt is empty")
        if len(prompt.encode("utf-8")) > MAX_PROMPT_BYTES:
            raise InvalidArgument(f"the prompt is longer than {MAX_PROMPT_BYTES} bytes")
        problem = provider_name_problem(provider)
        if problem is not None:
            raise InvalidArgument(problem)
        if provider not in self.providers:
            raise InvalidArgument(
                f"unknown provider {provider!r}; accepted: {', '.join(self.providers)}"
            )
        request_id = REQUEST_ID.get()
        execution_id = uuid.uuid4().hex

        def queue(db: sqlite3.Connection) -> Session:
            # The Session is looked up in the same transaction that adds the turn, so two
            # submits naming one new origin cannot both create it.
            session: Session | None = None
            if session_id is not None:
                session = self.session(session_id)
            elif origin is not None:
                session = self.session_by_origin(origin)
            if session is not None:
                if session.principal_id != principal_id:
                    raise Forbidden("this conversation belongs to someone else")
                if session.provider != provider:
                    raise InvalidArgument(
                        f"this conversation runs {session.provider}; start a new one for {provider}"
                    )
            else:
                if project is not None and not _project_exists(db, project):
                    raise NotFound("no such project", project=project)
                session = self._create_session(
                    principal_id, provider, cwd, origin, workspace, project
                )
            # Whose share the turn takes: whom it runs as.
            runs_as = session.principal_id if session.workspace is None else submitted_by
            self._check_queued_cap(db, runs_as)
            self.usage.check_start(db, runs_as, *self._token_budgets())
            now = self._clock()
            db.execute(
                "INSERT INTO executions (id, session_id, prompt, state, submitted_by, runs_as, "
                "request_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    execution_id,
                    session.id,
                    prompt,
                    QUEUED,
                    submitted_by,
                    runs_as,
                    request_id,
                    now,
                    now,
                ),
            )
            if record is not None:
                record(db, execution_id)
            if self.connected_workers() == 0:
                self._insert_event(db, execution_id, STATUS, NO_WORKER)
            else:
                home = self._absent_home_worker(db, session.id)
                if home is not None:
                    waits = waits_for_worker(home, self.home_worker_seconds)
                    self._insert_event(db, execution_id, STATUS, waits)
            return session

        session = await self._state.write(queue)
        await self._notify(execution_id)
        return self.describe(execution_id), session

    def _check_queued_cap(self, db: sqlite3.Connection, principal_id: str) -> None:
        """Raises: QuotaExceeded: ``principal_id`` has as many turns waiting as one may."""
        cap = self.max_queued_per_principal
        if not cap:
            return
        row = db.execute(
            "SELECT COUNT(*) AS n FROM executions WHERE state = ? AND runs_as = ?",
            (QUEUED, principal_id),
        ).fetchone()
        if int(row["n"]) >= cap:
            raise QuotaExceeded(
                f"{cap} of your turns are already waiting for a worker, the most one person may "
                f"queue; try again in about {QUEUED_RETRY_SECONDS} s, once one of them has started",
                limit="queued_turns",
                queued=cap,
                retry_after=QUEUED_RETRY_SECONDS,
            )

    def describe(self, execution_id: str) -> Execution:
        """Raises: NotFound: no such execution."""
        row = self.db.execute("SELECT * FROM executions WHERE id = ?", (execution_id,)).fetchone()
        if row is None:
            raise no_such_execution(execution_id)
        return Execution(
            id=row["id"],
            session_id=row["session_id"],
            state=row["state"],
            attempts=row["attempts"],
            result=TurnResult.from_wire(json.loads(row["result"])) if row["result"] else None,
            error=row["error"],
            submitted_by=row["submitted_by"],
            cancelled_by=row["cancelled_by"] if row["state"] == CANCELLED else None,
        )

    def events(self, execution_id: str, after: int = 0) -> list[ExecutionEvent]:
        rows = self.db.execute(
            "SELECT seq, kind, text, at FROM execution_events WHERE execution_id = ? AND seq > ? "
            "ORDER BY seq",
            (execution_id, after),
        ).fetchall()
        return [ExecutionEvent(row["seq"], row["kind"], row["text"], row["at"]) for row in rows]

    async def watch(self, execution_id: str, after: int, wait: float) -> WatchResult:
        """Events after ``after``; waits up to ``wait`` seconds for news if there is none yet."""
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            # Registered before the queries, so a change between them and the wait wakes it.
            waiter = self._watch_waiter(execution_id)
            try:
                described = self.describe(execution_id)
                events = self.events(execution_id, after)
                remaining = deadline - asyncio.get_running_loop().time()
                if events or described.finished or remaining <= 0 or self._closing:
                    return WatchResult(described, tuple(events))
                await self._wait(waiter, remaining)
            finally:
                self._drop_watch_waiter(execution_id, waiter)

    async def cancel(self, execution_id: str, by: str | None = None) -> Execution:
        """Stop a turn: a queued one at once, a running one once its worker hears (at once,
        through its waiting heartbeat). ``by``: whose Stop it was, which the turn keeps."""
        described = self.describe(execution_id)
        if described.state == QUEUED:
            self._finish(execution_id, CANCELLED, None, "cancelled before it started")
        elif described.state == RUNNING:
            self.db.execute(
                "UPDATE executions SET cancel_requested = 1 WHERE id = ?", (execution_id,)
            )
        if described.state in (QUEUED, RUNNING) and by is not None:
            self.db.execute(
                "UPDATE executions SET cancelled_by = COALESCE(cancelled_by, ?) WHERE id = ?",
                (by, execution_id),
            )
        await self._notify(execution_id)
        return self.describe(execution_id)

    # -- the worker side -------------------------------------------------------------------------

    def register_worker(self, name: str, principal_id: str) -> str:
        worker_id = uuid.uuid4().hex[:16]
        self.db.execute(
            "INSERT INTO workers (id, name, principal_id, last_seen) VALUES (?, ?, ?, ?)",
            (worker_id, name, principal_id, self._clock()),
        )
        return worker_id

    def _touch_worker(self, worker_id: str, principal_id: str) -> None:
        cursor = self.db.execute(
            "UPDATE workers SET last_seen = ? WHERE id = ? AND principal_id = ?",
            (self._clock(), worker_id, principal_id),
        )
        if cursor.rowcount == 0:
            raise NotFound("unknown worker; register again", worker_id=worker_id)

    def connected_workers(self, besides: str | None = None) -> int:
        """Workers seen recently, not counting ``besides``."""
        row = self.db.execute(
            "SELECT COUNT(*) AS n FROM workers WHERE last_seen >= ? AND id IS NOT ?",
            (self._clock() - WORKER_FRESH_SECONDS, besides),
        ).fetchone()
        return int(row["n"])

    async def claim(
        self,
        worker_id: str,
        principal_id: str,
        wait: float,
        connected: Callable[[], bool] = lambda: True,
    ) -> Claim | None:
        """The next fair turn whose Session is idle, leased to this worker; None on timeout.

        Nothing is leased once ``connected`` says the worker stopped waiting: a killed worker's
        idle slots leave long polls behind, and one of them taking a turn handed back to the
        queue would spend its retry on a worker that is gone.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        seen_at: float | None = None
        while True:
            # Registered before the query, so a change between it and the wait wakes it.
            waiter = loop.create_future()
            self._claim_waiters.add(waiter)
            try:
                if not connected():
                    return None
                if self._claiming and self._claimable() is not None:
                    # The worker is seen in the claim's own transaction: one commit, not two.
                    claimed = await self._state.write(
                        lambda db: (
                            self._claim_one(db, worker_id, principal_id) if connected() else None
                        )
                    )
                    if claimed is not None:
                        return self._claim_of(*claimed)
                    seen_at = loop.time()
                elif seen_at is None or loop.time() - seen_at >= TOUCH_SECONDS:
                    self._touch_worker(worker_id, principal_id)
                    seen_at = loop.time()
                remaining = deadline - loop.time()
                if remaining <= 0 or self._closing:
                    return None
                # A wake-up that finds nothing to claim writes nothing; the worker is seen
                # again every TOUCH_SECONDS, well within WORKER_FRESH_SECONDS.
                await self._wait(waiter, min(remaining, TOUCH_SECONDS))
            finally:
                self._claim_waiters.discard(waiter)

    def _claimable(self) -> str | None:
        """The oldest queued turn whose Session is idle, if any."""
        row = self.db.execute(
            "SELECT e.id FROM executions e WHERE e.state = ? AND NOT EXISTS ("
            " SELECT 1 FROM executions r WHERE r.session_id = e.session_id AND r.state = ?)"
            " ORDER BY e.created_at LIMIT 1",
            (QUEUED, RUNNING),
        ).fetchone()
        return None if row is None else str(row["id"])

    def _absent_home_worker(self, db: sqlite3.Connection, session_id: str) -> str | None:
        """The name of the worker holding the Session's checkout when none of that name is
        connected now; None when the Session has no home worker, it is there, or it is gone
        (the next claim moves the Session, and says so)."""
        row = db.execute("SELECT home_worker FROM sessions WHERE id = ?", (session_id,)).fetchone()
        home = row["home_worker"] if row is not None else None
        if home is None:
            return None
        seen = db.execute(
            "SELECT MAX(last_seen) AS at FROM workers WHERE name = ?", (home,)
        ).fetchone()["at"]
        if seen is None or seen < self._gone_before():
            return None
        return None if seen >= self._clock() - WORKER_FRESH_SECONDS else str(home)

    def _gone_before(self) -> float:
        """A home worker last seen before this is gone; never one while this Hub has run for
        less than ``home_worker_seconds`` (no worker could be seen while it was down)."""
        cutoff = self._clock() - self.home_worker_seconds
        return float("-inf") if self._started > cutoff else cutoff

    def _homed_elsewhere(self, worker_name: str) -> set[str]:
        """The Sessions with waiting turns whose checkout another worker holds: only that
        worker may take their turns, until it is gone (not seen for ``home_worker_seconds``
        while this Hub ran)."""
        cutoff = self._gone_before()
        return {
            str(row["id"])
            for row in self.db.execute(
                "SELECT DISTINCT s.id FROM executions e JOIN sessions s ON s.id = e.session_id "
                "WHERE e.state = ? AND s.home_worker IS NOT NULL AND s.home_worker != ? "
                "AND EXISTS (SELECT 1 FROM workers w WHERE w.name = s.home_worker "
                "AND w.last_seen >= ?)",
                (QUEUED, worker_name, cutoff),
            )
        }

    def _fair_pick(self, worker_name: str) -> tuple[str, str] | None:
        """The turn a free slot runs next, and whom it runs as: the oldest claimable turn of
        the Principal with the fewest running turns, then of the one served least recently,
        then of the one waiting longest. A project Session's turns go only to the worker named
        on it while that worker is not gone (see ``_homed_elsewhere``, ``_claim_one``).

        Every lookup is a range of the (state, runs_as, created_at) index, so the cost grows
        with the number of Principals waiting, not with the length of their queues.
        """
        db = self.db
        running: dict[str, int] = {}
        busy: set[str] = set()
        for row in db.execute(
            "SELECT runs_as, session_id FROM executions WHERE state = ?", (RUNNING,)
        ):
            running[row["runs_as"]] = running.get(row["runs_as"], 0) + 1
            busy.add(row["session_id"])
        # Not this worker's to take, just as a running Session's next turn is nobody's yet.
        busy |= self._homed_elsewhere(worker_name)
        candidates: list[tuple[int, int, float, str, str]] = []
        after = ""
        while True:
            # The next waiting Principal and its oldest turn: a skip along the index, not a
            # scan of anyone's queue.
            row = db.execute(
                "SELECT runs_as, id, session_id, created_at FROM executions "
                "WHERE state = ? AND runs_as > ? ORDER BY runs_as, created_at LIMIT 1",
                (QUEUED, after),
            ).fetchone()
            if row is None:
                break
            who = after = row["runs_as"]
            if row["session_id"] in busy:
                # A Session runs one turn at a time: this Principal's next is a later one.
                row = next(
                    (
                        later
                        for later in db.execute(
                            "SELECT id, session_id, created_at FROM executions "
                            "WHERE state = ? AND runs_as = ? ORDER BY created_at",
                            (QUEUED, who),
                        )
                        if later["session_id"] not in busy
                    ),
                    None,
                )
                if row is None:
                    continue
            rank = (running.get(who, 0), self._served.get(who, 0))
            candidates.append((*rank, row["created_at"], row["id"], who))
        if not candidates:
            return None
        *_, execution_id, who = min(candidates)
        return execution_id, who

    def _claim_one(
        self, db: sqlite3.Connection, worker_id: str, principal_id: str
    ) -> tuple[str, str | None] | None:
        """Lease the next turn (see ``_fair_pick``) to the worker; returns its id, and the
        name of the gone worker its project Session moves from, if it moves.

        Raises: NotFound: the worker is unknown (register again).
        """
        now = self._clock()
        self._touch_worker(worker_id, principal_id)
        worker_name = self._worker_name(worker_id)
        picked = self._fair_pick(worker_name)
        if picked is None:
            return None
        execution_id, runs_as = picked
        row = db.execute(
            "SELECT s.id, s.home_worker FROM executions e JOIN sessions s ON s.id = e.session_id "
            "WHERE e.id = ? AND s.project IS NOT NULL",
            (execution_id,),
        ).fetchone()
        moved_from: str | None = None
        if row is not None and row["home_worker"] != worker_name:
            # A project Session's first claim names its home: the worker that makes its
            # checkout is the one that has it for every later turn. A turn picked for another
            # worker means its home is gone (see ``_homed_elsewhere``): it moves, and says so.
            if row["home_worker"] is not None:
                moved_from = str(row["home_worker"])
                moved = moves_to_worker(moved_from, worker_name, self.home_worker_seconds)
                self._insert_event(db, execution_id, STATUS, moved)
            db.execute("UPDATE sessions SET home_worker = ? WHERE id = ?", (worker_name, row["id"]))
        self._claims += 1
        self._served[runs_as] = self._claims
        # Each run of the turn reports within its own bound, read as it starts.
        self._budgets[execution_id] = EventBudget(*self._event_bounds())
        db.execute(
            "UPDATE executions SET state = ?, worker_id = ?, attempts = attempts + 1, "
            "lease_expires_at = ?, updated_at = ? WHERE id = ?",
            (RUNNING, worker_id, now + self.lease_seconds, now, execution_id),
        )
        return execution_id, moved_from

    def _worker_name(self, worker_id: str) -> str:
        row = self.db.execute("SELECT name FROM workers WHERE id = ?", (worker_id,)).fetchone()
        return str(row["name"]) if row is not None else ""

    def home_worker(self, session_id: str) -> str | None:
        """The name of the worker holding a project Session's checkout; None before its first
        claim, and for a Session without a project."""
        row = self.db.execute(
            "SELECT home_worker FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        return None if row is None or row["home_worker"] is None else str(row["home_worker"])

    def _claim_of(self, execution_id: str, moved_from: str | None = None) -> Claim:
        execution = self.db.execute(
            "SELECT * FROM executions WHERE id = ?", (execution_id,)
        ).fetchone()
        return Claim(
            execution_id=execution["id"],
            prompt=execution["prompt"],
            attempt=execution["attempts"],
            session=self.session(execution["session_id"]),
            lease_seconds=self.lease_seconds,
            request_id=execution["request_id"],
            moved_from=moved_from,
        )

    def _owned(self, execution_id: str, worker_id: str) -> sqlite3.Row:
        row: sqlite3.Row | None = self.db.execute(
            "SELECT * FROM executions WHERE id = ?", (execution_id,)
        ).fetchone()
        if row is None:
            raise no_such_execution(execution_id)
        if row["worker_id"] != worker_id or row["state"] != RUNNING:
            raise Conflict(
                "this worker no longer holds the execution's lease", execution_id=execution_id
            )
        return row

    async def heartbeat(self, execution_id: str, worker_id: str, wait: float = 0.0) -> bool:
        """Extend the lease; returns whether the turn's user asked to cancel it.

        With ``wait`` it is a long poll: it answers as soon as a cancel is asked for (or the
        lease is lost), else after ``wait`` seconds, so a Stop reaches the worker at once
        rather than at its next beat.

        Raises:
            Conflict: the lease was lost (the turn went elsewhere).
        """
        row = self._owned(execution_id, worker_id)
        now = self._clock()
        with self._state.transaction() as db:
            db.execute(
                "UPDATE executions SET lease_expires_at = ?, updated_at = ? WHERE id = ?",
                (now + self.lease_seconds, now, execution_id),
            )
            db.execute("UPDATE workers SET last_seen = ? WHERE id = ?", (now, worker_id))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not row["cancel_requested"]:
            remaining = deadline - loop.time()
            if remaining <= 0 or self._closing:
                break
            # Registered before the read, so a cancel between them still wakes it.
            waiter = self._watch_waiter(execution_id)
            try:
                row = self._owned(execution_id, worker_id)
                if not row["cancel_requested"]:
                    await self._wait(waiter, remaining)
            finally:
                self._drop_watch_waiter(execution_id, waiter)
        return bool(row["cancel_requested"])

    async def add_event(self, execution_id: str, worker_id: str, kind: str, text: str) -> int:
        """Record what the worker running the turn reports; returns the event's sequence
        number, or 0 when the turn is past its bound and the event was only counted.

        Raises:
            InvalidArgument: a kind a worker may not report. NotFound, Conflict: see
            ``lease_row``.
        """
        if kind not in WORKER_EVENT_KINDS:
            kinds = ", ".join(sorted(WORKER_EVENT_KINDS))
            raise InvalidArgument(f"event kind must be one of {kinds}")

        def append(db: sqlite3.Connection) -> int:
            self._owned(execution_id, worker_id)
            return self._bounded_event(db, execution_id, kind, text)

        seq = await self._state.write(append)
        # An event frees no Session: claims have nothing new to look at.
        await self._notify(execution_id, queue=False)
        return seq

    async def add_hub_event(
        self, execution_id: str, kind: str, text: str, *, bounded: bool = True
    ) -> int:
        """An event the Hub itself records for a turn (its memory calls): no lease to check.
        ``bounded`` false keeps it past the turn's bound (a memory change, which an undo needs)."""
        if bounded:
            seq = await self._state.write(
                lambda db: self._bounded_event(db, execution_id, kind, text)
            )
        else:
            seq = await self._state.write(
                lambda db: self._insert_event(db, execution_id, kind, cut_to_bytes(text))
            )
        await self._notify(execution_id, queue=False)
        return seq

    # What a turn's bound on events counts: everything a worker reports (progress, warnings,
    # statuses, refused hosts), which a hostile Agent or worker can make endless, and the
    # memory reads and searches its credential makes. Not counted, and never dropped:
    # ``approval`` events, since a dropped pending request would leave a person no button to
    # answer it and the Agent waiting for its timeout (each request waits for a decision; its
    # fields, and a turn's requests in number and bytes, have bounds of their own, past which
    # hub.approvals denies a request unasked instead); memory changes (saved, forgot), the
    # record the result card's undo goes back to, each a durable write the scope's quotas
    # bound; and the Hub's own statuses (a hand-back, a lost worker), a few per attempt.
    _BOUNDED_KINDS = (*sorted(WORKER_EVENT_KINDS), MEMORY)

    def _budget(self, db: sqlite3.Connection, execution_id: str) -> EventBudget:
        budget = self._budgets.get(execution_id)
        if budget is None:
            # Not claimed by this process (a memory call from a run before a restart, or
            # after its end): what the turn already recorded counts.
            marks = ", ".join("?" * len(self._BOUNDED_KINDS))
            row = db.execute(
                "SELECT COUNT(*) AS n, COALESCE(SUM(LENGTH(CAST(text AS BLOB))), 0) AS size "
                f"FROM execution_events WHERE execution_id = ? AND kind IN ({marks})",
                (execution_id, *self._BOUNDED_KINDS),
            ).fetchone()
            most, most_bytes = self._event_bounds()
            budget = EventBudget(most, most_bytes, int(row["n"]), int(row["size"]))
            self._budgets[execution_id] = budget
        return budget

    def _bounded_event(
        self, db: sqlite3.Connection, execution_id: str, kind: str, text: str
    ) -> int:
        """Append an event within the turn's bound, inside the caller's transaction; returns
        its sequence number, or 0 when it was only counted (the first such says so)."""
        text = cut_to_bytes(text)
        budget = self._budget(db, execution_id)
        if budget.admit(text_bytes(text)):
            return self._insert_event(db, execution_id, kind, text)
        if budget.first_drop:
            self._insert_event(db, execution_id, WARNING, budget.reached_notice())
        return 0

    def _close_budget(self, db: sqlite3.Connection, execution_id: str) -> None:
        """A finished turn's last word on the events its bound left out, if any."""
        budget = self._budgets.pop(execution_id, None)
        summary = budget.dropped_summary() if budget is not None else None
        if summary is not None:
            self._insert_event(db, execution_id, WARNING, summary)

    def _append_event(self, execution_id: str, kind: str, text: str) -> int:
        with self._state.transaction() as db:
            return self._insert_event(db, execution_id, kind, text)

    def _insert_event(self, db: sqlite3.Connection, execution_id: str, kind: str, text: str) -> int:
        """Append an event inside the caller's transaction; returns its sequence number."""
        row = db.execute(
            "SELECT COALESCE(MAX(seq), 0) AS last FROM execution_events WHERE execution_id = ?",
            (execution_id,),
        ).fetchone()
        seq = int(row["last"]) + 1
        db.execute(
            "INSERT INTO execution_events (execution_id, seq, kind, text, at) "
            "VALUES (?, ?, ?, ?, ?)",
            (execution_id, seq, kind, text, self._clock()),
        )
        return seq

    async def complete(self, execution_id: str, worker_id: str, outcome: TurnOutcome) -> Execution:
        """Finish the turn with what its worker reports, and record the model usage its
        gateway counted (``usage["gateway"]``) for whom it ran as, in the same commit."""

        def finish(db: sqlite3.Connection) -> tuple[str, Counted] | None:
            row = self._owned(execution_id, worker_id)
            # A turn that ends while it waits for an answer (cancelled, failed) settles it.
            for approval in lapse_pending(db, execution_id, self._clock()):
                self._insert_event(db, execution_id, APPROVAL, event_text(approval))
            self._close_budget(db, execution_id)
            if outcome.native_id:
                db.execute(
                    "UPDATE sessions SET native_id = ?, updated_at = ? WHERE id = ?",
                    (outcome.native_id, self._clock(), row["session_id"]),
                )
            if row["cancel_requested"] and not outcome.succeeded:
                error = outcome.error or "cancelled"
                self._finish(execution_id, CANCELLED, outcome.result, error)
            else:
                state = SUCCEEDED if outcome.succeeded else FAILED
                self._finish(execution_id, state, outcome.result, outcome.error)
            counted = counted_of(outcome.result.usage, execution_id) if outcome.result else None
            if counted is None:
                return None
            # The provider the Hub queued the turn for, not one the worker names.
            provider = self.session(row["session_id"]).provider
            record(db, row["runs_as"] or row["submitted_by"], provider, counted, self._clock())
            return provider, counted

        recorded = await self._state.write(finish)
        if recorded is not None:
            self.usage.recorded(*recorded)
        await self._notify(execution_id)
        return self.describe(execution_id)

    def _finish(
        self, execution_id: str, state: str, result: TurnResult | None, error: str | None
    ) -> None:
        self.db.execute(
            "UPDATE executions SET state = ?, result = ?, error = ?, lease_expires_at = NULL, "
            "updated_at = ? WHERE id = ?",
            (
                state,
                json.dumps(result.to_wire(), ensure_ascii=False) if result is not None else None,
                error,
                self._clock(),
                execution_id,
            ),
        )

    def _revoke_delegations(self, session_id: str) -> None:
        principal_id = self.session(session_id).principal_id
        label = delegation_label(session_id)
        for credential in self._state.credentials(principal_id):
            if (
                credential.kind == "delegated"
                and credential.label == label
                and credential.revoked_at is None
            ):
                self._state.revoke_credential(credential.id)

    async def expire_leases(self) -> int:
        """Retry or fail the turns of workers that stopped heart-beating; returns how many."""
        now = self._clock()
        rows = self.db.execute(
            "SELECT id, session_id, worker_id, attempts, cancel_requested FROM executions "
            "WHERE state = ? AND lease_expires_at < ?",
            (RUNNING, now),
        ).fetchall()
        for row in rows:
            # A SIGKILLed worker could not revoke its Agent's credential, and the Agent may
            # outlive it; it must not keep writing memory beside the retry.
            self._revoke_delegations(row["session_id"])
            self._lapse_approvals(row["id"])
            if row["cancel_requested"]:
                self._stop_unfinished(row["id"], STOPPED_LOST)
            elif row["attempts"] < MAX_ATTEMPTS:
                self.db.execute(
                    "UPDATE executions SET state = ?, worker_id = NULL, lease_expires_at = NULL, "
                    "updated_at = ? WHERE id = ?",
                    (QUEUED, now, row["id"]),
                )
                self._append_event(
                    row["id"], STATUS, "the worker running this turn was lost; retrying"
                )
                if self.connected_workers(besides=row["worker_id"]) == 0:
                    self._append_event(row["id"], STATUS, NO_WORKER)
            else:
                self._finish(
                    row["id"],
                    FAILED,
                    None,
                    "the worker running this turn stopped responding, and so did the retry",
                )
                self._append_event(row["id"], STATUS, "failed: the worker was lost")
                with self._state.transaction() as db:
                    self._close_budget(db, row["id"])
        stale = self._fail_unclaimed(now)
        if rows or stale:
            await self._notify()
        return len(rows) + stale

    def _stop_unfinished(self, execution_id: str, said: str) -> None:
        """End as cancelled a turn its user asked to stop whose run ended without reporting."""
        self._finish(execution_id, CANCELLED, None, "cancelled")
        self._append_event(execution_id, STATUS, said)
        with self._state.transaction() as db:
            self._close_budget(db, execution_id)

    def _fail_unclaimed(self, now: float) -> int:
        """Fail turns no worker took in time: a visible answer beats an endless wait."""
        rows = self.db.execute(
            "SELECT id FROM executions WHERE state = ? AND updated_at < ?",
            (QUEUED, now - self.queue_seconds),
        ).fetchall()
        minutes = max(1, round(self.queue_seconds / 60))
        for row in rows:
            self._finish(
                row["id"],
                FAILED,
                None,
                f"no Runtime worker took this turn within {minutes} min; start a worker and retry",
            )
            self._append_event(row["id"], STATUS, "failed: no Runtime worker took this turn")
        return len(rows)


def waits_for_worker(name: str, gone_seconds: float) -> str:
    """The status of a turn whose conversation's checkout is on a worker not connected now."""
    return (
        f"this conversation's checkout is on worker {name}; this turn waits until that worker "
        f"is connected, or until it has been away {_duration(gone_seconds)}, when another "
        "worker takes it from the conversation's branch"
    )


def moves_to_worker(gone: str, taker: str, gone_seconds: float) -> str:
    """The status of a turn whose conversation moves from its gone worker to another."""
    return (
        f"worker {gone}, which held this conversation's checkout, has not been seen for "
        f"{_duration(gone_seconds)}; worker {taker} takes this turn and makes the checkout "
        "again from the conversation's branch"
    )


def _duration(seconds: float) -> str:
    return f"{round(seconds / 60)} min" if seconds >= 120 else f"{round(seconds)} s"


def _project_exists(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM projects WHERE name = ?", (name,)).fetchone() is not None


def _wake(waiters: Iterable[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
