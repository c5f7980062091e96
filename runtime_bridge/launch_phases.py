"""What a turn's launch phases share: the turn's state, and the one ordering rule they need.

Each phase of ``Worker._launch`` opens what it needs and registers its own cleanup on the turn's
``contextlib.AsyncExitStack``, so a phase that fails unwinds exactly the phases before it, last
opened first. What the turn concludes once the Agent's run is over (its verdicts, its branch)
must come after the run's own cleanups and before the turn's: ``after_clean_exit`` registers it
at that depth of the stack.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from hub.contract import Claim, TurnOutcome


@dataclasses.dataclass
class Turn:
    """One claimed turn, as its phases fill it in."""

    claimed: Claim
    run_dir: Path
    # Said on the turn's card, in order; a failed launch reports those said so far.
    warnings: list[str] = dataclasses.field(default_factory=list)
    run_as: tuple[int, int] | None = None
    credential_id: str | None = None
    # What the Agent's run yielded (masked).
    text: str | None = None
    native_id: str | None = None
    usage: dict[str, Any] = dataclasses.field(default_factory=dict)
    failure: str | None = None
    # The bounds the launch's group reached, read as the group is removed.
    reached: tuple[str, ...] = ()
    outcome: TurnOutcome | None = None

    @property
    def execution_id(self) -> str:
        return self.claimed.execution_id


def after_clean_exit(
    stack: contextlib.AsyncExitStack[bool | None], step: Callable[[], Awaitable[None]]
) -> None:
    """Run ``step`` when ``stack`` unwinds to this point, once everything registered after it
    has been cleaned up, and only if nothing failed or was cancelled on the way: a turn's
    verdicts are read from a run that ended, not one that broke off."""

    async def exit_(
        kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> bool:
        if kind is None:
            await step()
        return False

    stack.push_async_exit(exit_)
