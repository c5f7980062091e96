"""`amux doctor`'s network checks, through the real CLI beside a real `amux serve`: the namespace
and relay probed with real bwrap, the gateway's upstream reported (not failed) on a machine with
no route out, the egress allow-list listed."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from aiohttp import web

from tests.bot.test_doctor import doctor, wait_for_worker
from tests.conftest import HubProcess, free_port

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
]


@pytest.fixture
def stub_agents(tmp_path: Path) -> dict[str, str]:
    """Agent CLIs that answer --version at once: these checks are not about agents."""
    env = {}
    for provider in ("claude", "codex", "pi"):
        script = tmp_path / f"{provider}-stub"
        script.write_text(f"#!/bin/sh\necho '{provider} 9.9.9-stub'\n")
        script.chmod(0o755)
        env[f"AMUX_RUNTIME_{provider.upper()}"] = str(script)
    return env


def test_the_namespace_and_relay_are_probed_and_the_allow_list_is_listed(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    wait_for_worker(hub_process)
    env = {
        **stub_agents,
        "AMUX_RUNTIME_EGRESS_ALLOW": "github.com:443,*.pypi.org",
        # An upstream nothing listens on: what a machine without a route out sees.
        "AMUX_RUNTIME_ANTHROPIC_BASE_URL": f"http://127.0.0.1:{free_port()}",
        "AMUX_RUNTIME_OPENAI_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
    }
    code, report, checks = doctor(hub_process, env)
    assert code == 0, report
    assert checks["network_namespace"]["status"] == "ok", checks["network_namespace"]
    assert "no route out" in checks["network_namespace"]["detail"]
    assert checks["relay"]["status"] == "ok", checks["relay"]
    upstream = checks["gateway_upstream"]
    assert upstream["status"] == "warn", upstream
    assert upstream["detail"].startswith("no route to anthropic http://127.0.0.1:")
    assert checks["egress"]["detail"] == (
        "Agents may reach github.com:443,*.pypi.org through the egress proxy"
    )


async def test_a_reachable_upstream_is_ok_and_an_empty_allow_list_says_nothing_is_reached(
    hub_process: HubProcess, stub_agents: dict[str, str], tmp_path: Path
) -> None:
    runner = web.AppRunner(web.Application())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        env = {
            **stub_agents,
            "AMUX_RUNTIME_ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
            "AMUX_RUNTIME_OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
        }
        code, report, checks = await asyncio.to_thread(doctor, hub_process, env)
    finally:
        await runner.cleanup()
    assert code == 0, report
    assert checks["gateway_upstream"]["status"] == "ok"
    assert checks["gateway_upstream"]["detail"] == (
        f"reached anthropic http://127.0.0.1:{port}, openai http://127.0.0.1:{port}"
    )
    assert "is empty: Agents reach no host" in checks["egress"]["detail"]


def test_with_the_host_network_or_no_sandbox_the_namespace_is_a_warning_with_its_fix(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    _, _, shared = doctor(hub_process, {**stub_agents, "AMUX_RUNTIME_NETWORK": "host"})
    assert shared["network_namespace"]["status"] == "warn"
    assert shared["network_namespace"]["fix"] == "set AMUX_RUNTIME_NETWORK=isolated"
    assert shared["relay"]["status"] == "skip"
    assert shared["egress"]["status"] == "skip"
    _, _, off = doctor(hub_process, {**stub_agents, "AMUX_RUNTIME_SANDBOX": "off"})
    assert off["network_namespace"]["status"] == "warn"
    assert "no network namespace" in off["network_namespace"]["detail"]


def test_a_malformed_allow_list_fails_the_settings_check_without_a_traceback(
    hub_process: HubProcess, stub_agents: dict[str, str]
) -> None:
    code, _, checks = doctor(hub_process, {**stub_agents, "AMUX_RUNTIME_EGRESS_ALLOW": "a*b.com"})
    assert code == 1
    assert checks["settings"]["status"] == "fail"
    assert "wildcard" in checks["settings"]["detail"]
