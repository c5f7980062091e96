"""An Agent's shell, tried as an attacker would, through a real `amux serve` and its worker.

The Agent is a stand-in shell (``tests/fakes/probe_agent.sh``) declared as a provider; it reports
what it could reach. With the sandbox on, a second Principal's Agent reaches nothing of the Hub's
files, of another Principal's memory or of the worker's environment, and nothing it starts
outlives its turn. The same probe with the sandbox off shows those reads would succeed, so a
probe that silently failed could not pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from hub.config import OWNER_TOKEN_FILE
from tests.conftest import (
    MEMORY_ISOLATED,
    HubProcess,
    free_port,
    processes_tagged,
    save_settings,
    stand_in,
    until,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
]

PROBE = "probe_agent.sh"
HUB_SECRET = "feishu-app-secret-" + uuid.uuid4().hex


def start_hub(
    tmp_path: Path, sandbox: str, settings: Mapping[str, Any] | None = None
) -> HubProcess:
    """The Hub with the probe as its one provider; ``settings`` are saved before it starts."""
    if settings:
        save_settings(tmp_path / "amux-home", settings)
    hub = HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={
            "AMUX_RUNTIME_PROVIDERS": json.dumps({"probe": str(stand_in(PROBE))}),
            "AMUX_RUNTIME_SANDBOX": sandbox,
            # A secret in the Hub's own environment (the bot stays off without an app id).
            "AMUX_FEISHU_APP_SECRET": HUB_SECRET,
        },
    )
    hub.start()
    return hub


@pytest.fixture
def sandboxed_hub(tmp_path: Path) -> Iterator[HubProcess]:
    hub = start_hub(tmp_path, "bwrap")
    try:
        yield hub
    finally:
        hub.stop()


def run_probe(hub: HubProcess, token: str, *commands: str) -> dict[str, Any]:
    """One probe turn as the Principal of ``token``; its report lines, checked to have run."""
    nonce = uuid.uuid4().hex
    prompt = "\n".join((f"nonce {nonce}", *commands)) + "\n"
    done = hub.cli(
        "agent",
        "run",
        "--json",
        "--provider",
        "probe",
        prompt,
        env={"AMUX_TOKEN": token},
        timeout=120,
    )
    assert done.stdout, done.stderr
    result = dict(json.loads(done.stdout))
    assert result["state"] == "succeeded", result
    lines = str(result["text"]).splitlines()
    assert f"nonce {nonce}" in lines, result
    result["lines"] = lines
    return result


def add_principal(hub: HubProcess, name: str) -> str:
    assert hub.cli("principal", "add", name).returncode == 0
    issued = hub.cli("token", "issue", name)
    assert issued.returncode == 0, issued.stderr
    return issued.stdout.strip()


def save_owner_note(hub: HubProcess, text: str) -> Path:
    """A note in the owner's own scope; returns its file under the memory root."""
    done = hub.cli(
        "memory", "upsert", "notes/private.md", "--expected-revision", "absent", input=text
    )
    assert done.returncode == 0, done.stderr
    (found,) = list((hub.home / "memory").rglob("private.md"))
    return found


def attack(hub: HubProcess, note: Path, tag: str) -> list[str]:
    assert hub.proc is not None
    return [
        f"read {hub.home / OWNER_TOKEN_FILE}",
        f"read {hub.home / 'state.sqlite3'}",
        f"read {note}",
        f"read /proc/{hub.proc.pid}/environ",
        f"list {hub.home}",
        f"environ {HUB_SECRET}",
        "write CLAUDE.md",
        "write .claude/settings.json",
        "read CLAUDE.md",
        f"spawn {tag}",
    ]


async def test_another_principals_agent_reaches_no_hub_file_no_memory_and_leaves_nothing_behind(
    sandboxed_hub: HubProcess,
) -> None:
    hub = sandboxed_hub
    await asyncio.to_thread(hub.enable_memory, True)
    note = save_owner_note(hub, "# Private\nthe owner's bank PIN is 4711\n")
    bob = add_principal(hub, "bob")
    tag = f"amux-probe-{uuid.uuid4().hex}"

    report = await asyncio.to_thread(run_probe, hub, bob, *attack(hub, note, tag))
    lines = report["lines"]

    assert f"read-denied {hub.home / OWNER_TOKEN_FILE}" in lines
    assert f"read-denied {hub.home / 'state.sqlite3'}" in lines
    assert f"read-denied {note}" in lines
    assert f"read-denied /proc/{hub.proc.pid if hub.proc else 0}/environ" in lines
    assert f"list-empty {hub.home}" in lines
    assert "environ-none" in lines
    # Its own workspace works: the denials above are the sandbox, not a broken probe.
    assert "wrote CLAUDE.md" in lines and "read-ok CLAUDE.md" in lines
    assert f"spawned {tag}" in lines
    # What it left running ended with its turn.
    await until(lambda: not processes_tagged(tag), 10)

    # The owner's next turn works in a workspace of its own: none of bob's files are there.
    own = await asyncio.to_thread(run_probe, hub, hub.owner_token, "cwd")
    (cwd_line,) = [line for line in own["lines"] if line.startswith("cwd ")]
    assert "CLAUDE.md" not in cwd_line and ".claude" not in cwd_line
    workspaces = {p.name for p in (hub.home / "runtime" / "workspaces").iterdir()}
    assert len(workspaces) == 2


@pytest.fixture
def visible() -> Iterator[Path]:
    """A file anyone on the host may read, outside every workspace."""
    outside = Path(tempfile.mkdtemp(prefix="amux-probe-outside-"))
    outside.chmod(0o755)
    readable = outside / "readable.txt"
    readable.write_text("anyone on the host may read this")
    readable.chmod(0o644)
    try:
        yield readable
    finally:
        shutil.rmtree(outside, ignore_errors=True)


async def test_without_the_sandbox_the_same_probe_reads_the_hubs_secrets(
    tmp_path: Path, visible: Path
) -> None:
    """The control: the probe does detect what the sandbox prevents.

    A root worker runs even an unsandboxed Agent as a uid of its Principal's own, so there the
    Hub's private files stay out of reach and what shows is everything else on the host: a
    world-readable file outside the workspace, which the sandbox hides.
    """
    hub = start_hub(tmp_path, "off", MEMORY_ISOLATED)
    try:
        note = save_owner_note(hub, "# Private\nvisible without a sandbox\n")
        bob = add_principal(hub, "bob")
        tag = f"amux-probe-{uuid.uuid4().hex}"
        commands = (*attack(hub, note, tag), f"read {visible}")
        report = await asyncio.to_thread(run_probe, hub, bob, *commands)
        lines = report["lines"]
        assert f"read-ok {visible}" in lines
        if os.geteuid() == 0:
            assert f"read-denied {hub.home / OWNER_TOKEN_FILE}" in lines
            assert f"read-denied {note}" in lines
            assert "environ-none" in lines
        else:
            assert f"read-ok {hub.home / OWNER_TOKEN_FILE}" in lines
            assert f"read-ok {note}" in lines
            assert "environ-hit" in lines
        for pid in processes_tagged(tag):
            os.kill(pid, 9)
    finally:
        hub.stop()


async def test_the_sandbox_hides_a_readable_file_outside_the_workspace(
    sandboxed_hub: HubProcess, visible: Path
) -> None:
    report = await asyncio.to_thread(
        run_probe, sandboxed_hub, sandboxed_hub.owner_token, f"read {visible}"
    )
    assert f"read-denied {visible}" in report["lines"]


def test_an_undeclared_provider_is_refused_at_submit_and_nothing_runs(
    sandboxed_hub: HubProcess,
) -> None:
    done = sandboxed_hub.cli("agent", "run", "--provider", "sh", "id")
    assert done.returncode != 0
    assert done.stderr.startswith("error: invalid_argument: unknown provider 'sh'")
    assert "claude, codex, pi, probe" in done.stderr
    status, body = sandboxed_hub.rpc("executions.submit", provider="sh", prompt="id")
    assert status == 400 and body["error"]["code"] == "invalid_argument"
    assert not (sandboxed_hub.home / "runtime" / "runs").exists() or not any(
        (sandboxed_hub.home / "runtime" / "runs").iterdir()
    )
