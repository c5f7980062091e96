"""Codex's empty databases, made once by the worker, in each new conversation's CODEX_HOME."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from runtime_bridge.codex_seed import CodexSeed
from runtime_bridge.providers import Result, build_plan, run
from runtime_bridge.providers.process import materialize
from tests.fakes.model_server import Answer, FakeModelServer
from tests.runtime_bridge.conftest import collect
from tests.runtime_bridge.test_providers_codex import request_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def threads_in(home: Path) -> list[str]:
    (database,) = sorted(home.glob("state_*.sqlite"))
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        rows = connection.execute("SELECT id FROM threads").fetchall()
    connection.close()
    return [str(row[0]) for row in rows]


def real_path(executable: str) -> str:
    return os.path.realpath(executable)


def databases(home: Path) -> list[str]:
    return sorted(p.name for p in home.glob("*.sqlite"))


def written(home: Path) -> dict[str, tuple[int, int, int]]:
    """Each database file of ``home`` as which file it is and when it was last written."""
    found = {name: (home / name).stat() for name in databases(home)}
    return {name: (s.st_ino, s.st_size, s.st_mtime_ns) for name, s in found.items()}


async def test_a_new_conversations_codex_home_starts_with_codexs_databases_and_keeps_its_own(
    tmp_path: Path, codex_bin: str
) -> None:
    seed = CodexSeed(codex_bin, tmp_path / "worker")
    await seed.make()
    files = seed.files()
    assert {f.name.split("_")[0] for f in files} >= {"state", "logs"}
    # Only the databases of an empty home: nothing that names an installation or a thread.
    assert all(f.suffix == ".sqlite" for f in files)
    assert all(threads_in(f.parent) == [] for f in files if f.name.startswith("state_"))

    async with FakeModelServer([Answer("First answer."), Answer("Second answer.")]) as model:
        request = dataclasses.replace(
            request_for(tmp_path, model, codex_bin, memory=None), home_seed=files
        )
        plan = build_plan(request)
        home = Path(plan.env["CODEX_HOME"])
        materialize(plan)
        # Before Codex first starts there, the new home already holds its databases.
        assert databases(home) == sorted(f.name for f in files)
        first = await collect(run(plan))
        session = first[-1]
        assert isinstance(session, Result), first
        assert session.text == "First answer."

        # A later turn of the same conversation keeps what its home holds.
        plan = build_plan(
            dataclasses.replace(
                request_for(
                    tmp_path, model, codex_bin, None, session.native_session_id, "And then?"
                ),
                home_seed=files,
            )
        )
        before = written(home)
        materialize(plan)
        assert written(home) == before
        assert threads_in(home) == [session.native_session_id]
        second = await collect(run(plan))
    resumed = second[-1]
    assert isinstance(resumed, Result), second
    assert resumed.native_session_id == session.native_session_id
    assert "First answer." in str(model.main_requests[-1].body["input"])


async def test_a_changed_codex_executable_gets_no_seed(tmp_path: Path, codex_bin: str) -> None:
    installed = tmp_path / "bin" / "codex"
    installed.parent.mkdir()
    installed.symlink_to(real_path(codex_bin))
    seed = CodexSeed(str(installed), tmp_path / "worker")
    await seed.make()
    assert seed.files()

    # An upgrade (or a downgrade, whose migrations the seed's would not match) replaces it.
    installed.unlink()
    installed.symlink_to(real_path(shutil.which("true") or "/bin/true"))
    assert seed.files() == ()


async def test_a_codex_that_cannot_start_leaves_no_seed(tmp_path: Path) -> None:
    broken = tmp_path / "codex"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    seed = CodexSeed(str(broken), tmp_path / "worker")
    await seed.make()
    assert seed.files() == ()
    assert not (tmp_path / "worker" / "codex-seed").exists()
