"""``amux schedule`` and ``amux trigger`` against a real `amux serve`: text and --json, a
trigger's secret shown once, whose chat a schedule may name, and one-line refusals that change
nothing. An Agent's credential may not manage schedules at all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hub.config import HubSettings
from hub.people import PRIVATE_CHAT_ALIAS
from hub.state import State
from tests.conftest import CliResult, HubProcess, running_hub

pytestmark = pytest.mark.e2e

BOBS_CHAT = "oc_p2p_bob"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    home = tmp_path_factory.mktemp("schedules-cli") / "amux-home"
    state = State(HubSettings(home=home).state_path)
    try:
        owner = state.add_principal("olivia", "user", owner=True)
        bob = state.add_principal("bob", "user")
        carol = state.add_principal("carol", "user")
        state.add_alias(bob.id, PRIVATE_CHAT_ALIAS, BOBS_CHAT)
        tokens = {
            "owner": state.issue_credential(owner.id, "cli")[0],
            "bob": state.issue_credential(bob.id, "cli")[0],
            "carol": state.issue_credential(carol.id, "cli")[0],
            "agent": state.issue_credential(bob.id, "delegated", binding="global")[0],
        }
    finally:
        state.close()
    with running_hub(home) as hub:
        hub.extra_env.update({f"TOKEN_{k.upper()}": v for k, v in tokens.items()})
        yield hub


def as_(hub: HubProcess, who: str, *args: str) -> CliResult:
    return hub.cli(*args, env={"AMUX_TOKEN": hub.extra_env[f"TOKEN_{who.upper()}"]})


def ok(done: CliResult) -> CliResult:
    assert done.returncode == 0, done.stderr
    return done


def refused(done: CliResult, code: str, words: str) -> None:
    assert done.returncode != 0 and done.stdout == "", done
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {code}: ") and words in line, line


def test_a_person_schedules_into_their_own_private_chat_and_manages_it(hub: HubProcess) -> None:
    added = ok(as_(hub, "bob", "schedule", "add", "0 9 * * 1-5", "standup notes", "--json"))
    schedule = added.json()["schedule"]
    assert schedule["chat_id"] == BOBS_CHAT and schedule["chat_type"] == "p2p"
    assert schedule["time_zone"] == "Asia/Shanghai" and schedule["next_run_at"].endswith("Z")
    sid = schedule["id"]

    listed = ok(as_(hub, "bob", "schedule", "list")).stdout
    assert listed.splitlines()[0].split() == [
        "ID", "NAME", "WHEN", "ZONE", "STATE", "NEXT", "RUN", "LAST", "RESULT",
    ]  # fmt: skip
    assert sid in listed and "0 9 * * 1-5" in listed and "active" in listed
    assert ok(as_(hub, "bob", "schedule", "pause", sid)).stdout == f"paused schedule {sid}\n"
    assert "paused (paused)" in ok(as_(hub, "bob", "schedule", "show", sid)).stdout
    ok(as_(hub, "bob", "schedule", "resume", sid))
    ok(as_(hub, "bob", "schedule", "run", sid))

    # Carol neither sees nor changes it; the owner may do both.
    refused(as_(hub, "carol", "schedule", "show", sid), "forbidden", "creator or the owner")
    refused(as_(hub, "carol", "schedule", "remove", sid), "forbidden", "creator or the owner")
    assert sid not in ok(as_(hub, "carol", "schedule", "list")).stdout
    assert sid in ok(as_(hub, "owner", "schedule", "list", "--all")).stdout
    refused(as_(hub, "bob", "schedule", "list", "--all"), "forbidden", "only the owner")
    ok(as_(hub, "owner", "schedule", "remove", sid))
    refused(as_(hub, "bob", "schedule", "show", sid), "not_found", "no such schedule")


def test_whose_chat_a_schedule_may_name(hub: HubProcess) -> None:
    refused(as_(hub, "carol", "schedule", "add", "0 9 * * *", "x"), "invalid_argument",
            "no private chat with the bot yet")  # fmt: skip
    refused(as_(hub, "carol", "schedule", "add", "0 9 * * *", "x", "--chat", BOBS_CHAT),
            "forbidden", "someone else's private chat")  # fmt: skip
    refused(as_(hub, "bob", "schedule", "add", "0 9 * * *", "x", "--chat", "oc_team"),
            "forbidden", "only the owner names a group")  # fmt: skip
    owners = ok(as_(hub, "owner", "schedule", "add", "30 8 * * *", "team digest", "--chat",
                    "oc_team", "--json")).json()  # fmt: skip
    assert owners["schedule"]["chat_type"] == "group"
    ok(as_(hub, "owner", "schedule", "remove", owners["schedule"]["id"]))


def test_an_agents_credential_manages_no_schedule(hub: HubProcess) -> None:
    for args in (("schedule", "add", "0 9 * * *", "x"), ("schedule", "list"),
                 ("trigger", "add", "x")):  # fmt: skip
        refused(as_(hub, "agent", *args), "forbidden", "an Agent's credential")


@pytest.mark.parametrize(
    ("when", "words"),
    [
        ("* * * * *", "at most every 300 s"),
        ("0 25 * * *", "neither a cron expression"),
        ("2020-01-01 09:00", "already passed"),
        ("trigger", "amux trigger add"),
    ],
)
def test_a_bad_clock_is_one_line_and_adds_nothing(hub: HubProcess, when: str, words: str) -> None:
    before = ok(as_(hub, "bob", "schedule", "list", "--json")).json()["schedules"]
    refused(as_(hub, "bob", "schedule", "add", when, "x"), "invalid_argument", words)
    assert ok(as_(hub, "bob", "schedule", "list", "--json")).json()["schedules"] == before


def test_a_triggers_secret_is_shown_once_and_rotating_replaces_it(hub: HubProcess) -> None:
    made = ok(as_(hub, "bob", "trigger", "add", "CI failed: look", "--name", "CI"))
    first, second = made.stdout.splitlines()
    tid = first.split()[1].rstrip(":")
    assert first == f"trigger {tid}: POST /triggers/v1/{tid}"
    secret = second.removeprefix("secret (shown this once): ")
    assert len(secret) >= 40
    for shown in (as_(hub, "bob", "trigger", "list", "--json"),
                  as_(hub, "bob", "schedule", "show", tid, "--json")):  # fmt: skip
        assert secret not in ok(shown).stdout
    rotated = ok(as_(hub, "bob", "trigger", "rotate", tid, "--json")).json()["secret"]
    assert rotated != secret
    refused(as_(hub, "carol", "trigger", "rotate", tid), "forbidden", "creator or the owner")
    ok(as_(hub, "bob", "trigger", "remove", tid))
    assert ok(as_(hub, "bob", "trigger", "list", "--json")).json()["triggers"] == []
