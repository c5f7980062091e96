"""Hub-wide settings: the saved value (edited any time) and the running value (fixed at start).

A change takes effect only when the Hub restarts, so every running Runtime and conversation sees
one consistent policy; cards and the CLI show both values and whether a restart is pending.
The Agents' permission settings, the token budgets and how long project checkouts are kept are
the exception: they apply to every turn started after the change (a turn reads them when a worker
takes it), so they never wait for a restart.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from hub.errors import InvalidArgument
from hub.eventbudget import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS
from hub.schedules import ScheduleRules
from hub.state import State

# What a setting holds: a switch, a number or a word, as saved in the state database.
SettingValue = bool | int | str


def _parse_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "on", "yes", "1"):
        return True
    if isinstance(raw, str) and raw.strip().lower() in ("false", "off", "no", "0"):
        return False
    raise InvalidArgument("expected true or false")


def _parse_isolation(raw: object) -> str:
    if isinstance(raw, bool):
        return "on" if raw else "off"
    if isinstance(raw, str) and raw.strip().lower() in ("on", "off"):
        return raw.strip().lower()
    raise InvalidArgument("expected on or off")


MAX_HISTORY_DAYS = 3650


def _parse_days(raw: object) -> int:
    if isinstance(raw, bool):
        raise InvalidArgument(f"expected a whole number of days from 0 to {MAX_HISTORY_DAYS}")
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, int) and 0 <= raw <= MAX_HISTORY_DAYS:
        return raw
    raise InvalidArgument(f"expected a whole number of days from 0 to {MAX_HISTORY_DAYS}")


MAX_LIMIT = 10_000


def _parse_limit(raw: object) -> int:
    """A whole number from 0 (no limit) to MAX_LIMIT."""
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= MAX_LIMIT:
        return raw
    raise InvalidArgument(f"expected a whole number from 0 (no limit) to {MAX_LIMIT}")


# Far above any day of model use, and low enough that sums stay within SQLite's integers.
MAX_TOKENS = 1 << 40


def _parse_tokens(raw: object) -> int:
    """A whole number of tokens from 0 (no limit) to MAX_TOKENS."""
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= MAX_TOKENS:
        return raw
    raise InvalidArgument(f"expected a whole number of tokens from 0 (no limit) to {MAX_TOKENS}")


PERMISSION_POLICIES = ("ask", "auto", "read-only")


def _parse_permissions(raw: object) -> str:
    if isinstance(raw, str) and raw.strip().lower() in PERMISSION_POLICIES:
        return raw.strip().lower()
    raise InvalidArgument(f"expected one of {', '.join(PERMISSION_POLICIES)}")


MIN_APPROVAL_SECONDS = 1
MAX_APPROVAL_SECONDS = 24 * 3600


def _parse_approval_timeout(raw: object) -> int:
    """Seconds, written as a whole number or with a unit: ``90``, ``90s``, ``10m``, ``1h``."""
    problem = f"expected a duration from {MIN_APPROVAL_SECONDS} s to 24 h, such as 600, 10m or 1h"
    seconds: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        seconds = raw
    elif isinstance(raw, str):
        text = raw.strip().lower()
        units = {"s": 1, "m": 60, "h": 3600}
        unit = units.get(text[-1:], 0)
        digits = text[:-1] if unit else text
        if digits.isdigit():
            seconds = int(digits) * (unit or 1)
    if seconds is None or not MIN_APPROVAL_SECONDS <= seconds <= MAX_APPROVAL_SECONDS:
        raise InvalidArgument(problem)
    return seconds


MAX_WORKTREE_DAYS = 3650


def _parse_worktree_days(raw: object) -> int:
    """Days from 1 to MAX_WORKTREE_DAYS: a checkout in use is never removed."""
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, int) and not isinstance(raw, bool) and 1 <= raw <= MAX_WORKTREE_DAYS:
        return raw
    raise InvalidArgument(f"expected a whole number of days from 1 to {MAX_WORKTREE_DAYS}")


MAX_EVENTS_PER_TURN = 1_000_000
MAX_EVENT_BYTES_PER_TURN = 1 << 30
_BYTE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _parse_event_count(raw: object) -> int:
    """A whole number of events from 1 to MAX_EVENTS_PER_TURN: a bound that cannot be lifted,
    since it is what keeps one turn from filling the state database."""
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, int) and not isinstance(raw, bool) and 1 <= raw <= MAX_EVENTS_PER_TURN:
        return raw
    raise InvalidArgument(f"expected a whole number of events from 1 to {MAX_EVENTS_PER_TURN}")


def _parse_event_bytes(raw: object) -> int:
    """Bytes from 1 to 1 GiB, written as a whole number or with a unit: ``4194304``, ``512k``,
    ``4m``, ``1g``."""
    problem = "expected a size from 1 byte to 1g, such as 4194304, 512k or 4m"
    size: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        size = raw
    elif isinstance(raw, str):
        written = raw.strip().lower().removesuffix("b").removesuffix("i")
        unit = _BYTE_UNITS.get(written[-1:], 0)
        digits = written[:-1] if unit else written
        if digits.isdigit():
            size = int(digits) * (unit or 1)
    if size is None or not 1 <= size <= MAX_EVENT_BYTES_PER_TURN:
        raise InvalidArgument(problem)
    return size


MIN_SCHEDULE_INTERVAL = 60
MAX_SCHEDULE_SECONDS = 7 * 24 * 3600


def _parse_schedule_interval(raw: object) -> int:
    problem = (
        f"expected a whole number of seconds from {MIN_SCHEDULE_INTERVAL} to {MAX_SCHEDULE_SECONDS}"
    )
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, int) and not isinstance(raw, bool):
        if MIN_SCHEDULE_INTERVAL <= raw <= MAX_SCHEDULE_SECONDS:
            return raw
    raise InvalidArgument(problem)


MIN_GRACE_SECONDS = 60


def _parse_grace(raw: object) -> int:
    # Under a minute, a run looked at a moment after its time would count as missed.
    problem = (
        f"expected a whole number of seconds from {MIN_GRACE_SECONDS} to {MAX_SCHEDULE_SECONDS}"
    )
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, int) and not isinstance(raw, bool):
        if MIN_GRACE_SECONDS <= raw <= MAX_SCHEDULE_SECONDS:
            return raw
    raise InvalidArgument(problem)


def _parse_zone(raw: object) -> str:
    if isinstance(raw, str):
        try:
            return ZoneInfo(raw.strip()).key
        except (ZoneInfoNotFoundError, ValueError):
            pass
    raise InvalidArgument("expected an IANA time zone such as Asia/Shanghai or UTC")


@dataclass(frozen=True)
class SettingSpec:
    key: str
    default: SettingValue
    parse: Callable[[object], SettingValue]
    meaning: str
    # Applies to what starts after the change, without a restart.
    live: bool = False


@dataclass(frozen=True)
class SettingView:
    """One setting as cards and the CLI show it: the saved value, the one this process runs
    with, and whether it applies without a restart."""

    key: str
    saved: SettingValue
    running: SettingValue
    live: bool = False

    @property
    def restart_pending(self) -> bool:
        return not self.live and self.saved != self.running

    def to_wire(self) -> dict[str, object]:
        wire: dict[str, object] = {
            "saved": self.saved,
            "running": self.running,
            "restart_pending": self.restart_pending,
        }
        if self.live:
            wire["live"] = True
        return wire


SPECS: dict[str, SettingSpec] = {
    spec.key: spec
    for spec in (
        SettingSpec("memory.enabled", False, _parse_bool, "Agent memory experiment (true|false)"),
        SettingSpec(
            "memory.isolation",
            "off",
            _parse_isolation,
            "off: one global memory; on: one memory per authenticated Principal",
        ),
        SettingSpec(
            "memory.history_days",
            30,
            _parse_days,
            "days an overwritten or forgotten document stays restorable (0: keep no history)",
        ),
        SettingSpec(
            "turns.max_queued_per_principal",
            5,
            _parse_limit,
            "turns one Principal may have waiting for a worker; more are refused (0: no cap)",
        ),
        SettingSpec(
            "feishu.messages_per_minute",
            10,
            _parse_limit,
            "messages one Feishu sender may start turns with per minute (0: no limit)",
        ),
        SettingSpec(
            "agents.permissions",
            "ask",
            _parse_permissions,
            "ask: edits and changing commands wait for their user's approval; auto: everything "
            "inside the sandbox runs; read-only: the workspace cannot be changed "
            "(applies to turns started after the change)",
            live=True,
        ),
        SettingSpec(
            "agents.approval_timeout",
            600,
            _parse_approval_timeout,
            "seconds a permission request waits for an answer before it is denied "
            "(applies to requests made after the change)",
            live=True,
        ),
        SettingSpec(
            "agents.max_events_per_turn",
            DEFAULT_MAX_EVENTS,
            _parse_event_count,
            "progress events, warnings and memory reads one turn's record keeps; the rest are "
            "counted in one last warning (applies to turns started after the change)",
            live=True,
        ),
        SettingSpec(
            "agents.max_event_bytes_per_turn",
            DEFAULT_MAX_BYTES,
            _parse_event_bytes,
            "bytes of those events one turn's record keeps, such as 4m; the rest are counted "
            "in one last warning (applies to turns started after the change)",
            live=True,
        ),
        SettingSpec(
            "budget.daily_tokens",
            0,
            _parse_tokens,
            "model tokens (input and output) one Principal's turns may use per UTC day "
            "(0: no limit; applies to turns started after the change)",
            live=True,
        ),
        SettingSpec(
            "budget.turn_tokens",
            0,
            _parse_tokens,
            "model tokens (input and output) one turn may use "
            "(0: no limit; applies to turns started after the change)",
            live=True,
        ),
        SettingSpec(
            "projects.worktree_days",
            14,
            _parse_worktree_days,
            "days a project conversation's checkout may go unused before its worker removes it "
            "(its branch stays; applies from the next turn a worker takes)",
            live=True,
        ),
        SettingSpec(
            "schedules.min_interval_seconds",
            300,
            _parse_schedule_interval,
            "the shortest time between two runs of one schedule (applies to schedules added "
            "after the change)",
            live=True,
        ),
        SettingSpec(
            "schedules.max_per_principal",
            20,
            _parse_limit,
            "schedules and triggers one Principal may have (0: no cap; applies to schedules "
            "added after the change)",
            live=True,
        ),
        SettingSpec(
            "schedules.grace_seconds",
            3600,
            _parse_grace,
            "how late a schedule's run may still start after the Hub was down; older runs are "
            "reported as missed",
            live=True,
        ),
        SettingSpec(
            "schedules.time_zone",
            "Asia/Shanghai",
            _parse_zone,
            "the time zone a schedule's clock is read in when its creator names none",
            live=True,
        ),
    )
}


def _value(stored: object, spec: SettingSpec) -> SettingValue:
    # Saved only after its spec parsed it; anything else is no value of ours.
    return stored if isinstance(stored, bool | int | str) else spec.default


class SystemConfig:
    """Saved settings in the state database, and the snapshot this process runs with."""

    def __init__(self, state: State) -> None:
        self._state = state
        self.running: dict[str, SettingValue] = self.saved()

    def saved(self) -> dict[str, SettingValue]:
        stored = self._state.saved_settings()
        return {key: _value(stored.get(key), spec) for key, spec in SPECS.items()}

    def revision(self) -> str:
        """A digest of the saved values a restart applies, the ones the `/amux` card drafts and
        saves together: a card carries the revision it was built from, so a stale card's Save
        is refused instead of putting back what was changed since (from the CLI, or another
        card)."""
        saved = self.saved()
        restarted = {key: saved[key] for key, spec in SPECS.items() if not spec.live}
        encoded = json.dumps(restarted, sort_keys=True).encode("utf-8")
        return hashlib.sha256(encoded).hexdigest()[:16]

    def describe(self) -> dict[str, SettingView]:
        """Every setting by key, in the order of ``SPECS``."""
        saved = self.saved()
        return {
            key: SettingView(
                key, saved[key], saved[key] if spec.live else self.running[key], spec.live
            )
            for key, spec in SPECS.items()
        }

    def _live(self, key: str) -> SettingValue:
        # Read at each use: a live setting's saved value is its running value.
        return _value(self._state.saved_settings().get(key), SPECS[key])

    @property
    def permissions(self) -> str:
        return str(self._live("agents.permissions"))

    @property
    def approval_timeout(self) -> int:
        return int(self._live("agents.approval_timeout"))

    @property
    def max_events_per_turn(self) -> int:
        return int(self._live("agents.max_events_per_turn"))

    @property
    def max_event_bytes_per_turn(self) -> int:
        return int(self._live("agents.max_event_bytes_per_turn"))

    @property
    def daily_tokens(self) -> int:
        return int(self._live("budget.daily_tokens"))

    @property
    def turn_tokens(self) -> int:
        return int(self._live("budget.turn_tokens"))

    @property
    def worktree_days(self) -> int:
        return int(self._live("projects.worktree_days"))

    def schedule_rules(self) -> ScheduleRules:
        return ScheduleRules(
            min_interval_seconds=int(self._live("schedules.min_interval_seconds")),
            max_per_principal=int(self._live("schedules.max_per_principal")),
            grace_seconds=int(self._live("schedules.grace_seconds")),
            time_zone=str(self._live("schedules.time_zone")),
        )

    def save(self, key: object, value: object) -> SettingView:
        """Validate and save one setting; the running value is untouched until restart.

        Raises:
            InvalidArgument: unknown key or a value of the wrong kind.
        """
        spec = SPECS.get(key) if isinstance(key, str) else None
        if spec is None:
            raise InvalidArgument(f"unknown setting; known settings: {', '.join(SPECS)}", key=key)
        try:
            parsed = spec.parse(value)
        except InvalidArgument as err:
            raise InvalidArgument(f"{spec.key}: {err.message}") from None
        self._state.save_setting(spec.key, parsed)
        return self.describe()[spec.key]

    @property
    def memory_enabled(self) -> bool:
        return bool(self.running["memory.enabled"])

    @property
    def history_days(self) -> int:
        return int(self.running["memory.history_days"])

    @property
    def max_queued_per_principal(self) -> int:
        return int(self.running["turns.max_queued_per_principal"])

    @property
    def messages_per_minute(self) -> int:
        return int(self.running["feishu.messages_per_minute"])

    @property
    def isolation(self) -> bool:
        return str(self.running["memory.isolation"]) == "on"
