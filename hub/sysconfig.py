"""Hub-wide settings: the saved value (edited any time) and the running value (fixed at start).

A change takes effect only when the Hub restarts, so every running Runtime and conversation sees
one consistent policy; cards and the CLI show both values and whether a restart is pending.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hub.errors import InvalidArgument
from hub.state import State


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


@dataclass(frozen=True)
class SettingSpec:
    key: str
    default: Any
    parse: Callable[[object], Any]
    meaning: str


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
    )
}


class SystemConfig:
    """Saved settings in the state database, and the snapshot this process runs with."""

    def __init__(self, state: State) -> None:
        self._state = state
        self.running: dict[str, Any] = self.saved()

    def saved(self) -> dict[str, Any]:
        stored = self._state.saved_settings()
        return {key: stored.get(key, spec.default) for key, spec in SPECS.items()}

    def describe(self) -> dict[str, dict[str, Any]]:
        saved = self.saved()
        return {
            key: {
                "saved": saved[key],
                "running": self.running[key],
                "restart_pending": saved[key] != self.running[key],
            }
            for key in SPECS
        }

    def save(self, key: object, value: object) -> dict[str, Any]:
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
