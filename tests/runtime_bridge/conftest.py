"""Fixtures for running the real agent CLIs offline against the fake model server."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hub.contract import Session
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.launch import LaunchSite, write_seccomp_file
from runtime_bridge.launch_env import DEFAULT_PASS_ENV
from runtime_bridge.providers import Event, LaunchPlan, LaunchRequest, MemoryAttachment, build_plan
from runtime_bridge.providers.confined import open_dir, open_root
from tests.conftest import HubProcess, free_port, save_settings

REPO = Path(__file__).resolve().parents[2]
AGENT_BIN = REPO / "tools" / "agent-clis" / "node_modules" / ".bin"
STUB_MCP = REPO / "tests" / "fakes" / "stub_mcp.py"

TEST_PASS_ENV = (*DEFAULT_PASS_ENV, "PI_OFFLINE")
CREDENTIAL = "amux-delegated-secret-0123"
BINDING = "principal:p-test"
HUB_URL = "http://127.0.0.1:9/hub"


def find_agent_cli(name: str) -> str:
    """The pinned CLI from tools/agent-clis, else one on PATH; skip the test if neither exists."""
    pinned = AGENT_BIN / name
    if pinned.is_file() and os.access(pinned, os.X_OK):
        return str(pinned)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"agent CLI {name!r} is not installed (run `make agents`)")
    return found


def serve_agents(
    tmp_path: Path, env: Mapping[str, str], settings: Mapping[str, Any] | None = None
) -> HubProcess:
    """`amux serve` over ``tmp_path/amux-home`` with ``env``, its Agents' HOME in
    ``tmp_path/agent-home``; ``settings`` are saved before it starts, so they run from the start
    without a restart."""
    home = tmp_path / "amux-home"
    if settings:
        save_settings(home, settings)
    agent_home = tmp_path / "agent-home"
    agent_home.mkdir(exist_ok=True)
    hub = HubProcess(home, free_port(), extra_env={"HOME": str(agent_home), **env})
    hub.start()
    return hub


@pytest.fixture
def claude_bin() -> str:
    return find_agent_cli("claude")


@pytest.fixture
def codex_bin() -> str:
    return find_agent_cli("codex")


@pytest.fixture
def pi_bin() -> str:
    return find_agent_cli("pi")


def offline_env(home: Path, model_url: str) -> dict[str, str]:
    """A base environment that points every CLI at the fake and nowhere else."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "OPENAI_API_KEY": "sk-openai-test",
        "PI_OFFLINE": "1",
        # Would be dropped by launch hygiene; here to prove it.
        "CLAUDE_CONFIG_DIR": str(home / "service-claude"),
        "CODEX_HOME": str(home / "service-codex"),
        "AMUX_TOKEN": "service-token-must-not-leak",
    }


@dataclass
class StubMcp:
    """The stub MCP server's argv and what it recorded."""

    argv: tuple[str, ...]
    log: Path

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]


@pytest.fixture
def stub_mcp(tmp_path: Path) -> StubMcp:
    log = tmp_path / "stub-mcp.jsonl"
    env_cmd = shutil.which("env") or "/usr/bin/env"
    # The log path rides on argv so the stub needs nothing from the agent's environment.
    return StubMcp((env_cmd, f"STUB_MCP_LOG={log}", sys.executable, str(STUB_MCP)), log)


@dataclass
class StubCli:
    """A directory holding a stub ``amux`` executable, and what it recorded."""

    directory: Path
    log: Path

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]


STUB_CLI = """#!{python}
import json, os, sys
args = sys.argv[1:]
stdin = sys.stdin.read() if args[:2] == ["memory", "upsert"] else None
keys = ("AMUX_HUB_URL", "AMUX_TOKEN", "AMUX_MEMORY_BINDING")
entry = {{"argv": args, "stdin": stdin, "env": {{k: os.environ.get(k) for k in keys}}}}
with open({log!r}, "a", encoding="utf-8") as out:
    out.write(json.dumps(entry) + "\\n")
if args[:2] == ["memory", "search"]:
    print(json.dumps({{"matches": [{{"path": "preferences/communication.md", "line": 1,
        "snippet": "STUB-CLI-HIT: answer in English", "revision": "0" * 64}}]}}))
else:
    print(json.dumps({{"path": args[2] if len(args) > 2 else None, "revision": "1" * 64}}))
"""


@pytest.fixture
def stub_cli(tmp_path: Path) -> StubCli:
    directory = tmp_path / "amux-cli"
    directory.mkdir()
    log = tmp_path / "stub-cli.jsonl"
    script = directory / "amux"
    script.write_text(STUB_CLI.format(python=sys.executable, log=str(log)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return StubCli(directory, log)


@pytest.fixture
def attachment_for() -> Callable[..., MemoryAttachment]:
    def make(
        mcp_argv: tuple[str, ...] = ("amux", "mcp"), cli_dir: Path | None = None
    ) -> MemoryAttachment:
        return MemoryAttachment(
            hub_url=HUB_URL,
            credential=CREDENTIAL,
            binding=BINDING,
            mcp_argv=mcp_argv,
            cli_dir=cli_dir,
        )

    return make


def offline_request(
    tmp_path: Path,
    model_url: str,
    provider: str,
    executable: str,
    memory: MemoryAttachment | None,
    *,
    prompt: str,
    resume_id: str | None = None,
    **options: Any,
) -> LaunchRequest:
    """A launch of the real CLI against the fake model: per-test dirs, no outside traffic."""
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    return LaunchRequest(
        provider=provider,
        prompt=prompt,
        cwd=workdir,
        run_dir=tmp_path / "run",
        resume_id=resume_id,
        memory=memory,
        executable=executable,
        base_env=offline_env(tmp_path / "home", model_url),
        pass_env=TEST_PASS_ENV,
        **options,
    )


def stub_search_call(query: str) -> dict[str, Any]:
    """What the stub MCP server records for one amux.memory_search from a bound launch."""
    return {
        "tool": "amux.memory_search",
        "arguments": {"query": query, "path_prefix": None, "limit": None},
        "env": {"AMUX_HUB_URL": HUB_URL, "AMUX_TOKEN": CREDENTIAL, "AMUX_MEMORY_BINDING": BINDING},
    }


async def collect(events: AsyncIterator[Event]) -> list[Event]:
    return [event async for event in events]


def sandboxed_launch(
    settings: RuntimeSettings,
    provider: str,
    base_env: dict[str, str],
    permissions: str,
    amux_argv: tuple[str, ...] = (),
) -> tuple[LaunchPlan, LaunchRequest]:
    """One launch as a worker builds it, inside the bwrap sandbox: the worker's directories
    passable but not readable, the Agent's workspace and home its own (a uid of its own on a
    root host), made through directory descriptors as the worker makes them."""
    assert settings.work_dir is not None
    work_dir = settings.work_dir
    site = LaunchSite(settings, work_dir, amux_home=work_dir.parent / "amux-home")
    session = Session("s1", "p1", provider, None, None, None, "unbound", None)
    owner = site.identity_of(session)
    for parent in (work_dir / "runs", work_dir / "sessions", site.workspaces):
        parent.mkdir(parents=True, exist_ok=True, mode=0o711)
        parent.chmod(0o711)
    work_dir.chmod(0o711)
    site.run_dir("e1").mkdir(mode=0o711)
    with open_root(work_dir / "sessions") as sessions, open_dir(sessions, Path("s1/home"), owner):
        pass
    cwd = site.workspace(session)
    with open_root(site.workspaces) as workspaces, open_dir(workspaces, Path(cwd.name), owner):
        pass
    write_seccomp_file(work_dir)
    request = site.request(
        provider=provider,
        prompt="Do the work.",
        session=session,
        execution_id="e1",
        memory=None,
        base_env=base_env,
        own_home=True,
        permissions=permissions,
        amux_argv=amux_argv,
    )
    plan = build_plan(request)
    plan = site.sandbox(dataclasses.replace(plan, run_as=owner), request, (), amux_argv[:1])
    assert plan.sandbox
    return plan, request
