"""`amux doctor` as an operator runs it: a real `amux serve`, the real CLI, a fake Feishu server."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from bot.commands.doctor import check_feishu_ingress, check_root_lock
from bot.config import FeishuSettings
from tests.conftest import AMUX, REPO, HubProcess, free_port, wait_until
from tests.fakes.feishu import FakeFeishu

pytestmark = pytest.mark.e2e

AGENT_BIN = REPO / "tools" / "agent-clis" / "node_modules" / ".bin"


@pytest.fixture
def stub_agents(shared_dir: Path) -> dict[str, str]:
    """Agent CLIs that answer --version at once, so checks not about agents stay quick; where
    an Agent's uid may run them."""
    env = {}
    for provider in ("claude", "codex", "pi"):
        script = shared_dir / f"{provider}-stub"
        script.write_text(f"#!/bin/sh\necho '{provider} 9.9.9-stub'\n")
        script.chmod(0o755)
        env[f"AMUX_RUNTIME_{provider.upper()}"] = str(script)
    return env


def doctor(hub: HubProcess, env: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, Any]]:
    result = hub.cli("doctor", "--json", env=env)
    assert "Traceback" not in result.stderr, result.stderr
    report = result.json()
    return result.returncode, report, {c["name"]: c for c in report["checks"]}


def wait_for_worker(hub: HubProcess) -> None:
    def connected() -> bool:
        status, body = hub.rpc("system.capabilities")
        return status == 200 and body["runtime"]["workers"] >= 1

    wait_until(connected, 20)


def test_doctor_passes_against_a_running_hub_and_names_the_real_agent_versions(
    hub_process: HubProcess,
) -> None:
    if not (AGENT_BIN / "claude").exists():
        pytest.skip("the pinned agent CLIs are not installed (make agents)")
    wait_for_worker(hub_process)
    env = {f"AMUX_RUNTIME_{p.upper()}": str(AGENT_BIN / p) for p in ("claude", "codex", "pi")}
    code, report, checks = doctor(hub_process, env)
    assert code == 0, report
    assert report["ok"] is True
    assert checks["hub"]["status"] == "ok"
    assert "as owner (user)" in checks["hub"]["detail"]
    assert checks["amux_home"]["status"] == "ok"
    assert checks["memory_root_lock"]["detail"] == (
        f"held by a running Hub (pid {hub_process.proc.pid})"  # type: ignore[union-attr]
    )
    assert checks["memory"]["detail"].startswith("enabled: saved off, running off")
    assert checks["workers"]["status"] == "ok"
    assert checks["feishu_credentials"]["status"] == "skip"
    assert "(Claude Code)" in checks["agent_claude"]["detail"]
    assert checks["agent_codex"]["detail"].startswith("codex-cli ")
    assert checks["agent_pi"]["status"] == "ok"


def test_human_output_puts_a_fix_under_each_failure_and_exits_1(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    env = {**stub_agents, "AMUX_HUB_URL": f"http://127.0.0.1:{free_port()}"}
    result = hub_process.cli("doctor", env=env)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    hub_line = next(i for i, line in enumerate(lines) if line.startswith("[FAIL] hub"))
    assert "cannot reach the Hub" in lines[hub_line]
    assert lines[hub_line + 1].strip().startswith("fix: start the Hub")
    assert any(line.startswith("[skip] workers") for line in lines)
    assert lines[-1].startswith("1 check(s) failed")


def test_a_refused_token_is_named_with_how_to_get_a_valid_one(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    code, _, checks = doctor(hub_process, {**stub_agents, "AMUX_TOKEN": "amux_" + "x" * 43})
    assert code == 1
    assert checks["hub"]["detail"].startswith("up, but the credential is refused")
    assert "amux token issue" in checks["hub"]["fix"]
    assert checks["memory"]["status"] == "skip"


def test_a_revoked_local_owner_token_is_named_with_the_command_that_replaces_it(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    (owner,) = hub_process.cli("token", "list", "--json", "owner").json()
    assert hub_process.cli("token", "revoke", owner["id"], "--yes").returncode == 0
    code, _, checks = doctor(hub_process, stub_agents)
    assert code == 1
    assert checks["hub"]["detail"].startswith(
        f"up, but the local owner token in {hub_process.home / 'owner.token'} is refused"
    )
    assert "`amux token issue --owner-file`" in checks["hub"]["fix"]
    assert hub_process.cli("token", "issue", "--owner-file").returncode == 0
    code, _, checks = doctor(hub_process, stub_agents)
    assert checks["hub"]["status"] == "ok"


def test_a_home_other_users_can_enter_fails_with_a_chmod_fix(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    hub_process.home.chmod(0o755)
    try:
        code, _, checks = doctor(hub_process, stub_agents)
    finally:
        hub_process.home.chmod(0o700)
    assert code == 1
    assert "mode 0755 lets other users in" in checks["amux_home"]["detail"]
    assert (
        checks["amux_home"]["fix"]
        == f"chown -R $(id -un) {hub_process.home} && chmod 700 {hub_process.home}"
    )


def test_a_saved_but_not_running_memory_setting_is_a_warning_with_the_restart_fix(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    wait_for_worker(hub_process)
    assert hub_process.cli("system", "config", "set", "memory.enabled", "true").returncode == 0
    code, _, checks = doctor(hub_process, stub_agents)
    assert code == 0
    assert checks["memory"]["status"] == "warn"
    assert "enabled: saved on, running off" in checks["memory"]["detail"]
    assert "amux system restart" in checks["memory"]["fix"]


def test_the_permission_policy_the_hub_runs_is_named_and_a_change_shows_without_a_restart(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    wait_for_worker(hub_process)
    _, _, checks = doctor(hub_process, stub_agents)
    permissions = checks["permissions"]
    assert permissions["status"] == "ok"
    assert permissions["detail"].startswith("ask: edits and changing commands wait")
    assert "Claude asks through amux's permission prompt" in permissions["detail"]
    assert "denied after 10 min" in permissions["detail"]
    changed = hub_process.cli("system", "config", "set", "agents.permissions", "read-only")
    assert changed.returncode == 0, changed.stderr
    assert "no restart needed" in changed.stderr
    _, _, checks = doctor(hub_process, stub_agents)
    assert checks["permissions"]["detail"].startswith("read-only: the workspace is mounted")


def test_a_missing_default_agent_fails_and_names_its_setting(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    env = {**stub_agents, "AMUX_RUNTIME_CLAUDE": "/nonexistent/claude"}
    code, _, checks = doctor(hub_process, {**env, "AMUX_RUNTIME_CODEX": "/nonexistent/codex"})
    assert code == 1
    assert checks["agent_claude"]["status"] == "fail"
    assert "AMUX_RUNTIME_CLAUDE" in checks["agent_claude"]["fix"]
    # Only the Agent new conversations use is required; the others are warnings.
    assert checks["agent_codex"]["status"] == "warn"


def test_each_declared_provider_is_checked_and_a_missing_one_fails(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    providers = {"probe": "/bin/sh", "gone": "/nonexistent/agent"}
    env = {**stub_agents, "AMUX_RUNTIME_PROVIDERS": json.dumps(providers)}
    code, _, checks = doctor(hub_process, env)
    assert code == 1
    assert checks["agent_probe"]["status"] == "ok"
    assert checks["agent_probe"]["detail"] == "declared provider (/bin/sh)"
    assert checks["agent_gone"]["status"] == "fail"
    assert "AMUX_RUNTIME_PROVIDERS" in checks["agent_gone"]["fix"]


def test_an_invalid_setting_fails_the_settings_check_without_a_traceback(
    hub_process: HubProcess,
) -> None:
    code, report, checks = doctor(hub_process, {"AMUX_LEASE_SECONDS": "soon"})
    assert code == 1
    assert list(checks) == ["settings"]
    assert "lease_seconds" in checks["settings"]["detail"]
    assert "amux.env.example" in checks["settings"]["fix"]
    assert report["ok"] is False


def test_the_lock_is_reported_free_once_the_hub_stops(hub_process: HubProcess) -> None:
    memory_root = hub_process.home / "memory"
    hub_process.stop()
    check = check_root_lock(memory_root)
    assert check.status == "warn"
    assert check.detail.startswith("free: no running Hub")


def test_a_hub_held_to_1024_open_files_is_a_warning_naming_the_unit_setting(
    tmp_path: Path, stub_agents: dict[str, str]
) -> None:
    # systemd's default for a unit without LimitNOFILE=, the hard limit too: no way to raise it.
    hub = HubProcess(tmp_path / "amux-home", free_port(), prefix=["prlimit", "--nofile=1024", "--"])
    hub.start()
    try:
        _, _, checks = doctor(hub, stub_agents)
        assert hub.proc is not None
        pid = hub.proc.pid
    finally:
        if hub.proc is not None:
            hub.proc.terminate()
        hub.stop()
    check = checks["open_files"]
    assert check["status"] == "warn", check
    assert check["detail"] == f"the running Hub (pid {pid}) may open 1024 files, under 4096"
    assert "LimitNOFILE=65536" in check["fix"]


# -- Feishu ---------------------------------------------------------------------------------------


async def run_doctor(hub: HubProcess, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """The CLI as a subprocess without blocking the loop the fake Feishu server runs on."""
    process = await asyncio.create_subprocess_exec(
        AMUX,
        "doctor",
        "--json",
        env={**hub.env(), **env},
        cwd=hub.home.parent,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert b"Traceback" not in stderr, stderr
    report = json.loads(stdout)
    assert process.returncode is not None
    return process.returncode, {c["name"]: c for c in report["checks"]}


def feishu_env(fake: FakeFeishu, **overrides: str) -> dict[str, str]:
    env = {
        "AMUX_FEISHU_APP_ID": fake.app_id,
        "AMUX_FEISHU_APP_SECRET": fake.app_secret,
        "AMUX_FEISHU_DOMAIN": fake.url,
        "AMUX_FEISHU_MODE": "long_connection",
    }
    env.update(overrides)
    return env


@pytest.fixture
async def fake_feishu() -> Any:
    async with FakeFeishu(app_id=f"cli_{uuid.uuid4().hex[:12]}", app_secret="s3cret") as fake:
        yield fake


async def test_feishu_credentials_are_checked_with_bot_info_and_the_long_connection_endpoint(
    hub_process: HubProcess, stub_agents: dict[str, str], fake_feishu: FakeFeishu
) -> None:
    code, checks = await run_doctor(hub_process, {**stub_agents, **feishu_env(fake_feishu)})
    assert checks["feishu_credentials"] == {
        "name": "feishu_credentials",
        "status": "ok",
        "detail": "bot amux (open_id ou_bot)",
        "fix": "",
    }
    assert checks["feishu_ingress"]["status"] == "ok"
    assert fake_feishu.calls("GET", "/open-apis/bot/v3/info")
    assert fake_feishu.calls("POST", "/callback/ws/endpoint")


async def test_a_wrong_app_secret_fails_with_a_fix_and_is_not_printed(
    hub_process: HubProcess, stub_agents: dict[str, str], fake_feishu: FakeFeishu
) -> None:
    env = {**stub_agents, **feishu_env(fake_feishu, AMUX_FEISHU_APP_SECRET="wrong-secret-value")}
    code, checks = await run_doctor(hub_process, env)
    assert code == 1
    assert checks["feishu_credentials"]["status"] == "fail"
    assert "AMUX_FEISHU_APP_SECRET" in checks["feishu_credentials"]["fix"]
    assert checks["feishu_ingress"]["status"] == "fail"
    assert "wrong-secret-value" not in json.dumps(checks)


async def test_webhook_mode_without_its_keys_fails(
    hub_process: HubProcess, stub_agents: dict[str, str], fake_feishu: FakeFeishu
) -> None:
    env = {**stub_agents, **feishu_env(fake_feishu, AMUX_FEISHU_MODE="webhook")}
    code, checks = await run_doctor(hub_process, env)
    assert code == 1
    detail = checks["feishu_ingress"]["detail"]
    assert "AMUX_FEISHU_ENCRYPT_KEY and AMUX_FEISHU_VERIFICATION_TOKEN" in detail


async def test_webhook_mode_fails_when_the_hub_does_not_serve_the_events_route(
    hub_process: HubProcess, stub_agents: dict[str, str], fake_feishu: FakeFeishu
) -> None:
    # This Hub runs without Feishu settings, so it has no /feishu/events route.
    env = {
        **stub_agents,
        **feishu_env(
            fake_feishu,
            AMUX_FEISHU_MODE="webhook",
            AMUX_FEISHU_ENCRYPT_KEY="ek-123456",
            AMUX_FEISHU_VERIFICATION_TOKEN="vt-123456",
        ),
    }
    code, checks = await run_doctor(hub_process, env)
    assert code == 1
    assert "does not serve /feishu/events" in checks["feishu_ingress"]["detail"]


# -- the sandbox ----------------------------------------------------------------------------------


def test_doctor_reports_the_sandbox_of_the_hub_it_runs_beside(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    wait_for_worker(hub_process)
    env = {**stub_agents, "AMUX_RUNTIME_SANDBOX": "off"}
    code, _, checks = doctor(hub_process, env)
    assert code == 0
    assert checks["sandbox"]["status"] == "warn"
    assert "AMUX_RUNTIME_SANDBOX=bwrap" in checks["sandbox"]["fix"]


def test_doctor_names_the_closed_directory_above_an_agent_cli_with_the_sandbox_on_or_off(
    hub_process: HubProcess, stub_agents: dict[str, str], shared_dir: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("only a root worker runs Agents as other uids")
    closed = shared_dir / "closed"
    tool = closed / "bin"
    tool.mkdir(parents=True)
    agent = tool / "stand-in"
    agent.write_text("#!/bin/sh\necho answered\n")
    agent.chmod(0o755)
    declared = {**stub_agents, "AMUX_RUNTIME_PROVIDERS": json.dumps({"stand-in": str(agent)})}
    code, _, checks = doctor(hub_process, declared)
    assert checks["agent_reach"]["status"] == "ok", checks["agent_reach"]

    closed.chmod(0o700)
    code, _, checks = doctor(hub_process, {**declared, "AMUX_RUNTIME_SANDBOX": "off"})
    reach = checks["agent_reach"]
    assert code == 1 and reach["status"] == "fail", reach
    assert f"stand-in ({agent}) cannot be run by an Agent's user" in reach["detail"]
    assert f"{closed} is not searchable by others" in reach["detail"]
    assert f"chmod o+x {closed}" in reach["fix"]
    # In the sandbox, bwrap makes the directories above what it binds (here the CLI's own
    # directory): a closed one there stops nothing, a closed one bound does.
    code, _, checks = doctor(hub_process, declared)
    assert checks["agent_reach"]["status"] == "ok", checks["agent_reach"]
    tool.chmod(0o700)
    code, _, checks = doctor(hub_process, declared)
    assert checks["agent_reach"]["status"] == "fail"
    assert f"{tool} is not searchable by others" in checks["agent_reach"]["detail"]


async def test_webhook_mode_without_an_encrypt_key_is_a_warning_when_explicitly_allowed(
    tmp_path: Path, fake_feishu: FakeFeishu
) -> None:
    webhook = {
        "AMUX_FEISHU_APP_ID": fake_feishu.app_id,
        "AMUX_FEISHU_APP_SECRET": fake_feishu.app_secret,
        "AMUX_FEISHU_DOMAIN": fake_feishu.url,
        "AMUX_FEISHU_MODE": "webhook",
        "AMUX_FEISHU_VERIFICATION_TOKEN": "vt-123456",
        "AMUX_FEISHU_ALLOW_UNENCRYPTED": "true",
    }
    hub = HubProcess(tmp_path / "amux-home", free_port(), extra_env=webhook)
    await asyncio.to_thread(hub.start)
    try:
        feishu = FeishuSettings(
            app_id=fake_feishu.app_id,
            app_secret=fake_feishu.app_secret,
            domain=fake_feishu.url,
            mode="webhook",
            verification_token="vt-123456",
            allow_unencrypted=True,
        )
        allowed = await check_feishu_ingress(feishu, hub.url)
        refused = await check_feishu_ingress(
            feishu.model_copy(update={"allow_unencrypted": False}), hub.url
        )
    finally:
        await asyncio.to_thread(hub.stop)
    assert allowed.status == "warn", allowed
    assert "answers" in allowed.detail
    assert "unsigned and unencrypted" in allowed.detail
    assert "AMUX_FEISHU_ENCRYPT_KEY" in allowed.fix
    assert refused.status == "fail"
    assert "without AMUX_FEISHU_ENCRYPT_KEY:" in refused.detail


def test_doctor_is_listed_in_the_cli_help() -> None:
    import subprocess

    done = subprocess.run(
        [AMUX, "doctor", "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("AMUX_")},
    )
    assert done.returncode == 0
    assert "--json" in done.stdout
