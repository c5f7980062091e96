"""Token budgets through a real `amux serve` and the real CLI: the owner's settings, the ceiling
each claimed turn carries (the per-turn one, or what is left of its sender's UTC day), that the
day's figure outlives a restart, and the owner's extension of one Principal's day."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hub.contract import Claim
from tests.conftest import HubProcess, running_hub
from tests.hub.test_usage import claimed_turn, complete, completed_turn, ok, tokens_of

pytestmark = pytest.mark.e2e


@pytest.fixture
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    home = tmp_path_factory.mktemp("budgets") / "amux-home"
    # The test plays the worker: no in-process one may claim its turns.
    with running_hub(home, extra_env={"AMUX_RUNTIME_IN_PROCESS": "false"}) as hub:
        yield hub


def claimed_budget(hub: HubProcess, sender: str, runtime: str, used: int) -> int | None:
    """The budget one turn of ``sender``'s is claimed with; it completes having used ``used``."""
    usage = {"gateway": {"input_tokens": used - used // 4, "output_tokens": used // 4}}
    return completed_turn(hub, sender, runtime, usage).budget


def test_budgets_are_live_owner_settings_and_each_turn_is_claimed_with_what_is_left(
    hub: HubProcess,
) -> None:
    made = tokens_of(hub, "alice")
    alice_id, alice = made["alice"]
    runtime = tokens_of(hub, "runtime-budget", service=True)["runtime-budget"][1]
    assert claimed_budget(hub, alice, runtime, used=100) is None

    for key, wrong in (("budget.daily_tokens", "1.5"), ("budget.turn_tokens", "lots")):
        refused = hub.cli("system", "config", "set", key, wrong)
        assert refused.returncode == 1
        assert refused.stderr.startswith(f"error: invalid_argument: {key}: expected a whole")
    status, body = hub.rpc("system.config.set", key="budget.turn_tokens", value=-1)
    assert status == 400 and body["error"]["code"] == "invalid_argument", body
    forbidden = hub.cli(
        "system", "config", "set", "budget.daily_tokens", "5", env={"AMUX_TOKEN": alice}
    )
    assert forbidden.returncode == 5, forbidden.stderr
    changed = ok(hub.cli("system", "config", "set", "--json", "budget.daily_tokens", "1000"))
    assert changed.json()["budget.daily_tokens"]["running"] == 1000
    ok(hub.cli("system", "config", "set", "budget.turn_tokens", "600"))

    # 100 tokens of today's were used before any budget was set; they count all the same.
    assert claimed_budget(hub, alice, runtime, used=700) == 600
    hub.restart()
    assert claimed_budget(hub, alice, runtime, used=200) == 200
    # Nothing is left of the day: the next turn is refused as it is submitted, with the figures,
    # rather than launched to fail at its first model request.
    status, refused_turn = hub.rpc(
        "executions.submit", token=alice, provider="claude", prompt="one more"
    )
    assert status == 422, refused_turn
    error = refused_turn["error"]
    assert (error["code"], error["limit"], error["used"], error["allowance"]) == (
        "quota_exceeded",
        "daily_tokens",
        1000,
        1000,
    )

    refused = hub.cli("usage", "extend", "alice", "--tokens", "500", env={"AMUX_TOKEN": alice})
    assert refused.returncode == 5
    assert refused.stderr.startswith("error: forbidden: "), refused.stderr
    extended = ok(hub.cli("usage", "extend", "alice", "--tokens", "500", "--json")).json()
    assert extended["principal_id"] == alice_id and extended["tokens"] == 500
    assert claimed_budget(hub, alice, runtime, used=0) == 500
    ok(hub.cli("system", "config", "set", "budget.daily_tokens", "0"))
    # With no daily budget, the day's extension raises the per-turn ceiling.
    assert claimed_budget(hub, alice, runtime, used=0) == 1100


def test_turns_running_at_once_share_their_senders_day(hub: HubProcess) -> None:
    alice = tokens_of(hub, "alice")["alice"][1]
    runtime = tokens_of(hub, "runtime-share", service=True)["runtime-share"][1]
    ok(hub.cli("system", "config", "set", "budget.daily_tokens", "1000"))
    workers: dict[str, str] = {}

    def start() -> Claim:
        claim, worker = claimed_turn(hub, alice, runtime)
        workers[claim.execution_id] = worker
        return claim

    def beat(claim: Claim, used: int) -> int | None:
        status, answer = hub.rpc(
            "executions.heartbeat",
            token=runtime,
            execution_id=claim.execution_id,
            worker_id=workers[claim.execution_id],
            used_tokens=used,
        )
        assert status == 200, answer
        assert answer["cancel_requested"] is False
        budget = answer["budget"]
        assert budget is None or isinstance(budget, int)
        return budget

    first, second = start(), start()
    assert (first.budget, second.budget) == (1000, 1000)
    # Each may use only what the day has left after what the other has spent so far.
    assert beat(first, 600) == 1000
    assert beat(second, 100) == 400
    assert beat(first, 650) == 900
    # A turn claimed now starts with what both running turns have left of the day.
    assert start().budget == 250
    ok(hub.cli("usage", "extend", "alice", "--tokens", "500"))
    assert beat(second, 100) == 1500 - 650
    complete(hub, runtime, first, workers[first.execution_id], {"gateway": {"input_tokens": 650}})
    # The finished turn's figure is recorded now, counted once.
    assert beat(second, 100) == 1500 - 650
    status, refused = hub.rpc(
        "executions.heartbeat",
        token=runtime,
        execution_id=second.execution_id,
        worker_id=workers[second.execution_id],
        used_tokens=-5,
    )
    assert status == 400 and refused["error"]["code"] == "invalid_argument", refused
