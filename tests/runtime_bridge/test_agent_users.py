"""Who Agents run as: a uid of each Principal's own on a root worker, never root."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hub.errors import InvalidArgument
from runtime_bridge.agent_users import DYNAMIC_UIDS, AgentUsers, configured_user


def host(tmp_path: Path) -> Path:
    """The test's own host-wide registry, apart from the real one other runs on this host use."""
    return tmp_path / "host" / "agent-uids.sqlite3"


def test_each_principal_gets_a_uid_of_its_own_and_keeps_it(tmp_path: Path) -> None:
    users = AgentUsers(tmp_path, host_registry=host(tmp_path))
    alice, bob = users.of("alice-id"), users.of("bob-id")
    assert alice != bob
    assert {alice[0], bob[0]} <= set(DYNAMIC_UIDS)
    assert alice[0] == alice[1] and bob[0] == bob[1]
    # Another process (a restart, the bot beside the worker) reads the same answers.
    again = AgentUsers(tmp_path, host_registry=host(tmp_path))
    assert again.of("bob-id") == bob and again.of("alice-id") == alice


def test_principals_allocating_at_once_never_share_a_uid(tmp_path: Path) -> None:
    owners = [f"principal-{n}" for n in range(24)]
    with ThreadPoolExecutor(8) as pool:
        given = list(
            pool.map(
                lambda owner: AgentUsers(tmp_path, host_registry=host(tmp_path)).of(owner), owners
            )
        )
    assert len({uid for uid, _ in given}) == len(owners)
    assert [
        AgentUsers(tmp_path, host_registry=host(tmp_path)).of(owner) for owner in owners
    ] == given


def test_a_number_a_local_account_holds_is_never_handed_out(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    users = AgentUsers(tmp_path, range(nobody, nobody + 2), host(tmp_path))
    assert users.of("first") == (nobody + 1, nobody + 1)
    with pytest.raises(InvalidArgument, match="no free uid"):
        users.of("second")


def test_the_registry_names_no_principal_in_clear(tmp_path: Path) -> None:
    AgentUsers(tmp_path, host_registry=host(tmp_path)).of("alice@example.com")
    raw = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
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
    assert AgentUsers(fresh, host_registry=host(tmp_path)).planned("alice")[0] in DYNAMIC_UIDS
    assert not fresh.exists()
    users = AgentUsers(tmp_path, host_registry=host(tmp_path))
    given = users.of("alice")
    assert users.planned("alice") == given
    assert users.planned("bob") != given
    assert users.of("bob") == users.planned("bob")


# -- reserved host-wide ---------------------------------------------------------------------------


def test_two_installations_on_one_host_never_share_a_uid_and_each_keeps_its_own(
    tmp_path: Path,
) -> None:
    """Two Hubs' work directories on one host, allocating at once, for the same Principals."""
    registry = host(tmp_path)
    owners = [f"principal-{n}" for n in range(12)]
    jobs = [(tmp_path / where, owner) for owner in owners for where in ("one", "two")]
    with ThreadPoolExecutor(8) as pool:
        given = list(
            pool.map(lambda job: AgentUsers(job[0], host_registry=registry).of(job[1]), jobs)
        )
    assert len({uid for uid, _ in given}) == len(jobs)
    # A restart of either installation gives each Principal the uid it had.
    again = [AgentUsers(where, host_registry=registry).of(owner) for where, owner in jobs]
    assert again == given
    # No Agent uid may change the registry, nor read which uids are whose.
    assert stat.S_IMODE(registry.parent.stat().st_mode) == 0o700
    assert registry.parent.stat().st_uid == os.geteuid()


def test_an_older_installations_uids_are_kept_unless_another_reserved_them_first(
    tmp_path: Path,
) -> None:
    registry = host(tmp_path)
    # Its table was made before uids were reserved host-wide (no reservation on this host).
    old = AgentUsers(tmp_path / "old", host_registry=tmp_path / "elsewhere" / "uids.sqlite3")
    alice, bob = old.of("alice"), old.of("bob")
    newer = AgentUsers(tmp_path / "newer", host_registry=registry).of("carol")
    assert newer == alice  # The newer one could not know: it reserved that number first.
    upgraded = AgentUsers(tmp_path / "old", host_registry=registry)
    assert upgraded.of("bob") == bob
    moved = upgraded.of("alice")
    assert moved not in (alice, bob)
    assert AgentUsers(tmp_path / "old", host_registry=registry).of("alice") == moved
    assert AgentUsers(tmp_path / "newer", host_registry=registry).of("carol") == newer


def test_a_reservation_of_an_installation_that_is_gone_is_reclaimed(tmp_path: Path) -> None:
    registry = host(tmp_path)
    one = range(DYNAMIC_UIDS.start, DYNAMIC_UIDS.start + 1)
    first = AgentUsers(tmp_path / "first", one, host_registry=registry).of("alice")
    second = AgentUsers(tmp_path / "second", one, host_registry=registry)
    with pytest.raises(InvalidArgument, match="no free uid"):
        second.of("bob")
    shutil.rmtree(tmp_path / "first")
    assert second.of("bob") == first


ALLOCATE = (
    "import sys; from pathlib import Path; from runtime_bridge.agent_users import AgentUsers; "
    "print(AgentUsers(Path(sys.argv[1])).of(sys.argv[2])[0])"
)


@pytest.mark.skipif(os.geteuid() != 0, reason="the host's registry is root's")
def test_two_processes_with_work_dirs_of_their_own_on_this_host_get_different_uids(
    tmp_path: Path,
) -> None:
    """As two Hubs would, each in a process of its own, through this host's own registry."""
    checkout = Path(__file__).resolve().parents[2]

    def allocate(work_dir: Path) -> int:
        done = subprocess.run(
            [sys.executable, "-c", ALLOCATE, str(work_dir), "the-same-principal"],
            cwd=checkout,
            capture_output=True,
            text=True,
            check=True,
        )
        return int(done.stdout)

    first, second = allocate(tmp_path / "one"), allocate(tmp_path / "two")
    assert first != second
    assert allocate(tmp_path / "one") == first
