"""Agents run as another local user when AMUX_RUNTIME_RUN_AS is set (a root worker).

The scripted model has Pi's bash tool print its uid and save a memory document through the per-run
`amux` wrapper: the uid proves the Agent ran as that user, and the document proves the wrapper
and its 0600 connection config were that user's to read.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import MEMORY_ON
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import find_agent_cli
from tests.runtime_bridge.test_worker import agent_run, cli
from tests.runtime_bridge.test_worker_pi import start_pi_hub, tool_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

USER = "nobody"


def runs_as(uid: int, *argv: str) -> bool:
    """Whether ``uid`` can run this command from a shell, as an Agent's tools would."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return False
    done = subprocess.run(
        [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        + ["/bin/sh", "-c", 'exec "$@"', "sh", *argv],
        capture_output=True,
        check=False,
        timeout=60,
    )
    return done.returncode == 0


@pytest.fixture
def other_user() -> int:
    if os.geteuid() != 0:
        pytest.skip("running Agents as another user needs a root worker")
    try:
        uid = pwd.getpwnam(USER).pw_uid
    except KeyError:
        pytest.skip(f"no local user {USER!r}")
    if not runs_as(uid, find_agent_cli("pi"), "--version"):
        pytest.skip(f"{USER} cannot run the pi executable in this checkout")
    return uid


@pytest.fixture
def shared_work_dir() -> Iterator[Path]:
    # pytest's own temp folders are private to root; the Agent's user must pass through this one.
    path = Path(tempfile.mkdtemp(prefix="amux-run-as-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_an_agent_runs_as_the_configured_user_in_directories_it_owns(
    tmp_path: Path, other_user: int, shared_work_dir: Path
) -> None:
    script: list[Step] = [
        CallTool("bash", {"command": "id -u; touch $HOME/mine; stat -c %u $HOME/mine"}),
        Answer("Done."),
    ]
    async with FakeModelServer(script) as model:
        hub = start_pi_hub(
            tmp_path,
            model,
            AMUX_RUNTIME_RUN_AS=USER,
            AMUX_RUNTIME_WORK_DIR=str(shared_work_dir),
        )
        try:
            # What is tested is whom the Agent runs as, not who approves its commands.
            await asyncio.to_thread(hub.set_permissions, "auto")
            done = await agent_run(hub, "--provider", "pi", "Who are you?")
            assert done["state"] == "succeeded", (done.get("error"), done.get("warnings"))
            assert tool_outputs(model).split()[:2] == [str(other_user), str(other_user)]
            homes = [p / "home" for p in (shared_work_dir / "sessions").iterdir()]
            assert homes and all(h.stat().st_uid == other_user for h in homes)
            assert (shared_work_dir / "sessions").stat().st_mode & 0o777 == 0o711
            assert not list((shared_work_dir / "runs").iterdir())
        finally:
            hub.stop()


async def test_an_agent_running_as_another_user_still_reaches_memory(
    tmp_path: Path, other_user: int, shared_work_dir: Path
) -> None:
    # The sandbox binds amux's installation (its Python too, wherever it lives) where the
    # Agent's user may pass: nothing needs installing for that user on the host.
    content = "# Who\nsaved by the Agent user\n"
    script: list[Step] = [
        CallTool(
            "bash",
            {
                "command": "id -u; printf '%s' '"
                + content
                + "' | amux memory upsert topics/who.md --expected-revision absent"
            },
        ),
        Answer("Saved."),
    ]
    async with FakeModelServer(script) as model:
        hub = start_pi_hub(
            tmp_path,
            model,
            AMUX_RUNTIME_RUN_AS=USER,
            AMUX_RUNTIME_WORK_DIR=str(shared_work_dir),
            settings=MEMORY_ON,
        )
        try:
            await asyncio.to_thread(hub.set_permissions, "auto")
            done = await agent_run(hub, "--provider", "pi", "Save who you are")
            assert done["state"] == "succeeded", done
            output = tool_outputs(model)
            assert str(other_user) in output.split()
            shown = (await cli(hub, "memory", "show", "--json", "topics/who.md")).json()
            assert shown["content"] == content, output
            sessions = shared_work_dir / "sessions"
            homes = [p / "home" for p in sessions.iterdir()]
            assert homes and all(h.stat().st_uid == other_user for h in homes)
            assert not list((shared_work_dir / "runs").iterdir())
        finally:
            hub.stop()
