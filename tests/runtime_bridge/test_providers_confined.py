"""Root-side writes into an Agent's directories never follow what the Agent planted there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime_bridge.providers import LaunchPlan
from runtime_bridge.providers.confined import open_dir, open_root, write_file
from runtime_bridge.providers.plan import PlannedCopy, PlannedFile
from runtime_bridge.providers.process import materialize

AGENT = (65534, 65534)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="handing files over needs root")


def victim(tmp_path: Path) -> Path:
    target = tmp_path / "victim"
    target.mkdir()
    (target / "passwd").write_text("root:x:0:0\n")
    return target


@as_root
def test_a_home_replaced_by_a_link_is_recreated_and_the_links_target_keeps_its_owner(
    tmp_path: Path,
) -> None:
    target = victim(tmp_path)
    session = tmp_path / "session"
    session.mkdir()
    (session / "home").symlink_to(target)

    with open_root(session) as root, open_dir(root, Path("home"), AGENT):
        pass

    home = session / "home"
    assert home.is_dir() and not home.is_symlink()
    assert (home.stat().st_uid, home.stat().st_gid) == AGENT
    assert target.stat().st_uid == 0
    assert (target / "passwd").read_text() == "root:x:0:0\n"


@as_root
def test_a_file_written_over_a_planted_link_replaces_the_link_not_its_target(
    tmp_path: Path,
) -> None:
    target = victim(tmp_path)
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "connection.env").symlink_to(target / "passwd")

    with open_root(directory) as fd:
        write_file(fd, "connection.env", b"AMUX_TOKEN=x\n", 0o600, AGENT)

    written = directory / "connection.env"
    assert not written.is_symlink() and written.read_text() == "AMUX_TOKEN=x\n"
    assert written.stat().st_uid == AGENT[0] and written.stat().st_mode & 0o777 == 0o600
    assert (target / "passwd").read_text() == "root:x:0:0\n"
    assert (target / "passwd").stat().st_uid == 0


@as_root
def test_materializing_a_plan_into_a_tampered_home_touches_nothing_outside(
    tmp_path: Path,
) -> None:
    target = victim(tmp_path)
    source = tmp_path / "operator-pi"
    source.mkdir()
    (source / "settings.json").write_text("{}")
    state = tmp_path / "state"
    run = tmp_path / "run"
    state.mkdir()
    run.mkdir()
    (state / "pi-agent").symlink_to(target)
    plan = LaunchPlan(
        provider="pi",
        argv=("pi",),
        env={},
        cwd=tmp_path,
        prompt="",
        files=(PlannedFile(run / "agent-config" / "mcp.json", "{}"),),
        copies=(PlannedCopy(source, state / "pi-agent"),),
        directories=(state / "pi-agent",),
        run_as=AGENT,
        roots=(run, state),
    )

    materialize(plan)

    assert (state / "pi-agent" / "settings.json").read_text() == "{}"
    assert not (state / "pi-agent").is_symlink()
    assert sorted(os.listdir(target)) == ["passwd"]
    assert target.stat().st_uid == 0
    assert (run / "agent-config" / "mcp.json").stat().st_uid == AGENT[0]


def test_a_plan_that_would_write_outside_its_roots_is_refused(tmp_path: Path) -> None:
    plan = LaunchPlan(
        provider="pi",
        argv=("pi",),
        env={},
        cwd=tmp_path,
        prompt="",
        files=(PlannedFile(tmp_path / "elsewhere" / "x.json", "{}"),),
        roots=(tmp_path / "run",),
    )
    with pytest.raises(ValueError, match="outside the launch"):
        materialize(plan)
    assert not (tmp_path / "elsewhere").exists()
