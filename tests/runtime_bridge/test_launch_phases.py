"""A turn's phases unwind last opened first, and its conclusion comes between the run's cleanups
and the turn's, only for a run that ended."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from runtime_bridge.launch_phases import after_clean_exit


class PhaseFailed(Exception):
    pass


async def turn(
    done: list[str], fail_in: str | None = None, running: asyncio.Event | None = None
) -> None:
    """Phases as ``Worker._launch`` orders them: the turn's own, the conclusion, the run's; with
    ``running``, the run says it started and waits to be stopped."""

    async def phase(name: str, stack: contextlib.AsyncExitStack[bool | None]) -> None:
        if name == fail_in:
            raise PhaseFailed(name)
        if name == "run":
            if running is not None:
                running.set()
                await asyncio.Event().wait()
            return
        stack.callback(done.append, f"close {name}")

    async def conclude() -> None:
        done.append("conclude")

    async with contextlib.AsyncExitStack() as stack:
        await phase("grant", stack)
        await phase("memory", stack)
        after_clean_exit(stack, conclude)
        await phase("group", stack)
        await phase("doors", stack)
        await phase("run", stack)


def test_a_run_that_ended_concludes_after_its_own_phases_and_before_the_turns() -> None:
    done: list[str] = []
    asyncio.run(turn(done))
    assert done == [
        "close doors",
        "close group",
        "conclude",
        "close memory",
        "close grant",
    ]


@pytest.mark.parametrize(
    ("failing", "closed"),
    [
        ("grant", []),
        ("memory", ["close grant"]),
        ("group", ["close memory", "close grant"]),
        ("run", ["close doors", "close group", "close memory", "close grant"]),
    ],
)
def test_a_failing_phase_unwinds_the_phases_before_it_last_first_without_concluding(
    failing: str, closed: list[str]
) -> None:
    done: list[str] = []
    with pytest.raises(PhaseFailed):
        asyncio.run(turn(done, fail_in=failing))
    assert done == closed


def test_a_cancelled_run_is_cleaned_up_without_concluding() -> None:
    done: list[str] = []

    async def stopped() -> None:
        running = asyncio.Event()
        task = asyncio.create_task(turn(done, running=running))
        await running.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(stopped())
    assert done == ["close doors", "close group", "close memory", "close grant"]


def test_a_failing_cleanup_of_the_run_skips_the_conclusion_and_still_closes_the_turn() -> None:
    done: list[str] = []

    async def broken() -> None:
        async def conclude() -> None:
            done.append("conclude")

        async with contextlib.AsyncExitStack() as stack:
            stack.callback(done.append, "close grant")
            after_clean_exit(stack, conclude)

            def fail() -> None:
                raise PhaseFailed("group")

            stack.callback(fail)

    with pytest.raises(PhaseFailed):
        asyncio.run(broken())
    assert done == ["close grant"]
