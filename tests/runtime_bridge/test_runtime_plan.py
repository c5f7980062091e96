"""`amux runtime plan`: the launch an operator would get, as JSON, without starting anything."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime_bridge.launch_env import NO_OWNER_TOKEN
from runtime_bridge.memoryprotocol import protocol_text
from runtime_bridge.network import EGRESS, HUB, door_url
from runtime_bridge.providers.plan import MASK
from tests.conftest import HubProcess, free_port, save_settings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PROVIDER_SECRET = "sk-ant-plan-secret-4711"
# Memory on, isolation off, from the Hub's start.
MEMORY_ON = pytest.mark.parametrize(
    "hub", [{"memory.enabled": True, "memory.isolation": "off"}], ids=["memory"], indirect=True
)


@pytest.fixture
def hub(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HubProcess]:
    """A Hub with no worker of its own, so submitted turns stay queued and nothing launches.

    Settings a test passes (``indirect``) are saved before the start, so they run from it
    without the restart a change through the CLI takes.
    """
    settings = getattr(request, "param", None)
    if settings:
        save_settings(tmp_path / "amux-home", settings)
    process = HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={
            "AMUX_RUNTIME_IN_PROCESS": "false",
            "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
            "AMUX_RUNTIME_PROVIDERS": '{"aider": "/usr/bin/true"}',
        },
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def plan(hub: HubProcess, *args: str) -> tuple[dict[str, Any], str]:
    """Run `amux runtime plan` with a provider key and the owner's token in its environment."""
    env = {"ANTHROPIC_API_KEY": PROVIDER_SECRET, "AMUX_TOKEN": hub.owner_token}
    done = hub.cli("runtime", "plan", "--json", *args, env=env)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout)), done.stdout


@MEMORY_ON
def test_a_bound_claude_plan_shows_argv_env_files_and_binding_with_secrets_masked(
    hub: HubProcess, tmp_path: Path
) -> None:
    shown, raw = plan(hub, "--provider", "claude", "--prompt", "hello")

    assert shown["provider"] == "claude"
    assert shown["binding"] == "global"
    assert shown["warnings"] == []
    argv = shown["argv"]
    # The executable the worker would run: by its real path when the plan is sandboxed.
    assert argv[0].rsplit("/", 1)[-1] == "claude"
    assert "--mcp-config" in argv and "--strict-mcp-config" in argv
    assert protocol_text("mcp").strip() in argv[argv.index("--append-system-prompt") + 1]
    env = shown["env"]
    assert env["CLAUDE_CODE_DISABLE_AUTO_MEMORY"] == "1"
    # The credential reaches only `amux mcp` (through its config file), not the Agent itself.
    assert {key for key in env if key.startswith("AMUX_")} == set(NO_OWNER_TOKEN)
    assert env["ANTHROPIC_API_KEY"] == MASK
    (mcp_file,) = [f for f in shown["files"] if f["path"].endswith(".json")]
    assert mcp_file["mode"] == "0600"
    assert mcp_file["path"].startswith(str(tmp_path / "runtime" / "runs"))
    server = json.loads(mcp_file["content"])["mcpServers"]["memory"]
    assert server["args"] == ["mcp"]
    assert server["env"]["AMUX_MEMORY_BINDING"] == "global"
    # In its network namespace, the Agent reaches the Hub through its door; the rest goes
    # through the egress proxy's.
    assert server["env"]["AMUX_HUB_URL"] == door_url(HUB)
    assert "--unshare-net" in shown["sandbox"]
    assert [door["name"] for door in shown["doors"]] == ["model", "hub", "egress"]
    assert shown["relay"][-1] == "--"
    assert env["HTTPS_PROXY"] == door_url(EGRESS)
    assert server["env"]["AMUX_TOKEN"] == MASK
    # Neither the operator's token nor the provider key is anywhere in the output.
    assert hub.owner_token not in raw
    assert PROVIDER_SECRET not in raw
    # Nothing was started or written.
    assert not (tmp_path / "runtime").exists()


@MEMORY_ON
def test_a_pi_plan_puts_the_per_run_cli_first_on_path_with_the_cli_protocol(
    hub: HubProcess,
) -> None:
    shown, _ = plan(hub, "--provider", "pi")
    assert shown["binding"] == "global"
    assert shown["env"]["PATH"].split(":")[0].endswith("agent-config/memory")
    argv = shown["argv"]
    assert protocol_text("cli").strip() in argv[argv.index("--append-system-prompt") + 1]


@MEMORY_ON
def test_a_declared_provider_plan_warns_that_the_memory_capability_is_missing(
    hub: HubProcess,
) -> None:
    shown, _ = plan(hub, "--provider", "aider")
    assert shown["binding"] is None
    assert shown["warnings"] == ["memory capability missing for provider aider"]
    assert {key for key in shown["env"] if key.startswith("AMUX_")} == set(NO_OWNER_TOKEN)
    assert protocol_text("mcp").strip() not in json.dumps(shown)


def test_an_undeclared_provider_has_no_plan(hub: HubProcess) -> None:
    done = hub.cli("runtime", "plan", "--provider", "sh", env={"AMUX_TOKEN": hub.owner_token})
    assert done.returncode != 0
    assert done.stderr.startswith("error: invalid_argument: unknown provider 'sh'; accepted:")


def test_the_plan_shows_the_sandbox_around_the_principals_own_workspace(
    hub: HubProcess, tmp_path: Path
) -> None:
    shown, _ = plan(hub, "--provider", "aider")
    workspace = shown["cwd"]
    assert workspace.startswith(str(tmp_path / "runtime" / "workspaces") + "/")
    sandbox = shown["sandbox"]
    if not sandbox:
        pytest.skip("bwrap is not installed: " + "; ".join(shown["warnings"]))
    assert "--unshare-pid" in sandbox and "--die-with-parent" in sandbox
    assert sandbox[-3:] == ["--chdir", workspace, "--"]
    assert ["--bind", workspace, workspace] == sandbox[sandbox.index(workspace) - 1 :][:3]
    assert shown["env"]["HOME"].startswith(str(tmp_path / "runtime" / "sessions"))


def test_with_memory_disabled_the_plan_has_no_binding_no_protocol_and_no_warning(
    hub: HubProcess,
) -> None:
    shown, _ = plan(hub, "--provider", "claude")
    assert shown["binding"] is None
    assert shown["warnings"] == []
    # Under the default policy (ask) the only MCP server is amux's permission prompt.
    (config,) = shown["files"]
    assert list(json.loads(config["content"])["mcpServers"]) == ["amux"]
    assert shown["permissions"] == "ask"
    assert "CLAUDE_CODE_DISABLE_AUTO_MEMORY" not in shown["env"]
    assert protocol_text("mcp").strip() not in json.dumps(shown)


@MEMORY_ON
def test_a_session_plan_shows_its_frozen_binding_after_the_policy_changes(
    hub: HubProcess,
) -> None:
    status, submitted = hub.rpc("executions.submit", provider="claude", prompt="hi")
    assert status == 200, submitted
    session_id = submitted["session"]["id"]
    principal_id = submitted["session"]["principal_id"]

    # Not launched yet: the plan shows what the launch would freeze.
    pending, _ = plan(hub, "--provider", "claude", "--session", session_id)
    assert pending["binding"] == "global"

    # A Runtime freezes the binding at the first launch.
    assert hub.cli("principal", "add", "runtime-test", "--service").returncode == 0
    token = hub.cli("token", "issue", "runtime-test").stdout.strip()
    status, frozen = hub.rpc("sessions.memory", token=token, session_id=session_id, capable=True)
    assert status == 200, frozen
    assert frozen["binding"] == "global"

    hub.enable_memory(isolation=True)
    resumed, _ = plan(hub, "--provider", "claude", "--session", session_id)
    assert resumed["binding"] == "global"
    fresh, _ = plan(hub, "--provider", "claude")
    assert fresh["binding"] == f"principal:{principal_id}"

    other = hub.cli("runtime", "plan", "--provider", "pi", "--session", session_id)
    assert other.returncode == 1
    assert "runs claude" in other.stderr
    assert "Traceback" not in other.stderr


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"AMUX_RUNTIME_NETWORK": "host"}, "AMUX_RUNTIME_NETWORK=host: Agents share this host's"),
        ({"AMUX_RUNTIME_SANDBOX": "off"}, "the sandbox is off, so the Agent has no network"),
    ],
)
def test_a_plan_on_the_hosts_network_has_no_doors_and_says_so(
    hub: HubProcess, setting: dict[str, str], said: str
) -> None:
    env = {"AMUX_TOKEN": hub.owner_token, **setting}
    done = hub.cli("runtime", "plan", "--json", "--provider", "claude", env=env)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert any(warning.startswith(said) for warning in shown["warnings"]), shown["warnings"]
    assert shown["doors"] == [] and shown["relay"] == []
    assert "--unshare-net" not in shown["sandbox"]
    assert "HTTPS_PROXY" not in shown["env"]
    text = hub.cli("runtime", "plan", "--provider", "claude", env=env)
    assert "network      the host's" in text.stdout
