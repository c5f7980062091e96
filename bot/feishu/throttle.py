"""Throttled in-place card updates, so a streaming Agent cannot exhaust Feishu's API quota.

Per message: at most one update per ``interval``; intermediate states are coalesced (only the
newest waits); the last state is always delivered; a final update goes out as soon as no other
update of that message is in flight, and updates of one message never overlap (so they cannot
arrive out of order). :class:`Coalescer` is the pure core (the clock is a parameter);
:class:`CardUpdateThrottle` is the async shell that sends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from cards.elements import Card

logger = logging.getLogger(__name__)


@dataclass
class _Slot:
    last_sent: float = float("-inf")
    pending: Card | None = None
    final: bool = False
    in_flight: bool = False
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


@dataclass(frozen=True)
class Due:
    key: str
    card: Card
    final: bool


class Coalescer:
    """Decides which card updates to send when; holds no I/O and reads no clock."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._slots: dict[str, _Slot] = {}

    def offer(self, key: str, card: Card, final: bool = False) -> None:
        """The newest state of ``key``; replaces any state not yet sent."""
        slot = self._slots.setdefault(key, _Slot())
        slot.pending = card
        slot.final = slot.final or final

    def take_due(self, now: float) -> list[Due]:
        """Updates to send now; each is marked in flight until :meth:`sent`."""
        due: list[Due] = []
        for key, slot in list(self._slots.items()):
            if slot.pending is None and not slot.in_flight and not slot.waiters:
                if now - slot.last_sent >= self.interval:
                    del self._slots[key]  # quiet for a whole interval: nothing to remember
                continue
            if slot.pending is None or slot.in_flight:
                continue
            if slot.final or now - slot.last_sent >= self.interval:
                due.append(Due(key, slot.pending, slot.final))
                slot.pending = None
                slot.in_flight = True
                slot.last_sent = now
        return due

    def sent(self, key: str) -> list[asyncio.Future[None]]:
        """An update of ``key`` finished; returns who waited for its final state, if it was."""
        slot = self._slots.get(key)
        if slot is None:
            return []
        slot.in_flight = False
        if slot.final and slot.pending is None:
            del self._slots[key]
            return slot.waiters
        return []

    def wait_final(self, key: str, waiter: asyncio.Future[None]) -> None:
        self._slots.setdefault(key, _Slot()).waiters.append(waiter)

    def next_deadline(self) -> float | None:
        """When the next pending update becomes due (``-inf`` means now)."""
        deadlines = [
            float("-inf") if slot.final else slot.last_sent + self.interval
            for slot in self._slots.values()
            if slot.pending is not None and not slot.in_flight
        ]
        return min(deadlines, default=None)

    def finalize_all(self) -> None:
        """Make every unsent state due at once (shutdown delivers the last state of each)."""
        for key, slot in list(self._slots.items()):
            if slot.pending is None and not slot.in_flight:
                del self._slots[key]
            else:
                slot.final = True

    @property
    def idle(self) -> bool:
        return not self._slots


class CardUpdateThrottle:
    """Sends card updates through ``send(message_id, card)`` at a bounded rate per message."""

    def __init__(
        self,
        send: Callable[[str, Card], Awaitable[None]],
        interval: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self._core = Coalescer(interval)
        self._clock = clock
        self._wake = asyncio.Event()
        self._sending: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()
        self._closing = False

    def update(self, message_id: str, card: Card) -> None:
        """Show ``card`` on ``message_id`` soon; newer calls supersede older unsent ones."""
        self._core.offer(message_id, card)
        self._kick()

    async def finish(self, message_id: str, card: Card) -> None:
        """Deliver the final ``card`` now (after any update in flight) and wait until it is.

        Raises what the send raised when the final state itself could not be delivered.
        """
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._core.offer(message_id, card, final=True)
        self._core.wait_final(message_id, waiter)
        self._kick()
        await waiter

    def _kick(self) -> None:
        if self._closing:
            raise RuntimeError("card update throttle is closed")
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(
                self._run(), name="feishu-card-throttle"
            )
        self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            for due in self._core.take_due(self._clock()):
                task = asyncio.get_running_loop().create_task(self._deliver(due))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)
            deadline = self._core.next_deadline()
            if deadline is None:
                await self._wake.wait()
                continue
            try:
                async with asyncio.timeout(max(0.0, deadline - self._clock())):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _deliver(self, due: Due) -> None:
        failure: Exception | None = None
        try:
            await self._send(due.key, due.card)
        except Exception as error:
            # The client already retried what is retryable; a later state may still land.
            logger.warning("card update of %s failed: %s", due.key, error)
            failure = error
        finally:
            # Whoever waits for a final state learns that it failed, so it can keep it owed.
            for waiter in self._core.sent(due.key):
                if waiter.done():
                    continue
                if failure is not None and due.final:
                    waiter.set_exception(failure)
                else:
                    waiter.set_result(None)
            self._settled.set()
            self._wake.set()

    async def close(self) -> None:
        """Deliver the last unsent state of every message at once, then stop."""
        self._core.finalize_all()
        if self._runner is not None:
            self._wake.set()
            while not self._core.idle:
                self._settled.clear()
                await self._settled.wait()
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        self._closing = True
