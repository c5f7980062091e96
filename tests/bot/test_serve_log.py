"""`amux serve` as a real process, judged by what it writes: what it warns about or refuses at
start, and what its log never contains."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hub.config import HubSettings
from hub.requestid import REQUEST_ID_HEADER
from hub.state import State
from tests.conftest import AMUX, HubProcess, free_port, wait_until

pytestmark = pytest.mark.e2e


def memory_enabled_home(home: Path) -> None:
    home.mkdir(parents=True, mode=0o700)
    # Saved before the first start, so it is the running value without a restart.
    state = State(HubSettings(home=home).state_path)
    state.save_setting("memory.enabled", True)
    state.close()


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


def test_serve_lifts_its_open_file_limit_to_the_hard_limit_and_says_so(tmp_path: Path) -> None:
    # Started as systemd starts a service by default: 1,024 files, more allowed on request.
    hub = HubProcess(
        tmp_path / "amux-home",
        free_port(),
        extra_env={"AMUX_LOG_FORMAT": "json"},
        prefix=["prlimit", "--nofile=1024:8192", "--"],
    )
    hub.start()
    try:
        assert hub.proc is not None
        # prlimit runs amux serve in its own place: the process is the Hub itself.
        limits = Path(f"/proc/{hub.proc.pid}/limits").read_text()
        said = [r["message"] for r in records(hub) if "open files" in r["message"]]
    finally:
        if hub.proc is not None:
            hub.proc.terminate()
        hub.stop()
    (line,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
    assert line.split()[3:5] == ["8192", "8192"], line
    assert said == ["open files: up to 8192"], said


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


def test_amux_serve_refuses_an_unencrypted_webhook_with_one_error_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMUX_")}
    env.update(
        AMUX_HOME=str(tmp_path / "amux-home"),
        AMUX_FEISHU_APP_ID="cli_x",
        AMUX_FEISHU_APP_SECRET="s",
        AMUX_FEISHU_VERIFICATION_TOKEN="vt",
        AMUX_RUNTIME_IN_PROCESS="false",
    )
    done = subprocess.run(
        [AMUX, "serve", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: invalid_argument: ")
    assert "AMUX_FEISHU_ENCRYPT_KEY" in last and "AMUX_FEISHU_ALLOW_UNENCRYPTED" in last


SECRET_CONTENT = "deploy key sk-live-51Hxq9ZZtopsecretcontent and the vault pin 0429-7713"
APP_SECRET = "feishu-app-secret-value-9f8e7d"


def test_e2e_json_log_never_contains_tokens_app_secrets_or_memory_contents(
    tmp_path: Path,
) -> None:
    home = tmp_path / "amux-home"
    memory_enabled_home(home)
    hub = HubProcess(
        home,
        free_port(),
        extra_env={
            "AMUX_LOG_FORMAT": "json",
            "AMUX_RUNTIME_IN_PROCESS": "false",
            # No app id: the bot stays off, but the process still holds the secret.
            "AMUX_FEISHU_APP_SECRET": APP_SECRET,
        },
    )
    hub.start()
    try:
        token = hub.owner_token
        created = hub.cli(
            "memory",
            "upsert",
            "--json",
            "topics/keys.md",
            "--expected-revision",
            "absent",
            input=f"# Keys\n{SECRET_CONTENT}\n",
        )
        assert created.returncode == 0, created.stderr
        shown = hub.cli("memory", "show", "topics/keys.md")
        assert SECRET_CONTENT in shown.stdout
        found = hub.cli("memory", "search", "vault")
        assert found.returncode == 0, found.stderr
        revision = created.json()["revision"]
        forgot = hub.cli("memory", "forget", "topics/keys.md", "--expected-revision", revision)
        assert forgot.returncode == 0, forgot.stderr
        # A caller that sends a credential as its request id still does not get it logged.
        status, _ = hub.rpc(
            "system.config.set",
            headers={REQUEST_ID_HEADER: token},
            key="memory.isolation",
            value="off",
        )
        assert status == 200
        status, _ = hub.rpc("system.whoami", token="amux_" + "wrong" * 9)
        assert status == 401
        status, _ = hub.rpc("system.whoami", headers={REQUEST_ID_HEADER: "ops-trace-1"})
        assert status == 200
    finally:
        hub.stop()
    log = hub.log()
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert records, log
    assert any(r["message"].startswith("setting memory.isolation saved") for r in records)
    assert token not in log
    assert APP_SECRET not in log
    assert "sk-live-51Hxq9ZZ" not in log
    assert "0429-7713" not in log
    assert "wrong" * 9 not in log
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    # Access lines carry the request id too, though aiohttp writes them after the handler.
    access = [r for r in records if r.get("request_id") == "ops-trace-1"]
    assert access, log
    assert access[-1]["path"] == "/rpc/v1/system.whoami"
    assert access[-1]["status"] == 200


def test_serve_rejects_an_unknown_log_format(tmp_path: Path) -> None:
    hub = HubProcess(tmp_path / "amux-home", free_port())
    result = hub.cli("serve", "--log-format", "xml", "--port", str(hub.port))
    assert result.returncode == 1
    assert result.stderr.startswith("error: invalid_argument:")
    assert "Traceback" not in result.stderr
