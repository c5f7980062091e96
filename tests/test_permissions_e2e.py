"""Agents that do the work, through a real `amux serve` with the real CLIs in their sandbox.

One Hub runs Claude, Codex and Pi against the scripted model. Under ``auto`` each writes a file
with its own edit tool and runs a command that writes another; under ``ask`` each edit waits for
its person (``amux agent run --approve``), a denial reaches the model, an unanswered request is
denied at the timeout and "allow for this conversation" is not asked again; under ``read-only``
nothing in the workspace changes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from runtime_bridge.launch import principal_key
from runtime_bridge.launch_env import DEFAULT_PASS_ENV
from tests.conftest import CliResult, HubProcess, free_port
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import find_agent_cli
from tests.runtime_bridge.test_codex_permissions import command, config_for, patch_adding
from tests.runtime_bridge.test_worker_pi import PI_ARGS, pi_agent_source

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(420),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
]


def start(tmp_path: Path, model: FakeModelServer) -> HubProcess:
    """`amux serve` whose in-process worker launches all three pinned CLIs against ``model``."""
    agent_home = tmp_path / "agent-home"
    agent_home.mkdir()
    hub = HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={
            "HOME": str(agent_home),
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "AMUX_RUNTIME_CLAUDE": find_agent_cli("claude"),
            "OPENAI_API_KEY": "sk-openai-test",
            "AMUX_RUNTIME_CODEX": find_agent_cli("codex"),
            "AMUX_RUNTIME_CODEX_CONFIG": str(config_for(tmp_path, model)),
            "PI_OFFLINE": "1",
            "AMUX_RUNTIME_PI": find_agent_cli("pi"),
            "AMUX_RUNTIME_PI_ARGS": json.dumps(PI_ARGS),
            "AMUX_RUNTIME_PI_AGENT_DIR": str(pi_agent_source(tmp_path, model)),
            "AMUX_RUNTIME_PASS_ENV": json.dumps([*DEFAULT_PASS_ENV, "PI_OFFLINE"]),
            "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
        },
    )
    hub.start()
    return hub


async def cli(hub: HubProcess, *args: str) -> CliResult:
    # The fake model shares this event loop, so the blocking CLI runs in a thread.
    return await asyncio.to_thread(hub.cli, *args, timeout=200)


async def agent_run(hub: HubProcess, *args: str) -> dict[str, Any]:
    done = await cli(hub, "agent", "run", "--json", *args)
    assert done.stdout, f"{done.stderr}\n{hub.log()[-4000:]}"
    result = dict(json.loads(done.stdout))
    result["stderr"] = done.stderr
    return result


async def set_policy(hub: HubProcess, key: str, value: str) -> None:
    done = await cli(hub, "system", "config", "set", key, value)
    assert done.returncode == 0, done.stderr


def workspace_of(hub: HubProcess, tmp_path: Path) -> Path:
    status, who = hub.rpc("system.whoami")
    assert status == 200, who
    return tmp_path / "runtime" / "workspaces" / principal_key(who["principal"]["id"])


def edit_step(provider: str, workspace: Path, name: str, line: str) -> CallTool:
    """The provider's own edit tool, creating ``name`` with ``line``."""
    if provider == "claude":
        return CallTool("Write", {"file_path": str(workspace / name), "content": line + "\n"})
    if provider == "codex":
        return patch_adding(name, line)
    return CallTool("write", {"path": name, "content": line + "\n"})


def command_step(provider: str, shell: str) -> CallTool:
    """The provider's own shell tool running ``shell``."""
    if provider == "claude":
        return CallTool("Bash", {"command": shell, "description": "Run it"})
    if provider == "codex":
        return command(shell)
    return CallTool("bash", {"command": shell})


def copies_of(root: Path, name: str) -> list[Path]:
    return sorted(path for path in root.rglob(name) if path.is_file())


async def test_under_auto_each_agent_edits_and_runs_a_command_in_its_principals_workspace(
    tmp_path: Path,
) -> None:
    providers = ("claude", "codex", "pi")
    async with FakeModelServer() as model:
        hub = await asyncio.to_thread(start, tmp_path, model)
        try:
            await set_policy(hub, "agents.permissions", "auto")
            workspace = workspace_of(hub, tmp_path)
            for provider in providers:
                marker = f"ran-by-{provider}"
                script: list[Step] = [
                    edit_step(provider, workspace, f"edited-{provider}.txt", f"made by {provider}"),
                    command_step(
                        provider,
                        f"echo {marker} > command-{provider}.txt && cat command-{provider}.txt",
                    ),
                    Answer(f"{provider} finished"),
                ]
                model.add_steps(script)
                seen = len(model.tool_results)
                done = await agent_run(hub, "--provider", provider, "Make the two files")
                assert done["state"] == "succeeded", done
                assert done["text"] == f"{provider} finished"
                outputs = [text for _, text in model.tool_results[seen:]]
                # The command's output came back to the model.
                assert any(marker in text for text in outputs), outputs
                assert done["approvals"] == []
        finally:
            hub.stop()
    for provider in providers:
        edited = workspace / f"edited-{provider}.txt"
        assert edited.read_text() == f"made by {provider}\n"
        assert (workspace / f"command-{provider}.txt").read_text() == f"ran-by-{provider}\n"
        # In that Principal's workspace and nowhere else.
        assert copies_of(tmp_path, edited.name) == [edited]
        assert copies_of(tmp_path, f"command-{provider}.txt") == [
            workspace / f"command-{provider}.txt"
        ]
        assert edited.stat().st_uid != 0


@pytest.mark.parametrize("provider", ["claude", "codex"])
async def test_under_ask_an_edit_waits_for_its_person_and_a_denial_reaches_the_model(
    tmp_path: Path, provider: str
) -> None:
    async with FakeModelServer() as model:
        hub = await asyncio.to_thread(start, tmp_path, model)
        try:
            workspace = workspace_of(hub, tmp_path)
            model.add_steps(
                [edit_step(provider, workspace, "allowed.txt", "yes"), Answer("edited")]
            )
            allowed = await agent_run(
                hub, "--provider", provider, "--approve", "once", "Make allowed.txt"
            )
            assert allowed["state"] == "succeeded", allowed
            (request,) = allowed["approvals"]
            assert request["action"] == "edit" and "allowed.txt" in request["subject"]
            assert request["decision"] == "allow_once" and request["decided_by_name"] == "owner"
            assert (workspace / "allowed.txt").read_text() == "yes\n"

            model.add_steps([edit_step(provider, workspace, "denied.txt", "no"), Answer("ok")])
            seen = len(model.tool_results)
            denied = await agent_run(
                hub, "--provider", provider, "--approve", "deny", "Make denied.txt"
            )
            assert denied["state"] == "succeeded", denied
            (refusal,) = denied["approvals"]
            assert refusal["decision"] == "deny"
            assert not (workspace / "denied.txt").exists()
            told = " ".join(text for _, text in model.tool_results[seen:])
            assert "denied" in told or "rejected" in told, told

            # Nobody answers: denied at the timeout, and the Agent is told why.
            await set_policy(hub, "agents.approval_timeout", "2s")
            model.add_steps([edit_step(provider, workspace, "late.txt", "late"), Answer("ok")])
            status, body = hub.rpc("executions.submit", provider=provider, prompt="Make late.txt")
            assert status == 200, body
            execution_id = body["execution"]["id"]
            finished = await asyncio.to_thread(wait_finished, hub, execution_id)
            requests = approvals_of(finished)
            assert [r["via"] for r in requests if r["decision"]] == ["timeout"], requests
            assert not (workspace / "late.txt").exists()
        finally:
            hub.stop()


async def test_allow_for_this_conversation_is_not_asked_again_on_its_next_turn(
    tmp_path: Path,
) -> None:
    async with FakeModelServer() as model:
        hub = await asyncio.to_thread(start, tmp_path, model)
        try:
            workspace = workspace_of(hub, tmp_path)
            shell = "touch session-rule.txt"
            model.add_steps([command_step("claude", shell), Answer("first")])
            first = await agent_run(hub, "--provider", "claude", "--approve", "session", "Touch it")
            assert first["state"] == "succeeded", first
            assert [r["decision"] for r in first["approvals"]] == ["allow_session"]
            model.add_steps([command_step("claude", shell), Answer("second")])
            # No --approve and no terminal: anything asked would be denied.
            second = await agent_run(
                hub, "--provider", "claude", "--session", first["session_id"], "Again"
            )
            assert second["state"] == "succeeded", second
            assert [(r["decision"], r["via"]) for r in second["approvals"]] == [
                ("allow_session", "rule")
            ]
            assert "--approve" not in second["stderr"]
        finally:
            hub.stop()
    assert (workspace / "session-rule.txt").is_file()


async def test_under_read_only_an_edit_fails_and_the_workspace_is_unchanged(
    tmp_path: Path,
) -> None:
    async with FakeModelServer() as model:
        hub = await asyncio.to_thread(start, tmp_path, model)
        try:
            workspace = workspace_of(hub, tmp_path)
            model.add_steps([Answer("hello")])
            warm = await agent_run(hub, "--provider", "claude", "Say hello")
            assert warm["state"] == "succeeded", warm
            before = sorted(p.name for p in workspace.iterdir())
            await set_policy(hub, "agents.permissions", "read-only")
            # The plan shows the policy the next turn runs under, and the flags it became.
            shown = await cli(hub, "runtime", "plan", "--json", "--provider", "claude")
            assert shown.returncode == 0, shown.stderr
            plan = json.loads(shown.stdout)
            assert plan["permissions"] == "read-only"
            assert "Write,Edit,MultiEdit,NotebookEdit" in plan["argv"]
            assert [
                words
                for words in zip(plan["sandbox"], plan["sandbox"][1:], strict=False)
                if words == ("--ro-bind", str(workspace))
            ]
            for provider in ("claude", "codex", "pi"):
                model.add_steps(
                    [
                        edit_step(provider, workspace, f"ro-{provider}.txt", "no"),
                        command_step(provider, f"echo no > ro-cmd-{provider}.txt"),
                        Answer("tried"),
                    ]
                )
                done = await agent_run(hub, "--provider", provider, "Try to write")
                assert done["state"] == "succeeded", done
        finally:
            hub.stop()
    assert sorted(p.name for p in workspace.iterdir()) == before


def wait_finished(hub: HubProcess, execution_id: str) -> dict[str, Any]:
    """Follow a turn with ``executions.watch`` until it ends; its events, folded."""
    events: list[dict[str, Any]] = []
    after = 0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status, watched = hub.rpc(
            "executions.watch", execution_id=execution_id, after=after, wait_seconds=20
        )
        assert status == 200, watched
        events += watched["events"]
        if watched["events"]:
            after = watched["events"][-1]["seq"]
        if watched["state"] in ("succeeded", "failed", "cancelled"):
            return {"execution": watched, "events": events}
    raise AssertionError(f"{execution_id} did not finish")


def approvals_of(finished: dict[str, Any]) -> list[dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for event in finished["events"]:
        if event["kind"] == "approval":
            request = json.loads(event["text"])
            latest[request["request_id"]] = request
    return list(latest.values())
