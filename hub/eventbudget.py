"""How much of what a turn reports the Hub keeps: a bound per event and per turn (pure).

Every event a worker reports (progress, warnings, statuses, refused network hosts) and every
memory read or search the turn's credential makes is one row of the state database. The Agent
decides how many it prints and how long they are, so each event is cut at ``MAX_EVENT_BYTES``
and each turn keeps at most ``agents.max_events_per_turn`` of them and
``agents.max_event_bytes_per_turn`` bytes of their text. Past either bound the rest is counted,
not kept: one warning says the bound was reached as it is, and one more, when the turn
finishes, how many events and bytes were left out. The turn itself goes on; its answer is its
result, not an event, and is kept whole.
"""

from __future__ import annotations

from dataclasses import dataclass

# One event's text at most, in UTF-8 bytes (a progress card shows far less of it).
MAX_EVENT_BYTES = 16 * 1024
DEFAULT_MAX_EVENTS = 2000
DEFAULT_MAX_BYTES = 4 * 1024 * 1024


def cut_to_bytes(text: str, limit: int = MAX_EVENT_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, never inside a character."""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return text
    return encoded[:limit].decode("utf-8", "ignore")


def text_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@dataclass
class EventBudget:
    """One turn's bounded events: what was kept and what was left out."""

    max_events: int
    max_bytes: int
    kept_events: int = 0
    kept_bytes: int = 0
    dropped_events: int = 0
    dropped_bytes: int = 0

    def admit(self, size: int) -> bool:
        """Whether an event of ``size`` bytes is kept; counted either way."""
        if self.kept_events < self.max_events and self.kept_bytes + size <= self.max_bytes:
            self.kept_events += 1
            self.kept_bytes += size
            return True
        self.dropped_events += 1
        self.dropped_bytes += size
        return False

    @property
    def first_drop(self) -> bool:
        """Whether the event just refused was the first one: the moment to say so."""
        return self.dropped_events == 1

    def reached_notice(self) -> str:
        return (
            f"this turn reached its bound of {self.max_events} events or "
            f"{_size(self.max_bytes)} of progress; further progress is not recorded "
            "(the turn goes on, and its answer is kept)"
        )

    def dropped_summary(self) -> str | None:
        """The last word on what was left out; None when nothing was."""
        if not self.dropped_events:
            return None
        return (
            f"{self.dropped_events} more event(s), {_size(self.dropped_bytes)}, were not "
            f"recorded: past this turn's bound of {self.max_events} events or "
            f"{_size(self.max_bytes)}"
        )


def _size(count: int) -> str:
    if count >= 1024 * 1024:
        return f"{count / (1024 * 1024):.1f} MiB"
    if count >= 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count} bytes"
