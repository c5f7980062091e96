"""The queue of Agent turns: a turn no worker takes in time fails visibly; a drain hands back;
a long poll left behind by a worker that went away takes nothing; a turn asked to stop is never
run again, whether its worker is lost or the Hub restarts before the worker reports."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hub.executions import Executions
from hub.state import State


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_a_turn_no_worker_takes_in_time_fails_with_a_clear_error(tmp_path: Path) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        clock = Clock()
        executions = Executions(state, clock=clock, queue_seconds=600, providers=("claude",))
        alice = state.add_principal("alice")
        waiting, _ = await executions.submit(
            principal_id=alice.id, submitted_by=alice.id, provider="claude", prompt="hello"
        )
        clock.now += 599
        assert await executions.expire_leases() == 0
        assert executions.describe(waiting.id).state == "queued"

        clock.now += 2
        assert await executions.expire_leases() == 1
        failed = executions.describe(waiting.id)
        assert failed.state == "failed"
        assert "no Runtime worker took this turn within 10 min" in (failed.error or "")
        assert executions.events(waiting.id)[-1].text.startswith("failed: no Runtime worker")
    finally:
        state.close()


async def test_a_drain_claims_nothing_new_and_hands_running_turns_back_without_an_attempt(
    tmp_path: Path,
) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        executions = Executions(state, providers=("claude",))
        alice = state.add_principal("alice")
        runtime = state.add_principal("runtime", "service")
        worker = executions.register_worker("w", runtime.id)
        running, _ = await executions.submit(
            principal_id=alice.id, submitted_by=alice.id, provider="claude", prompt="first"
        )
        claimed = await executions.claim(worker, runtime.id, 0)
        assert claimed is not None and claimed.execution_id == running.id
        waiting, _ = await executions.submit(
            principal_id=alice.id, submitted_by=alice.id, provider="claude", prompt="second"
        )

        executions.stop_claiming()
        assert await executions.claim(worker, runtime.id, 0.05) is None
        assert executions.describe(waiting.id).state == "queued"
        assert executions.running_count() == 1
        assert await executions.wait_until_idle(0.05) is False

        assert await executions.hand_back() == [running.id]
        handed = executions.describe(running.id)
        assert (handed.state, handed.attempts) == ("queued", 0)
        last = executions.events(running.id)[-1].text
        assert "runs again from the start after the restart" in last
        assert await executions.wait_until_idle(0.05) is True
    finally:
        state.close()


async def test_a_long_poll_whose_worker_went_away_leases_nothing(tmp_path: Path) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        executions = Executions(state, providers=("claude",))
        alice = state.add_principal("alice")
        runtime = state.add_principal("runtime", "service")
        worker = executions.register_worker("w", runtime.id)
        connected = True
        polling = asyncio.create_task(executions.claim(worker, runtime.id, 10, lambda: connected))
        await asyncio.sleep(0)  # the poll starts and waits for work
        connected = False  # its worker was killed with the poll open
        waiting, _ = await executions.submit(
            principal_id=alice.id, submitted_by=alice.id, provider="claude", prompt="hello"
        )
        assert await asyncio.wait_for(polling, 5) is None
        assert executions.describe(waiting.id).state == "queued"
        # A worker that is still there gets it.
        claimed = await executions.claim(worker, runtime.id, 0)
        assert claimed is not None and claimed.execution_id == waiting.id
    finally:
        state.close()


async def test_a_stopped_turn_whose_worker_is_lost_ends_cancelled_and_is_not_retried(
    tmp_path: Path,
) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        clock = Clock()
        executions = Executions(state, clock=clock, lease_seconds=30, providers=("claude",))
        alice = state.add_principal("alice")
        runtime = state.add_principal("runtime", "service")
        worker = executions.register_worker("w", runtime.id)
        stopped, _ = await executions.submit(
            principal_id=alice.id, submitted_by=alice.id, provider="claude", prompt="stop me"
        )
        retried, _ = await executions.submit(
            principal_id=alice.id, submitted_by=alice.id, provider="claude", prompt="keep me"
        )
        assert await executions.claim(worker, runtime.id, 0) is not None
        assert await executions.claim(worker, runtime.id, 0) is not None
        await executions.cancel(stopped.id, by=alice.id)

        # The worker is lost before it reports either turn.
        clock.now += 31
        assert await executions.expire_leases() == 2
        ended = executions.describe(stopped.id)
        assert (ended.state, ended.cancelled_by) == ("cancelled", alice.id)
        assert "it is not retried" in executions.events(stopped.id)[-1].text
        assert executions.describe(retried.id).state == "queued"
        # Nothing is left for another worker but the turn nobody stopped.
        again = await executions.claim(worker, runtime.id, 0)
        assert again is not None and again.execution_id == retried.id
        assert await executions.claim(worker, runtime.id, 0) is None
    finally:
        state.close()


async def test_a_stopped_turn_still_running_at_a_restart_is_not_handed_back(
    tmp_path: Path,
) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        executions = Executions(state, providers=("claude",))
        alice = state.add_principal("alice")
        runtime = state.add_principal("runtime", "service")
        worker = executions.register_worker("w", runtime.id)
        stopped, _ = await executions.submit(
            principal_id=alice.id, submitted_by=alice.id, provider="claude", prompt="stop me"
        )
        assert await executions.claim(worker, runtime.id, 0) is not None
        await executions.cancel(stopped.id)

        executions.stop_claiming()
        assert await executions.hand_back() == [stopped.id]
        assert executions.describe(stopped.id).state == "cancelled"
        last = executions.events(stopped.id)[-1].text
        assert "it is not run again after the restart" in last
    finally:
        state.close()
