"""deploy/: the example environment, systemd units, container image and compose file.

No container engine runs here, so the image and compose file are checked by content; the systemd
units are checked by systemd's own verifier when present. ``test_deploy_e2e`` runs ``amux`` as the
units do.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from bot.config import FeishuSettings
from bot.service.logs import LogSettings
from bot.service.serve import RESTART_EXIT_STATUS
from hub.config import ClientSettings, HubSettings
from runtime_bridge.config import RuntimeSettings
from scripts.reference import ENV_EXAMPLE, env_name, render_env_example
from tests.conftest import AMUX, REPO

DEPLOY = REPO / "deploy"
HUB_UNIT = DEPLOY / "systemd" / "amux.service"
WORKER_UNIT = DEPLOY / "systemd" / "amux-worker@.service"
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "PrivateTmp": "yes",
    "ProtectHome": "yes",
}


def unit(path: Path) -> dict[str, list[str]]:
    """``Section.Key`` → values in order (systemd keys such as Environment repeat)."""
    entries: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.setdefault(f"{section}.{key}", []).append(value)
    return entries


def environment(entries: dict[str, list[str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for assignment in entries.get("Service.Environment", []):
        key, _, value = assignment.partition("=")
        env[key] = value
    return env


# -- the example environment file ------------------------------------------------------------------


def test_env_example_is_regenerated_from_the_settings_models() -> None:
    assert ENV_EXAMPLE.read_text() == render_env_example(), (
        "deploy/amux.env.example is stale: run `python -m scripts.reference`"
    )


@pytest.mark.parametrize(
    "model", [HubSettings, ClientSettings, RuntimeSettings, FeishuSettings, LogSettings]
)
def test_env_example_names_every_setting_with_a_meaning(model: type) -> None:
    text = ENV_EXAMPLE.read_text()
    for name in model.model_fields:
        variable = env_name(model, name)
        assert re.search(rf"^#{variable}=", text, re.M), variable
        # The line before the assignment is the end of its explanation.
        before = text.split(f"\n#{variable}=")[0].rsplit("\n", 1)[-1]
        assert before.startswith("# ") and len(before) > 5, variable


def test_env_example_shows_no_secret_values() -> None:
    text = ENV_EXAMPLE.read_text()
    for secret in ("APP_SECRET", "ENCRYPT_KEY", "VERIFICATION_TOKEN"):
        assert f"#AMUX_FEISHU_{secret}=\n" in text
    assert "#AMUX_TOKEN=\n" in text


# -- systemd ------------------------------------------------------------------------------------


def test_hub_unit_restarts_through_the_supervisor_and_is_hardened() -> None:
    entries = unit(HUB_UNIT)
    service = {k.removeprefix("Service."): v[-1] for k, v in entries.items()}
    assert service["ExecStart"].split()[-1] == "serve"
    assert service["Restart"] == "on-failure"
    assert service["RestartForceExitStatus"] == str(RESTART_EXIT_STATUS)
    assert service["User"] not in ("", "root")
    assert service["StateDirectory"] == "amux"
    env = environment(entries)
    assert env["AMUX_HOME"] == "/var/lib/amux"
    for key, value in HARDENING.items():
        assert service[key] == value, key
    # EnvironmentFile= overrides Environment=, so the restart mode is set on the command line.
    assert "AMUX_RESTART_MODE" not in env
    assert service["ExecStart"].split()[:2] == ["/usr/bin/env", "AMUX_RESTART_MODE=exit"]


def test_worker_unit_is_a_template_running_a_runtime_worker() -> None:
    entries = unit(WORKER_UNIT)
    service = {k.removeprefix("Service."): v[-1] for k, v in entries.items()}
    assert WORKER_UNIT.name.endswith("@.service")
    assert "%i" in service["EnvironmentFile"]
    argv = service["ExecStart"].split()
    assert argv[1:4] == ["runtime", "worker", "--hub"]
    assert service["User"] not in ("", "root")
    for key, value in HARDENING.items():
        assert service[key] == value, key
    env = environment(entries)
    assert env["AMUX_RUNTIME_WORK_DIR"].startswith("/var/lib/amux-worker/%i")


@pytest.mark.parametrize("path", [HUB_UNIT, WORKER_UNIT], ids=lambda p: p.name)
def test_the_units_lift_systemds_default_of_1024_open_files(path: Path) -> None:
    service = {k.removeprefix("Service."): v[-1] for k, v in unit(path).items()}
    assert int(service["LimitNOFILE"]) >= 65536


@pytest.mark.parametrize("path", [HUB_UNIT, WORKER_UNIT], ids=lambda p: p.name)
def test_systemd_accepts_the_units(path: Path, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # The verifier insists the executable exists; point the unit at this checkout's amux.
    copy = tmp_path / path.name.replace("@.", "@test.")
    copy.write_text(path.read_text().replace("/opt/amux/venv/bin/amux", AMUX))
    done = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr


# -- container image and compose ----------------------------------------------------------------


def test_containerfile_runs_as_a_non_root_user_with_amux_home_as_a_volume() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert re.search(r"^VOLUME \[\"/var/lib/amux\"\]", text, re.M)
    assert "AMUX_HOME=/var/lib/amux" in text
    assert "AMUX_RESTART_MODE=exit" in text
    assert "/readyz" in text.split("HEALTHCHECK", 1)[1]
    assert re.search(r'^ENTRYPOINT \[.*"amux"\]', text, re.M)


def test_containerfile_copies_every_package_amux_installs() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = [
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    for package in packages:
        assert re.search(rf"^COPY {package} ", text, re.M), package
    for source in re.findall(r"^COPY (\S+(?: \S+)*) \S+$", text, re.M):
        for path in source.split():
            assert (REPO / path).exists(), path


def test_compose_runs_the_hub_and_one_worker_against_it() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    services = re.findall(r"^  (\w[\w-]*):\n", text.split("\nservices:\n", 1)[1], re.M)
    assert services[:2] == ["hub", "worker"]
    assert 'command: ["runtime", "worker", "--hub", "http://hub:8765"]' in text
    assert "dockerfile: deploy/Containerfile" in text
    assert text.count(":/var/lib/amux") == 2
    assert 'AMUX_RUNTIME_IN_PROCESS: "false"' in text
    # The host port is published on loopback only.
    assert re.search(r'- "127\.0\.0\.1:8765:8765"', text)
