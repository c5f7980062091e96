"""deploy/ run for real: ``amux`` started as the systemd units start it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bot.service.serve import RESTART_EXIT_STATUS
from tests.conftest import AMUX, HubProcess, free_port
from tests.test_deploy import HUB_UNIT, WORKER_UNIT, environment, unit

pytestmark = pytest.mark.e2e


def test_a_restart_under_the_hub_unit_environment_exits_with_the_status_systemd_restarts(
    tmp_path: Path,
) -> None:
    entries = unit(HUB_UNIT)
    env = environment(entries)
    command_env = dict(
        word.split("=", 1) for word in entries["Service.ExecStart"][-1].split() if "=" in word
    )
    hub = HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={
            "AMUX_RESTART_MODE": command_env["AMUX_RESTART_MODE"],
            "AMUX_LOG_FORMAT": env["AMUX_LOG_FORMAT"],
            "AMUX_RUNTIME_IN_PROCESS": "false",
        },
    )
    hub.start()
    try:
        status, body = hub.rpc("system.restart")
        assert status == 200, body
        assert hub.proc is not None
        assert hub.proc.wait(30) == RESTART_EXIT_STATUS
    finally:
        hub.stop()


def test_the_worker_units_command_line_is_one_amux_accepts() -> None:
    argv = unit(WORKER_UNIT)["Service.ExecStart"][-1].split()
    done = subprocess.run(
        [AMUX, *argv[1:3], "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "--hub" in done.stdout
