"""The queue of Agent turns: a turn no worker takes in time fails visibly."""

from __future__ import annotations

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
