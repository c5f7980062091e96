"""Client-side pacing under Feishu's documented limits, so bursts wait instead of failing.

Feishu allows about 5 messages per second to one chat (or user), and each API its own 50 calls
per second and 1,000 per minute for the whole app; beyond that it answers 429 / rate-limit codes.
The app-wide windows are per API: replying, creating a card and updating one are counted apart
by Feishu, so a burst of updates never holds back the first reply of a new turn.
:class:`SlidingWindow` is the pure core (the clock is a parameter): it hands out send times so
that no window of ``period`` seconds holds more than ``limit`` calls per key. :class:`Pacer` is
the async shell.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable


class SlidingWindow:
    """Reserves call times: at most ``limit`` per ``period`` seconds for each key."""

    def __init__(self, limit: int, period: float, max_keys: int = 10_000) -> None:
        if limit < 1 or period <= 0:
            raise ValueError("limit must be >= 1 and period > 0")
        self.limit = limit
        self.period = period
        self._max_keys = max_keys
        self._calls: dict[str, deque[float]] = {}

    def reserve(self, key: str, now: float) -> float:
        """The earliest time (>= ``now``) the next call for ``key`` may go; it is booked."""
        calls = self._calls.setdefault(key, deque())
        while calls and calls[0] <= now - self.period:
            calls.popleft()
        start = now
        if len(calls) >= self.limit:
            start = max(now, calls[-self.limit] + self.period)
        calls.append(start)
        if len(self._calls) > self._max_keys:
            self._forget_idle(now)
        return start

    def admit(self, key: str, now: float) -> float:
        """Book a call for ``key`` at ``now`` if the window has room and answer 0; otherwise
        book nothing and answer the seconds until it will have room."""
        calls = self._calls.setdefault(key, deque())
        while calls and calls[0] <= now - self.period:
            calls.popleft()
        if len(calls) >= self.limit:
            return calls[-self.limit] + self.period - now
        calls.append(now)
        if len(self._calls) > self._max_keys:
            self._forget_idle(now)
        return 0.0

    def _forget_idle(self, now: float) -> None:
        for key in [k for k, calls in self._calls.items() if calls[-1] <= now - self.period]:
            del self._calls[key]


class Pacer:
    """Waits as long as the app-wide (per API) and per-receiver windows require."""

    def __init__(
        self,
        per_receiver: SlidingWindow | None = None,
        app_wide: SlidingWindow | None = None,
        clock: Callable[[], float] = time.monotonic,
        app_per_minute: SlidingWindow | None = None,
    ) -> None:
        self._per_receiver = per_receiver or SlidingWindow(5, 1.0)
        self._app_wide = app_wide or SlidingWindow(50, 1.0)
        self._app_per_minute = app_per_minute or SlidingWindow(1_000, 60.0)
        self._clock = clock

    async def wait(self, receiver: str = "", api: str = "") -> None:
        """Return when a call of ``api`` to ``receiver`` (empty: any other API call) may go."""
        now = self._clock()
        start = max(
            self._app_wide.reserve(api, now), self._app_per_minute.reserve(api, now)
        )
        if receiver:
            start = max(start, self._per_receiver.reserve(receiver, now))
        if start > now:
            await asyncio.sleep(start - now)
