"""Schedules in the Hub's state: when they fire, that a firing runs at most once whatever crashes
or loops race, what passed while nothing ran, and who may change them."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from hub.errors import Conflict, Forbidden, InvalidArgument, QuotaExceeded
from hub.executions import Executions
from hub.principals import Principal
from hub.schedules import (
    FAILURES_TO_PAUSE,
    PAUSED_BY_FAILURES,
    PAUSED_CREATOR_GONE,
    Firing,
    Schedule,
    ScheduleRules,
    Schedules,
    sign,
    signature_matches,
)
from hub.state import State

SHANGHAI = ZoneInfo("Asia/Shanghai")


class Clock:
    def __init__(self, at: datetime) -> None:
        self.now = at.timestamp()

    def __call__(self) -> float:
        return self.now

    def at(self, text: str, zone: ZoneInfo = SHANGHAI) -> None:
        self.now = datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


@dataclass
class World:
    state: State
    clock: Clock
    schedules: Schedules
    executions: Executions
    alice: Principal
    bob: Principal
    owner: Principal
    rules: list[ScheduleRules]

    async def run(self, firing: Firing) -> str:
        """Queue the firing's turn as the scheduler does: the firing's row in the same commit."""
        execution, _ = await self.executions.submit(
            principal_id=firing.schedule.created_by,
            submitted_by=firing.schedule.created_by,
            provider=firing.schedule.provider,
            prompt=firing.schedule.prompt,
            record=lambda db, execution_id: firing.record(db, execution_id, self.clock()),
        )
        return execution.id

    def turns(self) -> int:
        return int(self.state.db.execute("SELECT count(*) FROM executions").fetchone()[0])


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    state = State(tmp_path / "state.sqlite3")
    clock = Clock(datetime(2026, 12, 7, 8, 0, tzinfo=SHANGHAI))  # a Monday
    rules = [ScheduleRules()]
    executions = Executions(state, clock=clock, providers=("claude", "pi"))
    schedules = Schedules(state, lambda: ("claude", "pi"), lambda: rules[0], clock)
    try:
        yield World(
            state,
            clock,
            schedules,
            executions,
            state.add_principal("alice"),
            state.add_principal("bob"),
            state.add_principal("olivia", owner=True),
            rules,
        )
    finally:
        state.close()


async def daily(world: World, when: str = "0 9 * * *") -> str:
    schedule, secret = await world.schedules.add(
        creator=world.alice, chat_id="oc_team", when=when, prompt="report", provider="claude"
    )
    assert secret is None
    return schedule.id


async def test_a_daily_schedule_is_due_at_its_local_time_and_then_the_next_day(
    world: World,
) -> None:
    schedule_id = await daily(world)
    assert world.schedules.due() == []
    world.clock.at("2026-12-07T09:00:00")
    (firing,) = world.schedules.due()
    assert firing.scheduled_at == world.clock.now and firing.passed_over == 0
    await world.run(firing)
    assert world.schedules.due() == []
    after = world.schedules.get(schedule_id)
    assert after.last_run_at == world.clock.now
    assert after.next_run_at == datetime(2026, 12, 8, 9, 0, tzinfo=SHANGHAI).timestamp()


async def test_a_firing_runs_once_however_many_loops_fire_it(world: World) -> None:
    await daily(world)
    world.clock.at("2026-12-07T09:00:01")
    (firing,) = world.schedules.due()
    # Two loops (or a retry after a crash) saw the same firing before either committed.
    outcomes = await asyncio.gather(world.run(firing), world.run(firing), return_exceptions=True)
    assert sum(isinstance(o, str) for o in outcomes) == 1
    assert sum(isinstance(o, Conflict) for o in outcomes) == 1
    assert world.turns() == 1


async def test_a_firing_whose_record_fails_queues_no_turn(world: World) -> None:
    await daily(world)
    world.clock.at("2026-12-07T09:00:00")
    (firing,) = world.schedules.due()
    await world.run(firing)
    # The same key again (a crash after the commit, and the scheduler comes back to it).
    with pytest.raises(Conflict, match="already ran"):
        await world.run(firing)
    assert world.turns() == 1


async def test_firings_passed_while_down_run_once_inside_the_grace_window(world: World) -> None:
    schedule_id = await daily(world, "0 * * * *")
    world.clock.at("2026-12-07T12:30:00")  # 09:00 .. 12:00 passed while nothing ran
    (firing,) = world.schedules.due()
    assert not world.schedules.stale(firing)
    assert firing.scheduled_at == datetime(2026, 12, 7, 12, 0, tzinfo=SHANGHAI).timestamp()
    assert firing.passed_over == 3
    await world.run(firing)
    assert world.turns() == 1
    (missed,) = world.schedules.unsaid_missed()
    assert missed.count == 3
    assert missed.scheduled_at == datetime(2026, 12, 7, 9, 0, tzinfo=SHANGHAI).timestamp()
    await world.schedules.said(missed)
    assert world.schedules.unsaid_missed() == []
    assert world.schedules.get(schedule_id).next_run_at == (
        datetime(2026, 12, 7, 13, 0, tzinfo=SHANGHAI).timestamp()
    )


async def test_a_firing_older_than_the_grace_window_is_missed_and_said_once(world: World) -> None:
    await daily(world)
    world.clock.at("2026-12-07T10:30:00")  # 09:00 passed 90 min ago; grace is 60 min
    (firing,) = world.schedules.due()
    assert world.schedules.stale(firing)
    assert await world.schedules.record_skipped(firing, "missed") is True
    assert await world.schedules.record_skipped(firing, "missed") is False
    assert world.turns() == 0
    (missed,) = world.schedules.unsaid_missed()
    assert missed.count == 1
    assert world.schedules.due() == []


async def test_a_skipped_firing_advances_the_clock_and_is_recorded(world: World) -> None:
    schedule_id = await daily(world)
    world.clock.at("2026-12-07T09:00:00")
    (firing,) = world.schedules.due()
    assert await world.schedules.record_skipped(firing, "skipped") is True
    assert world.schedules.get(schedule_id).last_result == "skipped"
    assert world.schedules.due() == []


async def test_a_one_time_schedule_runs_once_and_then_has_no_next_run(world: World) -> None:
    schedule, _ = await world.schedules.add(
        creator=world.alice, chat_id="oc", when="2026-12-07 17:30", prompt="x", provider="pi"
    )
    assert schedule.kind == "once"
    world.clock.at("2026-12-07T17:30:00")
    (firing,) = world.schedules.due()
    await world.run(firing)
    assert world.schedules.get(schedule.id).next_run_at is None
    world.clock.at("2026-12-09T17:30:00")
    assert world.schedules.due() == []


async def test_a_cron_keeps_its_local_hour_across_a_daylight_saving_change(world: World) -> None:
    berlin = ZoneInfo("Europe/Berlin")
    world.clock.at("2027-03-27T12:00:00", berlin)
    schedule, _ = await world.schedules.add(
        creator=world.alice,
        chat_id="oc",
        when="0 9 * * *",
        prompt="x",
        provider="claude",
        time_zone="Europe/Berlin",
    )
    world.clock.at("2027-03-28T09:00:00", berlin)  # the clocks went forward overnight
    (firing,) = world.schedules.due()
    assert datetime.fromtimestamp(firing.scheduled_at, berlin).hour == 9
    assert schedule.time_zone == "Europe/Berlin"


@pytest.mark.parametrize(
    ("when", "problem"),
    [
        ("* * * * *", "at most every 300 s"),
        ("*/2 * * * *", "at most every 300 s"),
        ("61 * * * *", "neither a cron expression"),
        ("every day", "neither a cron expression"),
        ("2026-12-06 09:00", "already passed"),
    ],
)
async def test_a_bad_clock_is_refused_with_the_reason(
    world: World, when: str, problem: str
) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        await world.schedules.add(
            creator=world.alice, chat_id="oc", when=when, prompt="x", provider="claude"
        )
    assert world.schedules.listed() == []


async def test_the_owner_may_lower_the_minimum_interval(world: World) -> None:
    world.rules[0] = ScheduleRules(min_interval_seconds=60)
    schedule, _ = await world.schedules.add(
        creator=world.alice, chat_id="oc", when="* * * * *", prompt="x", provider="claude"
    )
    assert schedule.kind == "cron"


async def test_bad_prompts_providers_and_zones_are_refused(world: World) -> None:
    cases = [
        ({"prompt": " "}, "prompt is empty"),
        ({"prompt": "x" * 20_000}, "longer than"),
        ({"provider": "gpt"}, "unknown provider"),
        ({"time_zone": "Mars/Olympus"}, "unknown time zone"),
    ]
    for change, problem in cases:
        args = {"prompt": "x", "provider": "claude", "time_zone": None, **change}
        with pytest.raises(InvalidArgument, match=problem):
            await world.schedules.add(
                creator=world.alice,
                chat_id="oc",
                when="0 9 * * *",
                **args,  # type: ignore[arg-type]
            )
    assert world.schedules.listed() == []


async def test_one_person_holds_at_most_the_allowed_number_of_schedules(world: World) -> None:
    world.rules[0] = ScheduleRules(max_per_principal=2)
    await daily(world)
    await daily(world)
    with pytest.raises(QuotaExceeded, match="already have 2 schedules"):
        await daily(world)
    # The limit is each person's.
    await world.schedules.add(
        creator=world.bob, chat_id="oc", when="0 9 * * *", prompt="x", provider="claude"
    )
    assert len(world.schedules.listed()) == 3


async def test_only_the_creator_or_the_owner_changes_a_schedule(world: World) -> None:
    schedule_id = await daily(world)
    for change in (world.schedules.pause, world.schedules.resume, world.schedules.remove):
        with pytest.raises(Forbidden, match="creator or the owner"):
            await change(schedule_id, world.bob)
    assert world.schedules.get(schedule_id).active
    assert (await world.schedules.pause(schedule_id, world.owner)).paused is not None
    assert (await world.schedules.resume(schedule_id, world.alice)).active
    await world.schedules.remove(schedule_id, world.alice)
    assert world.schedules.listed() == []


async def test_a_paused_schedule_is_not_due_and_resumes_from_now(world: World) -> None:
    schedule_id = await daily(world)
    await world.schedules.pause(schedule_id, world.alice)
    world.clock.at("2026-12-09T10:00:00")
    assert world.schedules.due() == []
    resumed = await world.schedules.resume(schedule_id, world.alice)
    # What it would have run while paused is not run.
    assert resumed.next_run_at == datetime(2026, 12, 10, 9, 0, tzinfo=SHANGHAI).timestamp()
    assert world.schedules.due() == []


async def test_three_failures_in_a_row_pause_it_and_a_success_resets_the_count(
    world: World,
) -> None:
    schedule_id = await daily(world)

    async def run_ending(ok: bool, result: str) -> object:
        schedule = world.schedules.get(schedule_id)
        execution_id = await world.run(world.schedules.now_firing(schedule))
        world.clock.now += 1
        assert (schedule_id, execution_id) in world.schedules.unsettled()
        ended = await world.schedules.finished(schedule_id, execution_id, ok=ok, result=result)
        assert (schedule_id, execution_id) not in world.schedules.unsettled()
        # Told twice (a restart re-reads the unsettled runs): counted once.
        assert (
            await world.schedules.finished(schedule_id, execution_id, ok=ok, result=result) is None
        )
        return ended

    assert await run_ending(False, "timeout") is None
    assert await run_ending(True, "ok") is None
    for _ in range(FAILURES_TO_PAUSE - 1):
        assert await run_ending(False, "failed") is None
    paused = await run_ending(False, "budget spent")
    assert isinstance(paused, Schedule) and paused.paused == PAUSED_BY_FAILURES
    assert paused.last_result == "budget spent"
    world.clock.at("2026-12-07T09:00:00")
    assert world.schedules.due() == []


async def test_a_schedule_whose_creator_is_gone_pauses(world: World) -> None:
    schedule_id = await daily(world)
    paused = await world.schedules.pause_for_gone_creators(lambda pid: pid != world.alice.id)
    assert [s.id for s in paused] == [schedule_id]
    assert world.schedules.get(schedule_id).paused == PAUSED_CREATOR_GONE


async def test_run_now_and_a_trigger_fire_without_moving_the_clock(world: World) -> None:
    schedule_id = await daily(world)
    before = world.schedules.get(schedule_id).next_run_at
    execution_id = await world.run(world.schedules.now_firing(world.schedules.get(schedule_id)))
    assert world.schedules.get(schedule_id).next_run_at == before
    assert world.schedules.running_execution(schedule_id) == execution_id
    found = world.schedules.firing_of(execution_id)
    assert found is not None and found[0].id == schedule_id


async def test_a_trigger_has_a_secret_shown_once_and_rotating_it_ends_the_old_one(
    world: World,
) -> None:
    trigger, secret = await world.schedules.add(
        creator=world.alice, chat_id="oc", when="trigger", prompt="CI failed", provider="claude"
    )
    assert trigger.kind == "trigger" and secret
    assert "secret" not in trigger.to_wire() and secret not in str(trigger.to_wire())
    body, stamp = b'{"status":"failed"}', "1765000000"
    signature = sign(world.schedules.secret_of(trigger.id), stamp, body)
    assert signature_matches(secret, stamp, body, signature)
    assert not signature_matches(secret, stamp, body + b" ", signature)
    assert not signature_matches(secret, "1765000001", body, signature)
    new = await world.schedules.rotate_secret(trigger.id, world.alice)
    assert not signature_matches(new, stamp, body, signature)
    with pytest.raises(Forbidden):
        await world.schedules.rotate_secret(trigger.id, world.bob)


async def test_the_firing_key_is_unique_per_schedule_and_time(world: World) -> None:
    # The table's key is what makes a firing once: two rows for one time are refused by SQLite.
    schedule_id = await daily(world)
    insert = (
        "INSERT INTO schedule_firings (schedule_id, scheduled_at, outcome, recorded_at) "
        "VALUES (?, 1.0, 'run', 0)"
    )
    world.state.db.execute(insert, (schedule_id,))
    with pytest.raises(sqlite3.IntegrityError):
        world.state.db.execute(insert, (schedule_id,))


async def test_run_now_is_picked_up_once_by_the_scheduler_even_while_paused(world: World) -> None:
    schedule_id = await daily(world)
    await world.schedules.pause(schedule_id, world.alice)
    with pytest.raises(Forbidden):
        await world.schedules.request_run(schedule_id, world.bob)
    assert world.schedules.due() == []
    await world.schedules.request_run(schedule_id, world.alice)
    await world.schedules.request_run(schedule_id, world.alice)  # a second click, same run
    world.clock.now += 1
    (firing,) = world.schedules.due()
    await world.run(firing)
    assert world.schedules.due() == [] and world.turns() == 1
    # Running it did not resume it or move its clock.
    after = world.schedules.get(schedule_id)
    assert after.paused is not None
    assert after.next_run_at == datetime(2026, 12, 7, 9, 0, tzinfo=SHANGHAI).timestamp()
