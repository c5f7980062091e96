"""Through the real CLI against a real `amux serve`: a failed command exits with the status of its
error's kind, so a script can tell a conflict from a missing document from an unreachable Hub, and
every failure is one line on stderr, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CliResult, HubProcess, free_port, running_hub

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def memory_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    home = tmp_path_factory.mktemp("exit-codes") / "amux-home"
    with running_hub(home, {"memory.enabled": True, "memory.isolation": "off"}) as hub:
        yield hub


def one_line(done: CliResult, code: str, status: int) -> str:
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: {code}: "), done.stderr
    return done.stderr


def test_a_stale_expected_revision_exits_3(memory_hub: HubProcess) -> None:
    hub = memory_hub
    made = hub.cli("memory", "upsert", "topics/a.md", "--expected-revision", "absent", input="a\n")
    assert made.returncode == 0, made.stderr
    stale = hub.cli("memory", "upsert", "topics/a.md", "--expected-revision", "absent", input="b\n")
    one_line(stale, "conflict", 3)


def test_a_missing_document_exits_4(memory_hub: HubProcess) -> None:
    one_line(memory_hub.cli("memory", "export", "topics/nowhere.md"), "not_found", 4)


def test_a_token_the_hub_does_not_know_exits_5(memory_hub: HubProcess) -> None:
    done = memory_hub.cli("system", "whoami", env={"AMUX_TOKEN": "amux_not-a-real-token"})
    one_line(done, "unauthenticated", 5)


def test_an_unreachable_hub_exits_6(tmp_path: Path) -> None:
    hub = HubProcess(tmp_path / "amux-home", free_port())
    done = hub.cli("system", "whoami", env={"AMUX_TOKEN": "amux_any"})
    one_line(done, "unavailable", 6)


def test_an_invalid_argument_exits_1(memory_hub: HubProcess) -> None:
    done = memory_hub.cli("memory", "search", "x", "--limit", "0")
    one_line(done, "invalid_argument", 1)


def test_a_usage_error_still_exits_2(memory_hub: HubProcess) -> None:
    assert memory_hub.cli("memory", "upsert").returncode == 2


# -- bad input is one line naming what to fix ----------------------------------------------------


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"AMUX_TOKEN": "tok\nX-Evil: 1"}, "AMUX_TOKEN: holds a character a header cannot carry"),
        ({"AMUX_TOKEN": " "}, "AMUX_TOKEN: is blank"),
        ({"AMUX_HUB_URL": ""}, "AMUX_HUB_URL: must be an http(s) URL of the Hub, e.g. http://"),
        ({"AMUX_HUB_URL": "127.0.0.1:8765"}, "AMUX_HUB_URL: must be an http(s) URL"),
    ],
)
def test_a_bad_client_setting_is_one_line_naming_it(
    tmp_path: Path, env: dict[str, str], names: str
) -> None:
    hub = HubProcess(tmp_path / "amux-home", free_port())
    line = one_line(hub.cli("system", "whoami", env=env), "invalid_argument", 1)
    assert names in line
    assert "X-Evil" not in line


@pytest.mark.parametrize(
    "variable", ["AMUX_RUNTIME_PROVIDERS", "AMUX_RUNTIME_CLAUDE_ARGS", "AMUX_RUNTIME_PASS_ENV"]
)
def test_a_json_setting_that_does_not_parse_is_one_line(tmp_path: Path, variable: str) -> None:
    hub = HubProcess(tmp_path / "amux-home", free_port())
    done = hub.cli("runtime", "plan", "--provider", "claude", env={variable: "notjson"})
    line = one_line(done, "invalid_argument", 1)
    assert f"{variable} does not parse" in line and "JSON" in line
    doctor = hub.cli("doctor", "--json", env={variable: "notjson"}, timeout=120)
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr
    settings = next(c for c in doctor.json()["checks"] if c["name"] == "settings")
    assert settings["status"] == "fail" and variable in settings["detail"]


def test_serve_checks_its_port_before_it_makes_anything(tmp_path: Path) -> None:
    hub = HubProcess(tmp_path / "amux-home", free_port())
    line = one_line(hub.cli("serve", "--port", "99999"), "invalid_argument", 1)
    assert "--port" in line and "65535" in line
    assert not hub.home.exists()
    line = one_line(hub.cli("serve", env={"AMUX_PORT": "99999"}), "invalid_argument", 1)
    assert "AMUX_PORT" in line and "65535" in line
    assert not hub.home.exists()


def test_serve_names_the_log_formats_it_takes(tmp_path: Path) -> None:
    hub = HubProcess(tmp_path / "amux-home", free_port())
    line = one_line(hub.cli("serve", "--log-format", "yaml"), "invalid_argument", 1)
    assert "text, json" in line and "pydantic" not in line
