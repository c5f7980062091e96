"""What `amux serve` warns about at start: a real process, its real log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import HubProcess, free_port, wait_until


def records(hub: HubProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in hub.log().splitlines() if line.startswith("{")]


def sandbox_warnings(hub: HubProcess) -> list[dict[str, Any]]:
    return [
        record
        for record in records(hub)
        if record["level"] == "WARNING" and "AMUX_RUNTIME_SANDBOX=off" in record["message"]
    ]


def test_serve_warns_at_start_that_agents_run_unconfined_when_the_sandbox_is_off(
    tmp_path: Path,
) -> None:
    hub = HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={"AMUX_RUNTIME_SANDBOX": "off", "AMUX_LOG_FORMAT": "json"},
    )
    hub.start()
    try:
        # The warning is written before the Hub listens, so a healthy Hub has logged it.
        warnings = sandbox_warnings(hub)
    finally:
        hub.stop()
    assert len(warnings) == 1, hub.log()
    message = warnings[0]["message"]
    assert warnings[0]["logger"] == "amux.serve"
    assert "Agents run with this service's own file access" in message
    assert "set AMUX_RUNTIME_SANDBOX=bwrap" in message


def test_serve_says_nothing_about_the_sandbox_when_it_is_on_or_agents_run_elsewhere(
    tmp_path: Path,
) -> None:
    for name, env in (
        ("on", {}),
        ("elsewhere", {"AMUX_RUNTIME_SANDBOX": "off", "AMUX_RUNTIME_IN_PROCESS": "false"}),
    ):
        (tmp_path / name).mkdir()
        hub = HubProcess(
            tmp_path / name / "amux-home",
            free_port(),
            extra_env={**env, "AMUX_LOG_FORMAT": "json"},
        )
        hub.start()
        try:
            assert records(hub), hub.log()
            assert sandbox_warnings(hub) == [], name
        finally:
            hub.stop()


def test_serve_starts_its_in_process_worker_only_once_the_hub_listens(tmp_path: Path) -> None:
    hub = HubProcess(tmp_path / "amux-home", free_port(), extra_env={"AMUX_LOG_FORMAT": "json"})
    hub.start()
    try:
        wait_until(lambda: any("registered as" in r["message"] for r in records(hub)))
    finally:
        hub.stop()
    unreachable = [r for r in records(hub) if "cannot reach the Hub" in r["message"]]
    assert unreachable == [], hub.log()
