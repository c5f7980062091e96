"""A root worker's Agents, tried as an attacker would, through a real `amux serve`.

The worker runs as root, as `make serve` does on these machines. The Agent is the stand-in shell
(``tests/fakes/probe_agent.sh``): it reports its uid, whether the kernel's knobs open for writing,
what it finds in its user keyring, and what happens when it forks or allocates without end.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MEMORY_ISOLATED, HubProcess, free_port, save_settings, stand_in, until
from tests.runtime_bridge.test_sandbox_e2e import PROBE, add_principal

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="what a root worker's Agents run as"),
]


def start_hub(
    tmp_path: Path, *, settings: Mapping[str, Any] | None = None, **env: str
) -> HubProcess:
    """The Hub with the probe as its one provider; ``settings`` are saved before it starts."""
    if settings:
        save_settings(tmp_path / "amux-home", settings)
    hub = HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={"AMUX_RUNTIME_PROVIDERS": json.dumps({"probe": str(stand_in(PROBE))}), **env},
    )
    hub.start()
    return hub


def probe(hub: HubProcess, token: str, *commands: str) -> dict[str, Any]:
    """One probe turn as the Principal of ``token``: its result, with its report's lines."""
    nonce = uuid.uuid4().hex
    prompt = "\n".join((f"nonce {nonce}", *commands)) + "\n"
    done = hub.cli(
        "agent", "run", "--json", "--provider", "probe", prompt, env={"AMUX_TOKEN": token},
        timeout=180,
    )  # fmt: skip
    assert done.stdout, done.stderr
    result = dict(json.loads(done.stdout))
    result["lines"] = str(result.get("text") or "").splitlines()
    if result["state"] == "succeeded":
        assert f"nonce {nonce}" in result["lines"], result
    return result


def healthy(hub: HubProcess) -> bool:
    with urllib.request.urlopen(f"{hub.url}/healthz", timeout=2) as answer:
        return bool(answer.status == 200)


def value(lines: list[str], prefix: str) -> str:
    (line,) = [line for line in lines if line.startswith(prefix + " ")]
    return line.removeprefix(prefix + " ")


async def test_each_principals_agent_has_a_uid_of_its_own_and_no_kernel_knob_or_shared_key(
    tmp_path: Path,
) -> None:
    hub = start_hub(tmp_path, settings=MEMORY_ISOLATED)
    try:
        alice = await asyncio.to_thread(add_principal, hub, "alice")
        bob = await asyncio.to_thread(add_principal, hub, "bob")
        key = f"amux-{uuid.uuid4().hex[:12]}"
        knobs = ("openw /proc/sys/kernel/core_pattern", "openw /proc/sysrq-trigger")
        first = await asyncio.to_thread(probe, hub, alice, "uid", *knobs, f"addkey {key}")
        second = await asyncio.to_thread(probe, hub, bob, "uid", *knobs, f"findkey {key}")
        again = await asyncio.to_thread(probe, hub, alice, "uid", f"findkey {key}")
    finally:
        hub.stop()
    alice_uid, bob_uid = int(value(first["lines"], "uid")), int(value(second["lines"], "uid"))
    assert 0 not in (alice_uid, bob_uid) and alice_uid != bob_uid
    assert int(value(again["lines"], "uid")) == alice_uid
    for report in (first, second):
        assert "openw-denied /proc/sys/kernel/core_pattern" in report["lines"]
        assert "openw-denied /proc/sysrq-trigger" in report["lines"]
    assert f"addkey-ok {key}" in first["lines"]
    assert f"findkey-none {key}" in second["lines"]
    # The key is there for its own Principal: the other's miss is isolation, not a lost key.
    assert f"findkey-hit {key}" in again["lines"]
    workspaces = hub.home / "runtime" / "workspaces"
    assert sorted(p.stat().st_uid for p in workspaces.iterdir()) == sorted((alice_uid, bob_uid))


async def test_an_agent_forking_without_end_stops_at_the_task_bound_while_the_hub_answers(
    tmp_path: Path,
) -> None:
    hub = start_hub(tmp_path, AMUX_RUNTIME_TASKS_MAX="64")
    results: list[dict[str, Any]] = []
    try:
        turn = threading.Thread(
            target=lambda: results.append(probe(hub, hub.owner_token, "forkbomb 5000"))
        )
        turn.start()
        workspaces = hub.home / "runtime" / "workspaces"
        marker = await until(lambda: next(iter(workspaces.glob("*/forked")), None), 120)
        # The Agent holds every process it could start: the Hub still answers at once.
        for _ in range(5):
            assert await asyncio.to_thread(healthy, hub)
        (marker.parent / "release").touch()
        await asyncio.to_thread(turn.join, 120)
    finally:
        hub.stop()
    (result,) = results
    started = int(value(result["lines"], "forked").split()[0])
    assert 0 < started < 64
    bound = "tasks bound (64 tasks, AMUX_RUNTIME_TASKS_MAX)"
    assert any(bound in warning for warning in result["warnings"]), result


async def test_an_agent_allocating_past_the_memory_bound_fails_its_turn_naming_it(
    tmp_path: Path,
) -> None:
    hub = start_hub(tmp_path, AMUX_RUNTIME_MEMORY_MAX="128M")
    try:
        small = await asyncio.to_thread(probe, hub, hub.owner_token, "allocate 16")
        large = await asyncio.to_thread(probe, hub, hub.owner_token, "allocate 400")
    finally:
        hub.stop()
    assert small["state"] == "succeeded" and "allocated 16" in small["lines"], small
    assert large["state"] == "failed", large
    assert "memory bound (128 MiB, AMUX_RUNTIME_MEMORY_MAX)" in str(large["error"])


async def test_an_agent_filling_its_workspace_is_stopped_at_the_bound_and_may_clean_up_after(
    tmp_path: Path,
) -> None:
    hub = start_hub(tmp_path, AMUX_RUNTIME_WORKSPACE_MAX="20M")
    workspaces = hub.home / "runtime" / "workspaces"
    try:
        within = await asyncio.to_thread(probe, hub, hub.owner_token, "fill 1")
        # Many files, then a wait the Agent never leaves by itself: only the bound ends the turn.
        flooded = await asyncio.to_thread(probe, hub, hub.owner_token, "flood 60", "hold")
        (workspace,) = workspaces.iterdir()
        floods = len(list(workspace.glob("flood-*.bin")))
        cleaned = await asyncio.to_thread(probe, hub, hub.owner_token, "clean")
        # One file written as fast as the disk takes it stops at the bound itself.
        filled = await asyncio.to_thread(probe, hub, hub.owner_token, "fill 60", "hold")
        big = (workspace / "filled.bin").stat().st_size
    finally:
        hub.stop()
    bound = "workspace bound (20 MiB, AMUX_RUNTIME_WORKSPACE_MAX)"
    assert within["state"] == "succeeded" and "filled 1" in within["lines"], within
    assert not any(bound in warning for warning in within["warnings"]), within
    for stopped in (flooded, filled):
        assert stopped["state"] == "failed", stopped
        assert f"the Agent reached its {bound} and was stopped" in str(stopped["error"]), stopped
    # Nothing is deleted; the partial files stay, short of what the Agent meant to write.
    assert 20 <= floods < 60
    assert big <= 20 * 1048576
    # A turn starting past the bound may still remove files: it is told, and is not stopped.
    assert cleaned["state"] == "succeeded" and "cleaned" in cleaned["lines"], cleaned
    assert any("already holds more than its " + bound in w for w in cleaned["warnings"]), cleaned
