"""Holding a turn to its workspace bound while the Agent runs.

Without a quota on the workspace's file system, the bound is kept by measuring: every
``POLL_SECONDS`` while the Agent runs (off the event loop, with ``workspace_usage``'s walk that an
Agent cannot make costly) and once more when it ends. A turn whose workspace passes the bound
is stopped (its whole process group, as a cancel does) and fails naming the bound. No single
file can pass the bound between two measurements either: the launch's ``RLIMIT_FSIZE`` is the
bound, so one fast writer is refused by the kernel at it (``cgroups.rlimits``). Many files
written faster than a measurement can pass the bound by what is written in one interval.

Nothing is deleted: which files the Agent meant to keep is its user's to say. A turn that starts
with its workspace already past the bound (the last one was stopped, or the bound was lowered)
is therefore let run so that its user can have files removed: it is stopped only if the
workspace grows past what it held at the start.

A measurement walks the tree, so a big tree is measured less often: the watcher waits at least
``IDLE_SHARE`` times as long as the last measurement took, so it never takes more than a
fraction of one core however large the workspace is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

from runtime_bridge.workspace_usage import Usage, measure

E = TypeVar("E")

POLL_SECONDS = 0.5
IDLE_SHARE = 4.0
# The start of a turn measures the whole tree (bounded by its entries), not just up to the bound.
_WHOLE = 1 << 62


class WorkspaceGuard:
    """The workspace bound of one turn: ``start``, then the Agent's ``events``, then ``check``."""

    def __init__(self, path: Path, limit: int, poll: float = POLL_SECONDS) -> None:
        self.path = path
        self.limit = limit
        self.poll = poll
        self.ceiling = limit
        self.crowded_at_start = False
        self.reached: Usage | None = None

    async def start(self) -> Usage | None:
        """Measure before the Agent starts: the usage when it is already past the bound (the
        turn may then shrink the workspace but not grow it), else None.

        Raises:
            OSError: the workspace cannot be measured (see ``workspace_usage.measure``).
        """
        usage = await asyncio.to_thread(measure, self.path, self.limit)
        if not usage.over(self.limit):
            return None
        whole = await asyncio.to_thread(measure, self.path, _WHOLE)
        self.ceiling = max(self.limit, whole.used)
        self.crowded_at_start = whole.crowded
        return whole

    def _past(self, usage: Usage) -> bool:
        return usage.used > self.ceiling or (usage.crowded and not self.crowded_at_start)

    async def check(self) -> Usage | None:
        """One measurement: the usage when the workspace is past what this turn may hold, else
        None (also when it cannot be measured: a directory the Agent made unreadable to the
        worker is not a reason to stop it, and the tree it hides holds no more than it did)."""
        try:
            usage = await asyncio.to_thread(measure, self.path, self.ceiling)
        except OSError:
            return None
        if self._past(usage):
            self.reached = usage
            return usage
        return None

    async def events(self, source: AsyncIterator[E]) -> AsyncIterator[E]:
        """``source``'s events (the Agent's turn) to its end, or until the workspace is past the
        bound: then ``source`` is cancelled where it waits, which stops the Agent's process group
        as a cancel does, and the events end (``reached`` says why)."""
        pending: asyncio.Future[E] | None = None
        last = time.monotonic()
        wait = self.poll
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(anext(source))
                due = max(0.0, last + wait - time.monotonic())
                done, _ = await asyncio.wait({pending}, timeout=due)
                if done:
                    try:
                        event = pending.result()
                    except StopAsyncIteration:
                        return
                    pending = None
                    yield event
                    continue
                began = time.monotonic()
                if await self.check() is not None:
                    return
                last = time.monotonic()
                wait = max(self.poll, IDLE_SHARE * (last - began))
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await pending
            # The step may have ended just before the measurement did, leaving ``source`` at a
            # ``yield``: closing it runs its ``finally``, which stops the Agent.
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()
