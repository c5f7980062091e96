"""Path settings are absolute from the start: a relative one is taken from where amux started.

bwrap, the Agents and `amux mcp` run in other directories than the process that read the
settings, so a relative path handed on would name nothing there (or something else).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hub.config import ClientSettings, HubSettings
from runtime_bridge.config import RuntimeSettings
from tests.conftest import AMUX, HubProcess, free_port

PATH_SETTINGS = {
    "AMUX_RUNTIME_WORK_DIR": "work",
    "AMUX_RUNTIME_DEFAULT_CWD": "./projects/../shared",
    "AMUX_RUNTIME_CLAUDE_MCP_CONFIG": "conf/mcp.json",
    "AMUX_RUNTIME_CODEX_CONFIG": "conf/codex",
    "AMUX_RUNTIME_PI_AGENT_DIR": "conf/pi",
}


@pytest.fixture
def started_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A process started in ``tmp_path`` with no AMUX_* settings of its own."""
    for name in ("AMUX_HOME", *PATH_SETTINGS, "AMUX_RUNTIME_CLAUDE", "AMUX_RUNTIME_AMUX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_default_home_is_dot_amux_in_the_start_directory_as_an_absolute_path(
    started_in: Path,
) -> None:
    assert HubSettings().home == started_in / ".amux"
    assert ClientSettings().home == started_in / ".amux"
    assert HubSettings().state_path == started_in / ".amux" / "state.sqlite3"


def test_relative_path_settings_are_taken_from_the_start_directory(
    started_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMUX_HOME", "state/amux")
    for name, value in PATH_SETTINGS.items():
        monkeypatch.setenv(name, value)
    assert HubSettings().home == started_in / "state" / "amux"
    runtime = RuntimeSettings()
    assert runtime.work_dir == started_in / "work"
    assert runtime.default_cwd == started_in / "shared"
    assert runtime.claude_mcp_config == started_in / "conf" / "mcp.json"
    assert runtime.home_source("codex") == started_in / "conf" / "codex"
    assert runtime.home_source("pi") == started_in / "conf" / "pi"
    # Passed in code rather than the environment, the same holds.
    assert HubSettings(home=Path("elsewhere")).home == started_in / "elsewhere"


def test_a_link_in_a_path_setting_is_kept_rather_than_followed(
    started_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (started_in / "real").mkdir()
    (started_in / "link").symlink_to(started_in / "real")
    monkeypatch.setenv("AMUX_RUNTIME_DEFAULT_CWD", "link")
    assert RuntimeSettings().default_cwd == started_in / "link"


def test_an_executable_named_by_a_relative_path_becomes_absolute_and_a_bare_name_stays(
    started_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMUX_RUNTIME_CLAUDE", "bin/claude")
    monkeypatch.setenv("AMUX_RUNTIME_AMUX", ".venv/bin/amux")
    monkeypatch.setenv("AMUX_RUNTIME_PROVIDERS", '{"aider": "./aider", "sh": "sh"}')
    runtime = RuntimeSettings()
    assert runtime.executable("claude") == str(started_in / "bin" / "claude")
    assert runtime.amux == str(started_in / ".venv" / "bin" / "amux")
    assert runtime.executable("aider") == str(started_in / "aider")
    # Looked up on the launch's PATH when the Agent starts, as before.
    assert runtime.executable("sh") == "sh"
    assert runtime.executable("codex") == "codex"


@pytest.mark.e2e
def test_a_home_that_is_a_regular_file_stops_serve_with_one_line_naming_it(
    tmp_path: Path,
) -> None:
    hub = HubProcess(tmp_path / "amux-home", free_port())
    (tmp_path / "amux-home").write_text("not a directory\n")
    done = subprocess.run(
        [AMUX, "serve", "--port", str(hub.port)],
        env=hub.env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"error: invalid_argument: AMUX_HOME {tmp_path / 'amux-home'} cannot be used: it is not "
        "a directory; point AMUX_HOME at a directory this user may write"
    )
