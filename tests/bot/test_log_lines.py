"""One request, one log record: what a caller puts into a request cannot write a line of its own."""

from __future__ import annotations

import http.client
import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.service.logs import LogSettings, configure
from tests.conftest import HubProcess, running_hub, wait_until

FORGED = "2026-12-01 19:00:00,000 INFO amux.hub: FORGED"
# The forged record's text, percent-encoded into a path: a newline, then a terminal colour
# escape, DEL and a C1 control, all of which a decoded path carries as characters.
ENCODED_PATH = (
    "/rpc/v1/x%0A2026-12-01%2019:00:00,000%20INFO%20amux.hub:%20FORGED%1B[31m%7F%C2%85%E2%80%A8end"
)
ESCAPED = "/rpc/v1/x\\n" + FORGED + "\\x1b[31m\\x7f\\x85\\u2028end"
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def post(hub: HubProcess, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=10)
    try:
        connection.request(
            "POST", path, body=b"{}", headers={"Authorization": f"Bearer {hub.owner_token}"}
        )
        return connection.getresponse().status
    finally:
        connection.close()


def lines_with(hub: HubProcess, word: str) -> list[str]:
    return [line for line in hub.log().splitlines() if word in line]


@pytest.fixture
def text_hub(tmp_path: Path) -> Iterator[HubProcess]:
    env = {"AMUX_LOG_FORMAT": "text", "AMUX_RUNTIME_IN_PROCESS": "false"}
    with running_hub(tmp_path / "amux-home", extra_env=env) as hub:
        yield hub


@pytest.mark.e2e
def test_an_encoded_newline_in_the_path_is_one_access_line_with_the_text_escaped(
    text_hub: HubProcess,
) -> None:
    assert post(text_hub, ENCODED_PATH) == 404
    logged = wait_until(lambda: lines_with(text_hub, "FORGED"))
    assert len(logged) == 1, text_hub.log()
    line = logged[0]
    assert TIMESTAMP.match(line) and not line.startswith(FORGED)
    assert f"INFO aiohttp.access: POST {ESCAPED} 404" in line
    # No terminal control reaches the log file as itself.
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]", text_hub.log())
    # Every line the Hub wrote is a record of its own or an indented continuation of one.
    for other in text_hub.log().splitlines():
        assert TIMESTAMP.match(other) or other.startswith("  ") or not other.strip(), other


@pytest.mark.e2e
def test_the_json_format_keeps_the_request_on_one_line_and_the_path_exact(
    tmp_path: Path,
) -> None:
    env = {"AMUX_LOG_FORMAT": "json", "AMUX_RUNTIME_IN_PROCESS": "false"}
    with running_hub(tmp_path / "amux-home", extra_env=env) as hub:
        assert post(hub, ENCODED_PATH) == 404
        logged = wait_until(lambda: lines_with(hub, "FORGED"))
    assert len(logged) == 1, hub.log()
    record = json.loads(logged[0])
    assert record["path"] == "/rpc/v1/x\n" + FORGED + "\x1b[31m\x7f\x85\u2028end"
    assert record["status"] == 404
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", logged[0])


def test_a_traceback_whose_message_holds_a_forged_record_stays_inside_its_own() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    configure(LogSettings(format="text"), stream=stream)
    try:
        try:
            raise ValueError(f"bad method\n{FORGED}")
        except ValueError:
            logging.getLogger("amux.hub.rpc").exception("RPC %s failed", "/rpc/v1/a\rb")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    written = stream.getvalue().splitlines()
    assert TIMESTAMP.match(written[0])
    assert written[0].endswith("ERROR amux.hub.rpc: RPC /rpc/v1/a\\rb failed")
    assert all(line.startswith("  ") for line in written[1:]), written
    assert f"  {FORGED}" in written


def test_each_line_carries_its_own_time_to_the_millisecond() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    handler = configure(LogSettings(format="text"), stream=io.StringIO())
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    formatter = handler.formatter
    assert formatter is not None
    plain = logging.Formatter("%(asctime)s")
    # Within one second, into the next, and back to an earlier one (a clock set back).
    for created in (1_764_000_000.001, 1_764_000_000.999, 1_764_000_001.5, 1_763_999_990.25):
        record = logging.LogRecord("amux.hub", logging.INFO, "", 0, "m", None, None)
        record.created = created
        record.msecs = (created - int(created)) * 1000
        assert formatter.formatTime(record) == plain.formatTime(record), created
