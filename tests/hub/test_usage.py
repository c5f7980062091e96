"""Model usage through a real `amux serve` and the real CLI: what a worker's gateway counted for
a turn is kept per sender per UTC day, each person sees their own and the owner everyone's, it
outlives a restart, and /metrics counts it by provider."""

from __future__ import annotations

import datetime
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from hub.config import HubSettings
from hub.contract import Claim
from hub.state import State
from tests.conftest import CliResult, HubProcess, running_hub

pytestmark = pytest.mark.e2e

ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    home = tmp_path_factory.mktemp("usage") / "amux-home"
    # The test plays the worker: no in-process one may claim its turns.
    with running_hub(home, extra_env={"AMUX_RUNTIME_IN_PROCESS": "false"}) as hub:
        yield hub


@pytest.fixture(scope="module")
def runtime(hub: HubProcess) -> str:
    return tokens_of(hub, "runtime-usage", service=True)["runtime-usage"][1]


def tokens_of(hub: HubProcess, *names: str, service: bool = False) -> dict[str, tuple[str, str]]:
    """New Principals ``names``, each as (id, CLI token), made as the Hub host's admin commands
    make them (each of those would be one more CLI start)."""
    made = {}
    state = State(HubSettings(home=hub.home).state_path)
    try:
        for name in names:
            principal = state.add_principal(name, "service" if service else "user")
            made[name] = (principal.id, state.issue_credential(principal.id, "cli")[0])
    finally:
        state.close()
    return made


def ok(done: CliResult) -> CliResult:
    assert done.returncode == 0, done.stderr
    return done


def usage_of(hub: HubProcess, token: str | None, *args: str) -> CliResult:
    """``amux usage`` as the holder of ``token`` (None: the owner, from owner.token)."""
    return hub.cli("usage", *args, env={"AMUX_TOKEN": token} if token else None)


def claimed_turn(hub: HubProcess, sender: str, runtime: str) -> tuple[Claim, str]:
    """One turn of ``sender``'s, submitted and claimed: its claim, and the worker holding it."""
    status, submitted = hub.rpc(
        "executions.submit", token=sender, provider="claude", prompt="count me"
    )
    assert status == 200, submitted
    status, registered = hub.rpc("workers.register", token=runtime, name="usage-worker")
    assert status == 200, registered
    worker = registered["worker_id"]
    status, wire = hub.rpc("executions.claim", token=runtime, worker_id=worker, wait_seconds=5)
    assert status == 200, wire
    claim = Claim.from_wire(wire)
    assert claim.execution_id == submitted["execution"]["id"]
    return claim, worker


def complete(hub: HubProcess, runtime: str, claim: Claim, worker: str, usage: Any) -> None:
    """The claimed turn done, its worker reporting ``usage``."""
    status, done = hub.rpc(
        "executions.complete",
        token=runtime,
        execution_id=claim.execution_id,
        worker_id=worker,
        succeeded=True,
        result={"text": "done", "usage": usage},
    )
    assert status == 200 and done["state"] == "succeeded", done


def completed_turn(hub: HubProcess, sender: str, runtime: str, usage: Any) -> Claim:
    """One turn of ``sender``'s, claimed and completed by a worker reporting ``usage``; the
    claim it was leased with."""
    claim, worker = claimed_turn(hub, sender, runtime)
    complete(hub, runtime, claim, worker, usage)
    return claim


def today() -> str:
    return datetime.datetime.now(datetime.UTC).date().isoformat()


def metric(hub: HubProcess, series: str) -> float:
    with urllib.request.urlopen(f"{hub.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    (line,) = [line for line in text.splitlines() if line.startswith(series + " ")]
    return float(line.split()[-1])


def test_each_sender_sees_their_own_usage_the_owner_everyones_and_it_outlives_a_restart(
    hub: HubProcess, runtime: str
) -> None:
    made = tokens_of(hub, "alice", "bob")
    (_, alice), (_, bob) = made["alice"], made["bob"]
    gateway = {"input_tokens": 1200, "output_tokens": 300, "requests": 2}
    completed_turn(hub, alice, runtime, {"gateway": {**gateway, "cache_read_input_tokens": 50}})
    completed_turn(hub, alice, runtime, {"gateway": {"input_tokens": 800, "output_tokens": 100}})
    completed_turn(hub, bob, runtime, {"gateway": {"input_tokens": 10, "output_tokens": 5}})
    # A turn whose worker counted nothing (no gateway) is not a row of anyone's.
    completed_turn(hub, bob, runtime, {"input_tokens": 999})

    header, row, total = ok(usage_of(hub, alice)).stdout.splitlines()
    assert header.split() == [
        "DAY",
        "PRINCIPAL",
        "PROVIDER",
        "INPUT",
        "OUTPUT",
        "REQUESTS",
        "TURNS",
    ]
    assert row.split() == [today(), "alice", "claude", "2000", "400", "2", "2"]
    assert total.split() == ["total", "2000", "400", "2", "2"]

    mine = ok(usage_of(hub, bob, "--json")).json()
    assert [(r["principal"], r["input_tokens"], r["turns"]) for r in mine["rows"]] == [
        ("bob", 10, 1)
    ]
    assert ISO_DATE.fullmatch(mine["since"]) and mine["until"] == mine["rows"][0]["day"] == today()
    assert mine["total"] == {"input_tokens": 10, "output_tokens": 5, "requests": 0, "turns": 1}

    everyone = ok(usage_of(hub, None, "--json")).json()
    assert sorted(r["principal"] for r in everyone["rows"]) == ["alice", "bob"]
    assert everyone["total"]["input_tokens"] == 2010
    status, only = hub.rpc("usage.report", principal="alice")
    assert status == 200 and [r["principal"] for r in only["rows"]] == ["alice"], only
    status, own = hub.rpc("usage.report", token=bob, principal=made["bob"][0])
    assert status == 200 and [r["principal"] for r in own["rows"]] == ["bob"], own

    refused = usage_of(hub, bob, "--principal", "alice")
    assert refused.returncode == 5
    assert refused.stderr.startswith("error: forbidden: "), refused.stderr
    # Someone who may not exist is refused alike: no answer tells who else is there.
    status, body = hub.rpc("usage.report", token=bob, principal="nobody")
    assert status == 403 and body["error"]["code"] == "forbidden"
    status, body = hub.rpc("usage.report", principal="nobody")
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = hub.rpc("usage.report", token=bob, days=367)
    assert status == 400 and body["error"]["message"] == "days must be an integer from 1 to 366"

    tokens = 'amux_model_tokens_total{direction="%s",provider="claude"}'
    assert metric(hub, tokens % "input") == 2010
    assert metric(hub, tokens % "output") == 405
    assert metric(hub, 'amux_model_requests_total{provider="claude"}') == 2

    hub.restart()
    _, row, _ = ok(usage_of(hub, alice)).stdout.splitlines()
    assert row.split() == [today(), "alice", "claude", "2000", "400", "2", "2"]


def test_days_reach_back_from_today(hub: HubProcess, runtime: str) -> None:
    carol_id, carol = tokens_of(hub, "carol")["carol"]
    completed_turn(hub, carol, runtime, {"gateway": {"input_tokens": 7, "requests": 1}})
    # Ten days ago: the Hub's clock cannot be moved from outside, so that day's row is written
    # as the Hub would have written it.
    long_ago = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)).date()
    state = State(HubSettings(home=hub.home).state_path)
    try:
        with state.transaction() as db:
            db.execute(
                "INSERT INTO usage (principal_id, day, provider, input_tokens, output_tokens,"
                " requests, turns) VALUES (?, ?, 'claude', 40, 4, 1, 1)",
                (carol_id, long_ago.isoformat()),
            )
    finally:
        state.close()

    status, week = hub.rpc("usage.report", token=carol)
    assert status == 200 and [r["day"] for r in week["rows"]] == [today()], week
    month = ok(usage_of(hub, carol, "--days", "30", "--json")).json()
    assert [r["day"] for r in month["rows"]] == [today(), long_ago.isoformat()]
    assert month["total"]["input_tokens"] == 47


def test_figures_a_worker_gets_wrong_are_left_out_with_a_warning(
    hub: HubProcess, runtime: str
) -> None:
    _, dave = tokens_of(hub, "dave")["dave"]
    bad = {"input_tokens": -5, "output_tokens": "many", "requests": True}
    completed_turn(hub, dave, runtime, {"gateway": {**bad, "input_tokens": 2**70}})
    completed_turn(hub, dave, runtime, {"gateway": {**bad, "output_tokens": 3}})
    completed_turn(hub, dave, runtime, {"gateway": "lots"})

    status, report = hub.rpc("usage.report", token=dave)
    assert status == 200, report
    (row,) = report["rows"]
    assert (row["input_tokens"], row["output_tokens"], row["requests"], row["turns"]) == (
        0,
        3,
        0,
        1,
    )
    assert "gateway usage input_tokens is not a plausible count" in hub.log()
    assert "gateway usage is not an object; not recorded" in hub.log()
