"""Schedules and triggers: turns that start on a clock or on a signed request, as their creator.

A schedule belongs to the Principal who created it and delivers into one chat. Its clock is a
cron expression (five fields, read by ``cronsim`` in the schedule's time zone, so a daily 09:00
stays 09:00 across daylight-saving changes) or one moment (``once``); a trigger has no clock and
fires when its signed request arrives.

Each firing is one row keyed by (schedule, scheduled time). The row that runs a turn is written
in the same commit that queues the turn (``Firing.record`` is handed to
``Executions.submit``), so a restart, a crash between the two, or a second scheduler loop can
neither run a firing twice nor lose it: the second insert of the key fails and takes its turn
with it. Firings passed while nothing ran are coalesced: the newest runs when it is inside the
grace window, the rest are one ``missed`` row with their count, said once in the chat.

Only the creator or the owner may change a schedule; anyone may list the schedules of a chat
they are in (the caller decides that). A schedule whose creator is gone pauses; three failed
runs in a row pause it too.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from hub.contract import provider_name_problem
from hub.errors import Conflict, Forbidden, InvalidArgument, NotFound, QuotaExceeded
from hub.executions import Recorder
from hub.principals import Principal
from hub.state import State

Kind = Literal["cron", "once", "trigger"]
Overlap = Literal["skip", "queue"]
Outcome = Literal["run", "skipped", "missed", "refused"]
ChatType = Literal["p2p", "group"]

MAX_NAME_CHARS = 80
MAX_PROMPT_BYTES = 16 * 1024
FAILURES_TO_PAUSE = 3
# How far ahead a cron's firings are read to find its shortest interval, and how many passed
# firings are counted before the rest are only "more".
_INTERVAL_SAMPLE = 64
_MAX_COUNTED = 10_000
_SCHEDULE_ID = re.compile(r"[0-9a-f]{12}")
_ONCE_FORMATS = ("%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S")

PAUSED_BY_FAILURES = "failures"
PAUSED_CREATOR_GONE = "creator_gone"
PAUSED_BY_PERSON = "paused"


@dataclass(frozen=True)
class ScheduleRules:
    """The owner's settings that bound schedules, read when they apply."""

    min_interval_seconds: int = 300
    max_per_principal: int = 20
    grace_seconds: int = 3600
    time_zone: str = "Asia/Shanghai"


@dataclass(frozen=True)
class Schedule:
    id: str
    name: str
    created_by: str
    chat_id: str
    chat_type: ChatType
    prompt: str
    provider: str
    kind: Kind
    spec: str
    time_zone: str
    overlap: Overlap
    paused: str | None
    failures: int
    next_run_at: float | None
    last_run_at: float | None
    last_result: str
    created_at: float

    @property
    def active(self) -> bool:
        return self.paused is None

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "created_by": self.created_by,
            "chat_id": self.chat_id,
            "chat_type": self.chat_type,
            "prompt": self.prompt,
            "provider": self.provider,
            "kind": self.kind,
            "spec": self.spec,
            "time_zone": self.time_zone,
            "overlap": self.overlap,
            "paused": self.paused,
            "failures": self.failures,
            "next_run_at": self.next_run_at,
            "last_run_at": self.last_run_at,
            "last_result": self.last_result,
            "created_at": self.created_at,
        }


@dataclass(frozen=True)
class Firing:
    """One moment a schedule is due: the newest passed time, and how many before it went by."""

    schedule: Schedule
    scheduled_at: float
    passed_over: int = 0
    # When the newest time is later than the first passed-over one, that first one's time.
    first_passed_at: float | None = None
    # Asked for by someone (Run now, a trigger's request), not due by the clock.
    asked: bool = False

    @property
    def key(self) -> str:
        """Stable for this firing everywhere (a Feishu message's idempotency key, a topic's)."""
        return f"{self.schedule.id}-{round(self.scheduled_at * 1000)}"

    def recorder(self, now: float) -> Recorder:
        """``record`` at ``now``, as ``Executions.submit`` takes it."""
        return lambda db, execution_id: self.record(db, execution_id, now)

    def record(self, db: sqlite3.Connection, execution_id: str, now: float) -> None:
        """Write that this firing ran ``execution_id``, inside the transaction that queues it.

        Raises:
            Conflict: this firing already ran (a second loop, or a retry after a crash).
        """
        try:
            db.execute(
                "INSERT INTO schedule_firings (schedule_id, scheduled_at, outcome, count, "
                "execution_id, recorded_at) VALUES (?, ?, 'run', 1, ?, ?)",
                (self.schedule.id, self.scheduled_at, execution_id, now),
            )
        except sqlite3.IntegrityError:
            raise Conflict("this firing already ran", firing=self.key) from None
        _advance(db, self.schedule, self.scheduled_at, now, ran=True, keep_clock=self.asked)
        if self.passed_over:
            _record_missed(
                db, self, self.first_passed_at or self.scheduled_at, self.passed_over, now
            )


@dataclass(frozen=True)
class Missed:
    """Firings recorded as missed that their chat has not been told of yet."""

    schedule: Schedule
    scheduled_at: float
    count: int


class Schedules:
    """The schedules and triggers in the Hub's state, and the rules they keep."""

    def __init__(
        self,
        state: State,
        providers: Callable[[], tuple[str, ...]],
        rules: Callable[[], ScheduleRules] = ScheduleRules,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._state = state
        self._providers = providers
        self._rules = rules
        self.clock = clock

    # -- reading ---------------------------------------------------------------------------------

    def get(self, schedule_id: str) -> Schedule:
        row = self._state.db.execute(
            "SELECT * FROM schedules WHERE id = ?", (schedule_id.strip(),)
        ).fetchone()
        if row is None:
            raise NotFound("no such schedule", schedule=schedule_id)
        return _schedule(row)

    def listed(
        self, *, chat_id: str | None = None, created_by: str | None = None
    ) -> list[Schedule]:
        clauses, args = [], []
        if chat_id is not None:
            clauses.append("chat_id = ?")
            args.append(chat_id)
        if created_by is not None:
            clauses.append("created_by = ?")
            args.append(created_by)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._state.db.execute(
            f"SELECT * FROM schedules {where} ORDER BY created_at, id", args
        ).fetchall()
        return [_schedule(row) for row in rows]

    def secret_of(self, schedule_id: str) -> str:
        """A trigger's signing secret, for checking a request; never shown after it is made."""
        row = self._state.db.execute(
            "SELECT secret FROM schedules WHERE id = ? AND kind = 'trigger'", (schedule_id,)
        ).fetchone()
        if row is None or not row["secret"]:
            raise NotFound("no such trigger", trigger=schedule_id)
        return str(row["secret"])

    # -- changing --------------------------------------------------------------------------------

    async def add(
        self,
        *,
        creator: Principal,
        chat_id: str,
        when: str,
        prompt: str,
        provider: str,
        chat_type: ChatType = "group",
        name: str = "",
        time_zone: str | None = None,
        overlap: Overlap = "skip",
    ) -> tuple[Schedule, str | None]:
        """A new schedule (``when``: a cron expression, a local time ``YYYY-MM-DD HH:MM``, or
        ``trigger``), and a trigger's secret (shown this once), else None.

        Raises:
            InvalidArgument: an unreadable ``when``, a time past, firings closer than the
                minimum interval, an empty or long prompt, an unknown provider or time zone.
            QuotaExceeded: the creator already has as many schedules as allowed.
        """
        rules = self._rules()
        zone_name = (time_zone or rules.time_zone).strip()
        zone = _zone(zone_name)
        kind, spec, next_run = self._read_when(when, zone, rules)
        if not prompt.strip():
            raise InvalidArgument("the schedule's prompt is empty")
        if len(prompt.encode("utf-8")) > MAX_PROMPT_BYTES:
            raise InvalidArgument(f"the schedule's prompt is longer than {MAX_PROMPT_BYTES} bytes")
        problem = provider_name_problem(provider)
        if problem is None and provider not in self._providers():
            problem = f"unknown provider {provider!r}; accepted: {', '.join(self._providers())}"
        if problem is not None:
            raise InvalidArgument(problem)
        if overlap not in ("skip", "queue"):
            raise InvalidArgument("overlap is skip or queue")
        if chat_type not in ("p2p", "group"):
            raise InvalidArgument("a schedule's chat is p2p or group")
        if not chat_id.strip():
            raise InvalidArgument("a schedule needs the chat its results go to")
        title = " ".join(name.split()) or _default_name(prompt)
        if len(title) > MAX_NAME_CHARS:
            raise InvalidArgument(f"the schedule's name is longer than {MAX_NAME_CHARS} characters")
        schedule_id = uuid.uuid4().hex[:12]
        secret = secrets.token_urlsafe(32) if kind == "trigger" else None
        now = self.clock()

        def insert(db: sqlite3.Connection) -> None:
            held = db.execute(
                "SELECT count(*) FROM schedules WHERE created_by = ?", (creator.id,)
            ).fetchone()[0]
            if rules.max_per_principal and held >= rules.max_per_principal:
                raise QuotaExceeded(
                    f"you already have {held} schedules, the most one person may have; "
                    "remove one first"
                )
            db.execute(
                "INSERT INTO schedules (id, name, created_by, chat_id, chat_type, prompt, "
                "provider, kind, spec, time_zone, overlap, next_run_at, secret, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    schedule_id,
                    title,
                    creator.id,
                    chat_id.strip(),
                    chat_type,
                    prompt,
                    provider,
                    kind,
                    spec,
                    zone_name,
                    overlap,
                    next_run,
                    secret,
                    now,
                ),
            )

        await self._state.write(insert)
        return self.get(schedule_id), secret

    async def pause(self, schedule_id: str, by: Principal) -> Schedule:
        schedule = self._changeable(schedule_id, by)
        await self._state.write(
            lambda db: db.execute(
                "UPDATE schedules SET paused = ? WHERE id = ?", (PAUSED_BY_PERSON, schedule.id)
            )
        )
        return self.get(schedule.id)

    async def resume(self, schedule_id: str, by: Principal) -> Schedule:
        """Active again, from now on: what it would have run while paused is not run."""
        schedule = self._changeable(schedule_id, by)
        next_run = self._next_after(schedule, self.clock())
        if schedule.kind == "once" and next_run is None:
            raise InvalidArgument("this one-time schedule's moment has passed; add a new one")
        await self._state.write(
            lambda db: db.execute(
                "UPDATE schedules SET paused = NULL, failures = 0, next_run_at = ? WHERE id = ?",
                (next_run, schedule.id),
            )
        )
        return self.get(schedule.id)

    async def remove(self, schedule_id: str, by: Principal) -> Schedule:
        schedule = self._changeable(schedule_id, by)

        def delete(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM schedule_firings WHERE schedule_id = ?", (schedule.id,))
            db.execute("DELETE FROM trigger_deliveries WHERE schedule_id = ?", (schedule.id,))
            db.execute("DELETE FROM schedules WHERE id = ?", (schedule.id,))

        await self._state.write(delete)
        return schedule

    async def rotate_secret(self, schedule_id: str, by: Principal) -> str:
        """A trigger's new secret (the old one stops working at once), shown this once."""
        schedule = self._changeable(schedule_id, by)
        if schedule.kind != "trigger":
            raise InvalidArgument("only a trigger has a secret")
        secret = secrets.token_urlsafe(32)
        await self._state.write(
            lambda db: db.execute(
                "UPDATE schedules SET secret = ? WHERE id = ?", (secret, schedule.id)
            )
        )
        return secret

    async def pause_for_gone_creators(self, present: Callable[[str], bool]) -> list[Schedule]:
        """Pause each active schedule whose creator ``present`` no longer finds; returns them."""
        gone = [s for s in self.listed() if s.active and not present(s.created_by)]
        if gone:
            await self._state.write(
                lambda db: db.executemany(
                    "UPDATE schedules SET paused = ? WHERE id = ?",
                    [(PAUSED_CREATOR_GONE, s.id) for s in gone],
                )
            )
        return [self.get(s.id) for s in gone]

    async def accept_delivery(
        self, schedule_id: str, signature: str, now: float, window_seconds: float
    ) -> bool:
        """Keep a trigger request's signature for the window its timestamp is good for; False
        when the same signed request came before (a replay)."""

        def write(db: sqlite3.Connection) -> bool:
            db.execute(
                "DELETE FROM trigger_deliveries WHERE received_at < ?", (now - 2 * window_seconds,)
            )
            try:
                db.execute(
                    "INSERT INTO trigger_deliveries (schedule_id, signature, received_at) "
                    "VALUES (?, ?, ?)",
                    (schedule_id, signature, now),
                )
            except sqlite3.IntegrityError:
                return False
            return True

        return bool(await self._state.write(write))

    # -- firing ----------------------------------------------------------------------------------

    def due(self) -> list[Firing]:
        """Every schedule whose next run has come (active ones), or whose run someone asked
        for (Run now, paused or not), as one firing each."""
        now = self.clock()
        rows = self._state.db.execute(
            "SELECT * FROM schedules WHERE (paused IS NULL AND next_run_at IS NOT NULL "
            "AND next_run_at <= ?) OR run_requested_at IS NOT NULL "
            "ORDER BY coalesce(run_requested_at, next_run_at), id",
            (now,),
        ).fetchall()
        firings = []
        for row in rows:
            schedule = _schedule(row)
            clock_due = schedule.active and (schedule.next_run_at or now + 1) <= now
            if clock_due or row["run_requested_at"] is None:
                firings.append(self._coalesce(schedule, now))
            else:
                firings.append(Firing(schedule, float(row["run_requested_at"]), asked=True))
        return firings

    async def request_run(self, schedule_id: str, by: Principal) -> Schedule:
        """Ask for one run now (the scheduler starts it within its next look); asking again
        before it started asks for the same run."""
        schedule = self._changeable(schedule_id, by)
        await self._state.write(
            lambda db: db.execute(
                "UPDATE schedules SET run_requested_at = coalesce(run_requested_at, ?) "
                "WHERE id = ?",
                (self.clock(), schedule.id),
            )
        )
        return self.get(schedule.id)

    def now_firing(self, schedule: Schedule) -> Firing:
        """A firing at this moment, for Run now and for a trigger's request."""
        return Firing(schedule, self.clock(), asked=True)

    def stale(self, firing: Firing) -> bool:
        """Whether the firing's time is older than the grace window: it is missed, not run."""
        return self.clock() - firing.scheduled_at > self._rules().grace_seconds

    async def record_skipped(self, firing: Firing, outcome: Literal["skipped", "missed"]) -> bool:
        """Record a firing that runs nothing; False when it was already recorded."""
        now = self.clock()

        def write(db: sqlite3.Connection) -> bool:
            try:
                if outcome == "missed":
                    first = firing.first_passed_at or firing.scheduled_at
                    _record_missed(db, firing, first, firing.passed_over + 1, now)
                else:
                    db.execute(
                        "INSERT INTO schedule_firings (schedule_id, scheduled_at, outcome, "
                        "count, recorded_at) VALUES (?, ?, 'skipped', 1, ?)",
                        (firing.schedule.id, firing.scheduled_at, now),
                    )
                    if firing.passed_over:
                        first = firing.first_passed_at or firing.scheduled_at
                        _record_missed(db, firing, first, firing.passed_over, now)
            except Conflict:
                return False
            except sqlite3.IntegrityError:
                return False
            _advance(
                db,
                firing.schedule,
                firing.scheduled_at,
                now,
                ran=False,
                result=outcome,
                keep_clock=firing.asked,
            )
            return True

        return bool(await self._state.write(write))

    def unsaid_missed(self) -> list[Missed]:
        rows = self._state.db.execute(
            "SELECT f.scheduled_at, f.count, s.* FROM schedule_firings f "
            "JOIN schedules s ON s.id = f.schedule_id "
            "WHERE f.outcome = 'missed' AND f.said_at IS NULL ORDER BY f.scheduled_at"
        ).fetchall()
        return [Missed(_schedule(row), row["scheduled_at"], row["count"]) for row in rows]

    async def said(self, missed: Missed) -> None:
        await self._state.write(
            lambda db: db.execute(
                "UPDATE schedule_firings SET said_at = ? WHERE schedule_id = ? "
                "AND scheduled_at = ?",
                (self.clock(), missed.schedule.id, missed.scheduled_at),
            )
        )

    def firing_of(self, execution_id: str) -> tuple[Schedule, float] | None:
        """The schedule and time whose firing ran this turn, if one did."""
        row = self._state.db.execute(
            "SELECT schedule_id, scheduled_at FROM schedule_firings WHERE execution_id = ?",
            (execution_id,),
        ).fetchone()
        if row is None:
            return None
        try:
            return self.get(row["schedule_id"]), float(row["scheduled_at"])
        except NotFound:
            return None

    def running_execution(self, schedule_id: str) -> str | None:
        """The turn of this schedule's latest run, for ``overlap: skip`` to ask whether it ended."""
        row = self._state.db.execute(
            "SELECT execution_id FROM schedule_firings WHERE schedule_id = ? AND outcome = 'run' "
            "ORDER BY scheduled_at DESC LIMIT 1",
            (schedule_id,),
        ).fetchone()
        return None if row is None else row["execution_id"]

    def unsettled(self) -> list[tuple[str, str]]:
        """(schedule id, turn id) of each run whose end has not been recorded yet."""
        rows = self._state.db.execute(
            "SELECT schedule_id, execution_id FROM schedule_firings WHERE outcome = 'run' "
            "AND settled_at IS NULL AND execution_id IS NOT NULL ORDER BY recorded_at"
        ).fetchall()
        return [(row["schedule_id"], row["execution_id"]) for row in rows]

    async def record_refused(self, firing: Firing, reason: str) -> Schedule | None:
        """Record a firing whose turn could not be queued (a budget spent, the chat refusing
        the bot): a failed run, so it is not tried again at every look. Returns the schedule
        when this failure paused it."""
        now = self.clock()

        def write(db: sqlite3.Connection) -> bool:
            try:
                db.execute(
                    "INSERT INTO schedule_firings (schedule_id, scheduled_at, outcome, count, "
                    "recorded_at, settled_at) VALUES (?, ?, 'refused', 1, ?, ?)",
                    (firing.schedule.id, firing.scheduled_at, now, now),
                )
            except sqlite3.IntegrityError:
                return False
            _advance(
                db, firing.schedule, firing.scheduled_at, now, ran=False, keep_clock=firing.asked
            )
            return _count_failure(db, firing.schedule.id, ok=False, result=reason)

        paused = await self._state.write(write)
        return self.get(firing.schedule.id) if paused else None

    async def finished(
        self, schedule_id: str, execution_id: str, *, ok: bool, result: str
    ) -> Schedule | None:
        """Record how a run ended, once; the schedule paused by its third failure in a row is
        returned (its creator is to be told), else None."""
        now = self.clock()

        def write(db: sqlite3.Connection) -> bool:
            settled = db.execute(
                "UPDATE schedule_firings SET settled_at = ? WHERE schedule_id = ? "
                "AND execution_id = ? AND settled_at IS NULL",
                (now, schedule_id, execution_id),
            ).rowcount
            if not settled:
                return False
            return _count_failure(db, schedule_id, ok=ok, result=result)

        paused = await self._state.write(write)
        return self.get(schedule_id) if paused else None

    # -- inside ----------------------------------------------------------------------------------

    def _changeable(self, schedule_id: str, by: Principal) -> Schedule:
        schedule = self.get(schedule_id)
        if schedule.created_by != by.id and not by.is_owner:
            raise Forbidden("only the schedule's creator or the owner may change it")
        return schedule

    def _read_when(
        self, when: str, zone: ZoneInfo, rules: ScheduleRules
    ) -> tuple[Kind, str, float | None]:
        text = " ".join(when.split())
        if text.lower() == "trigger":
            return "trigger", "", None
        moment = _local_moment(text, zone)
        if moment is not None:
            if moment.timestamp() <= self.clock():
                raise InvalidArgument(f"{text} has already passed in {zone.key}")
            return "once", moment.isoformat(), moment.timestamp()
        now = datetime.fromtimestamp(self.clock(), zone)
        try:
            times = CronSim(text, now)
            upcoming = [next(times) for _ in range(_INTERVAL_SAMPLE)]
        except (CronSimError, StopIteration) as error:
            raise InvalidArgument(
                f"{text!r} is neither a cron expression (five fields, e.g. '0 9 * * 1-5') nor a "
                f"time 'YYYY-MM-DD HH:MM': {error}"
            ) from None
        shortest = min(
            (b - a for a, b in zip(upcoming, upcoming[1:], strict=False)),
            default=timedelta.max,
        )
        if rules.min_interval_seconds and shortest < timedelta(seconds=rules.min_interval_seconds):
            raise InvalidArgument(
                f"{text!r} would run every {int(shortest.total_seconds())} s; schedules may run "
                f"at most every {rules.min_interval_seconds} s"
            )
        return "cron", text, upcoming[0].timestamp()

    def _next_after(self, schedule: Schedule, after: float) -> float | None:
        return _next_after(schedule, after)

    def _coalesce(self, schedule: Schedule, now: float) -> Firing:
        assert schedule.next_run_at is not None
        first = schedule.next_run_at
        if schedule.kind != "cron":
            return Firing(schedule, first)
        zone = _zone(schedule.time_zone)
        times = CronSim(schedule.spec, datetime.fromtimestamp(first, zone))
        newest, passed = first, 0
        for moment in times:
            stamp = moment.timestamp()
            if stamp > now or passed >= _MAX_COUNTED:
                break
            newest, passed = stamp, passed + 1
        return Firing(schedule, newest, passed, first if passed else None)


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """A trigger request's signature: ``sha256=`` and the hex HMAC-SHA256 of
    ``<timestamp>.<body>`` under the trigger's secret."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def signature_matches(secret: str, timestamp: str, body: bytes, signature: str) -> bool:
    return hmac.compare_digest(sign(secret, timestamp, body), signature.strip())


def schedule_id_problem(value: str) -> str | None:
    return None if _SCHEDULE_ID.fullmatch(value) else "a schedule id is 12 hexadecimal characters"


def _advance(
    db: sqlite3.Connection,
    schedule: Schedule,
    scheduled_at: float,
    now: float,
    *,
    ran: bool,
    result: str | None = None,
    keep_clock: bool = False,
) -> None:
    # A trigger's and a Run now's firing leave the clock where it was.
    if keep_clock or schedule.kind == "trigger":
        next_run = schedule.next_run_at
    else:
        next_run = _next_after(schedule, max(scheduled_at, now))
    # Whatever fires a schedule answers a Run now asked before it.
    db.execute(
        "UPDATE schedules SET next_run_at = ?, last_run_at = CASE WHEN ? THEN ? ELSE last_run_at "
        "END, last_result = COALESCE(?, last_result), run_requested_at = NULL WHERE id = ?",
        (next_run, ran, scheduled_at, result, schedule.id),
    )


def _count_failure(db: sqlite3.Connection, schedule_id: str, *, ok: bool, result: str) -> bool:
    """Count a run's end; True when it is the failure that pauses the schedule."""
    row = db.execute(
        "SELECT failures, paused FROM schedules WHERE id = ?", (schedule_id,)
    ).fetchone()
    if row is None:
        return False
    failures = 0 if ok else row["failures"] + 1
    pause = not ok and failures >= FAILURES_TO_PAUSE and row["paused"] is None
    db.execute(
        "UPDATE schedules SET failures = ?, last_result = ?, paused = "
        "CASE WHEN ? THEN ? ELSE paused END WHERE id = ?",
        (failures, result[:200], pause, PAUSED_BY_FAILURES, schedule_id),
    )
    return pause


def _record_missed(
    db: sqlite3.Connection, firing: Firing, first: float, count: int, now: float
) -> None:
    try:
        db.execute(
            "INSERT INTO schedule_firings (schedule_id, scheduled_at, outcome, count, "
            "recorded_at) VALUES (?, ?, 'missed', ?, ?)",
            (firing.schedule.id, first, count, now),
        )
    except sqlite3.IntegrityError:
        raise Conflict("this firing was already recorded", firing=firing.key) from None


def _next_after(schedule: Schedule, after: float) -> float | None:
    if schedule.kind == "once":
        moment = datetime.fromisoformat(schedule.spec).timestamp()
        return moment if moment > after else None
    if schedule.kind != "cron":
        return None
    zone = _zone(schedule.time_zone)
    return next(CronSim(schedule.spec, datetime.fromtimestamp(after, zone))).timestamp()


def _local_moment(text: str, zone: ZoneInfo) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
        for form in _ONCE_FORMATS:
            try:
                moment = datetime.strptime(text, form)
                break
            except ValueError:
                continue
    if moment is None:
        return None
    return moment.replace(tzinfo=zone) if moment.tzinfo is None else moment.astimezone(UTC)


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(
            f"unknown time zone {name!r}: use an IANA name such as Asia/Shanghai or UTC"
        ) from None


def _default_name(prompt: str) -> str:
    words = " ".join(prompt.split())
    return words if len(words) <= 40 else words[:39] + "…"


def _schedule(row: sqlite3.Row) -> Schedule:
    return Schedule(
        id=row["id"],
        name=row["name"],
        created_by=row["created_by"],
        chat_id=row["chat_id"],
        chat_type=row["chat_type"],
        prompt=row["prompt"],
        provider=row["provider"],
        kind=row["kind"],
        spec=row["spec"],
        time_zone=row["time_zone"],
        overlap=row["overlap"],
        paused=row["paused"],
        failures=row["failures"],
        next_run_at=row["next_run_at"],
        last_run_at=row["last_run_at"],
        last_result=row["last_result"],
        created_at=row["created_at"],
    )
