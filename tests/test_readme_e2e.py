"""The README's "Next steps" run as a newcomer runs them, on a fresh directory after `make serve`.

`make serve` sets no AMUX_HOME, so the Hub keeps its state in the relative `./.amux` and the
in-process worker launches the pinned agent CLIs in their sandbox from there. Only the model
provider is a scripted fake on loopback; the commands are the README's own lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, CliResult, HubProcess, free_port
from tests.fakes.model_server import Answer, FakeModelServer
from tests.runtime_bridge.conftest import find_agent_cli

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
]

README = REPO / "README.md"
SESSION_PLACEHOLDER = "<id from the first run>"
# bwrap options followed by that many host or sandbox paths.
PATH_OPTIONS = {
    "--bind": 2,
    "--ro-bind": 2,
    "--dev-bind": 2,
    "--chdir": 1,
    "--tmpfs": 1,
    "--dir": 1,
}


def next_step(number: int) -> list[str]:
    """The `.venv/bin/amux` command lines of the README's next step ``number``."""
    text = README.read_text(encoding="utf-8")
    section = re.search(rf"\*\*{number}\. .*?```sh\n(.*?)```", text, re.S)
    assert section is not None, f"README has no step {number} with a sh block"
    return [line for line in section.group(1).splitlines() if line.startswith(".venv/bin/amux ")]


def as_run(hub: HubProcess, line: str, session: str | None = None) -> CliResult:
    """One README line run from the Hub's directory; its `.venv/bin/amux` is this checkout's."""
    if session is not None:
        line = line.replace(SESSION_PLACEHOLDER, session)
    argv = shlex.split(line, comments=True)
    return hub.cli(*argv[1:], timeout=150)


def session_of(done: CliResult) -> str:
    found = re.findall(r"^session: (\S+)$", done.stderr, re.M)
    assert len(found) == 1, done.stderr
    return str(found[0])


async def test_readme_step_2_as_written_runs_resumes_and_plans_with_absolute_paths(
    tmp_path: Path,
) -> None:
    enable, restart = next_step(1)[:2]
    assert enable.startswith(".venv/bin/amux system config set memory.enabled true ")
    assert restart.startswith(".venv/bin/amux system restart ")
    first_run, second_run, plan = next_step(2)
    assert SESSION_PLACEHOLDER in second_run

    claude = Path(find_agent_cli("claude"))
    checkout = tmp_path / "fresh"
    checkout.mkdir()
    agent_home = tmp_path / "home"
    agent_home.mkdir()
    script = [Answer("Noted: conclusion, evidence, risks."), Answer("You asked me to remember.")]
    async with FakeModelServer(script) as model:
        hub = HubProcess(
            checkout / ".amux",
            free_port(),
            default_home=True,
            extra_env={
                # What `make serve` puts first on PATH, and the provider settings README step 2
                # asks for, here naming the fake.
                "PATH": f"{claude.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "HOME": str(agent_home),
                "ANTHROPIC_BASE_URL": model.base_url,
                "ANTHROPIC_API_KEY": "sk-ant-test",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            },
        )
        await asyncio.to_thread(hub.start)
        try:
            done = await asyncio.to_thread(as_run, hub, enable)
            assert done.returncode == 0, done.stderr
            done = await asyncio.to_thread(as_run, hub, restart)
            assert done.returncode == 0, done.stderr
            await asyncio.to_thread(hub.wait_restarted)

            first = await asyncio.to_thread(as_run, hub, first_run)
            assert first.returncode == 0, f"{first.stderr}\n{hub.log()}"
            assert first.stdout == "Noted: conclusion, evidence, risks.\n"
            session = session_of(first)

            second = await asyncio.to_thread(as_run, hub, second_run, session)
            assert second.returncode == 0, f"{second.stderr}\n{hub.log()}"
            assert second.stdout == "You asked me to remember.\n"
            assert session_of(second) == session
            # The second turn resumed the first conversation: the model saw its prompt again.
            resumed = json.dumps(model.main_requests[-1].body["messages"])
            assert "review reports need conclusion, evidence, risks" in resumed

            shown = await asyncio.to_thread(as_run, hub, plan)
            assert shown.returncode == 0, shown.stderr
            launch = json.loads(shown.stdout)
            assert launch["warnings"] == []
            workspaces = checkout / ".amux" / "runtime" / "workspaces"
            assert Path(launch["cwd"]).parent == workspaces
            sandbox = launch["sandbox"]
            # The Hub's home, hidden from the Agent, is named by its absolute path.
            assert str(checkout / ".amux") in sandbox
            paths = [
                sandbox[at + 1 + n]
                for at, option in enumerate(sandbox)
                for n in range(PATH_OPTIONS.get(option, 0))
            ]
            assert paths
            assert [path for path in paths if not os.path.isabs(path)] == []
        finally:
            await asyncio.to_thread(hub.stop)
