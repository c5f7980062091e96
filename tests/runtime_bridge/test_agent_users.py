"""Who Agents run as: a uid of each Principal's own on a root worker, never root."""

from __future__ import annotations

import pwd
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hub.errors import InvalidArgument
from runtime_bridge.agent_users import DYNAMIC_UIDS, AgentUsers, configured_user


def test_each_principal_gets_a_uid_of_its_own_and_keeps_it(tmp_path: Path) -> None:
    users = AgentUsers(tmp_path)
    alice, bob = users.of("alice-id"), users.of("bob-id")
    assert alice != bob
    assert {alice[0], bob[0]} <= set(DYNAMIC_UIDS)
    assert alice[0] == alice[1] and bob[0] == bob[1]
    # Another process (a restart, the bot beside the worker) reads the same answers.
    again = AgentUsers(tmp_path)
    assert again.of("bob-id") == bob and again.of("alice-id") == alice


def test_principals_allocating_at_once_never_share_a_uid(tmp_path: Path) -> None:
    owners = [f"principal-{n}" for n in range(24)]
    with ThreadPoolExecutor(8) as pool:
        given = list(pool.map(lambda owner: AgentUsers(tmp_path).of(owner), owners))
    assert len({uid for uid, _ in given}) == len(owners)
    assert [AgentUsers(tmp_path).of(owner) for owner in owners] == given


def test_a_number_a_local_account_holds_is_never_handed_out(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    users = AgentUsers(tmp_path, range(nobody, nobody + 2))
    assert users.of("first") == (nobody + 1, nobody + 1)
    with pytest.raises(InvalidArgument, match="no free uid"):
        users.of("second")


def test_the_registry_names_no_principal_in_clear(tmp_path: Path) -> None:
    AgentUsers(tmp_path).of("alice@example.com")
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert b"alice@example.com" not in raw


@pytest.mark.parametrize("user", ["root", "0"])
def test_running_agents_as_root_is_refused_with_the_fix(user: str) -> None:
    with pytest.raises(InvalidArgument, match="would run Agents as root.*unset it"):
        configured_user(user)


def test_a_named_unprivileged_user_is_taken_as_it_is() -> None:
    entry = pwd.getpwnam("nobody")
    assert configured_user("nobody") == (entry.pw_uid, entry.pw_gid)
    with pytest.raises(InvalidArgument, match="names no local user"):
        configured_user("no-such-user-here")


def test_a_plan_shows_the_uid_a_principal_would_get_and_writes_nothing(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    assert AgentUsers(fresh).planned("alice")[0] in DYNAMIC_UIDS
    assert not fresh.exists()
    users = AgentUsers(tmp_path)
    given = users.of("alice")
    assert users.planned("alice") == given
    assert users.planned("bob") != given
    assert users.of("bob") == users.planned("bob")
