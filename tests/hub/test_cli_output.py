"""Through the real CLI against a real `amux serve`: every command prints text for people by
default and JSON with --json, times in that JSON are ISO 8601 UTC, revisions are whole, and a
failure is the same one line and exit status with --json or without."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import AMUX, CliResult, HubProcess, running_hub

pytestmark = pytest.mark.e2e

ISO_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
PATH = "topics/output.md"
FIRST = "# Output\nreview in plain words\n"
SECOND = "# Output\nreview in plain words, briefly\n"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    home = tmp_path_factory.mktemp("cli-output") / "amux-home"
    with running_hub(home, {"memory.enabled": True, "memory.isolation": "off"}) as hub:
        yield hub


def ok(done: CliResult) -> CliResult:
    assert done.returncode == 0, done.stderr
    return done


def revision(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_memory_commands_print_text_and_json_with_the_switch(hub: HubProcess) -> None:
    saved = ok(hub.cli("memory", "upsert", PATH, "--expected-revision", "absent", input=FIRST))
    assert saved.stdout == f"saved {PATH} revision {revision(FIRST)}\n"
    again = hub.cli(
        "memory", "upsert", PATH, "--json", "--expected-revision", revision(FIRST), input=SECOND
    )
    assert ok(again).json() == {"path": PATH, "revision": revision(SECOND)}

    # show: the document as stored on stdout, its whole revision on stderr.
    shown = ok(hub.cli("memory", "show", PATH))
    assert shown.stdout == SECOND
    assert shown.stderr == f"revision: {revision(SECOND)}\n"
    shown_json = ok(hub.cli("memory", "show", PATH, "--json")).json()
    assert (shown_json["content"], shown_json["revision"]) == (SECOND, revision(SECOND))

    found = ok(hub.cli("memory", "search", "briefly"))
    (line,) = found.stdout.splitlines()
    assert line.startswith(f"{PATH}:2: ") and "briefly" in line, line
    (match,) = ok(hub.cli("memory", "search", "briefly", "--json")).json()["matches"]
    assert (match["path"], match["revision"]) == (PATH, revision(SECOND))

    # history: one line per change with whole revisions; JSON times are ISO 8601 UTC.
    history = ok(hub.cli("memory", "history", PATH))
    newest, oldest = history.stdout.splitlines()
    assert f"{revision(FIRST)} -> {revision(SECOND)}" in newest
    assert "by owner via cli" in newest and "restorable until" in newest
    assert f"absent -> {revision(FIRST)}" in oldest
    entries = ok(hub.cli("memory", "history", PATH, "--json")).json()["entries"]
    assert [e["new_revision"] for e in entries] == [revision(SECOND), revision(FIRST)]
    assert all(ISO_UTC.fullmatch(e["at"]) for e in entries), entries
    assert ISO_UTC.fullmatch(entries[0]["restorable_until"]), entries[0]
    assert entries[1]["restorable_until"] is None


def test_config_get_prints_key_value_lines_or_json(hub: HubProcess) -> None:
    got = ok(hub.cli("system", "config", "get", "memory.enabled"))
    assert got.stdout == "memory.enabled = true\n"
    every = ok(hub.cli("system", "config", "get")).stdout.splitlines()
    assert any(
        re.fullmatch(r"agents\.permissions +=.*\(live: no restart needed\)", x) for x in every
    )
    as_json = ok(hub.cli("system", "config", "get", "memory.enabled", "--json")).json()
    assert as_json == {"memory.enabled": {"saved": True, "running": True, "restart_pending": False}}


def test_principals_and_tokens_print_columns_or_json_with_iso_times(hub: HubProcess) -> None:
    added = ok(hub.cli("principal", "add", "olive"))
    assert re.fullmatch(r"added principal olive \(user\) id [0-9a-f]{32}\n", added.stdout)
    principal_id = added.stdout.split()[-1]
    header, *rows = ok(hub.cli("principal", "list")).stdout.splitlines()
    assert header.split() == ["NAME", "KIND", "OWNER", "ID"]
    assert ["olive", "user", "no", principal_id] in [row.split() for row in rows]
    listed = ok(hub.cli("principal", "list", "--json")).json()
    olive = {"id": principal_id, "name": "olive", "kind": "user", "owner": False}
    assert {**olive, "display_name": ""} in listed, "no display name until Feishu gives one"

    # The token alone on stdout, for `$(amux token issue …)`; --json gives it with its id.
    issued = ok(hub.cli("token", "issue", "olive", "--label", "laptop"))
    assert re.fullmatch(r"amux_\S+\n", issued.stdout), issued.stdout
    assert issued.stderr.startswith("token id ") and "for olive" in issued.stderr
    issued_json = ok(hub.cli("token", "issue", "olive", "--json")).json()
    assert issued_json["token"].startswith("amux_") and issued_json["principal"] == "olive"
    assert ISO_UTC.fullmatch(issued_json["created_at"]), issued_json
    assert (issued_json["expires_at"], issued_json["revoked_at"]) == (None, None)

    revoked = ok(hub.cli("token", "revoke", issued_json["id"]))
    assert revoked.stdout == f"revoked token {issued_json['id']}\n"
    header, *rows = ok(hub.cli("token", "list", "olive")).stdout.splitlines()
    assert header.split() == ["ID", "PRINCIPAL", "KIND", "LABEL", "CREATED", "EXPIRES", "STATUS"]
    by_id = {row.split()[0]: row.split() for row in rows}
    assert by_id[issued_json["id"]][-1] == "revoked"
    laptop = next(row for row in by_id.values() if row[3] == "laptop")
    assert (laptop[1], laptop[-2], laptop[-1]) == ("olive", "never", "active")

    tokens = ok(hub.cli("token", "list", "olive", "--json")).json()
    assert all(ISO_UTC.fullmatch(t["created_at"]) for t in tokens), tokens
    (gone,) = [t for t in tokens if t["id"] == issued_json["id"]]
    assert gone["revoked"] is True and ISO_UTC.fullmatch(gone["revoked_at"]), gone
    assert issued_json["token"] not in str(tokens)


@pytest.mark.parametrize(
    ("args", "env", "status"),
    [
        (["memory", "export", "topics/nowhere.md"], {}, 4),
        (["memory", "show", "../outside.md"], {}, 1),
        (["principal", "show", "nobody"], {}, 4),
        (["system", "whoami"], {"AMUX_TOKEN": "amux_not-a-real-token"}, 5),
    ],
    ids=["not-found", "invalid", "local-not-found", "unauthenticated"],
)
def test_a_failure_is_the_same_line_and_status_with_json_or_without(
    hub: HubProcess, args: list[str], env: dict[str, str], status: int
) -> None:
    text = hub.cli(*args, env=env)
    as_json = hub.cli(*args, "--json", env=env)
    assert (as_json.returncode, as_json.stdout, as_json.stderr) == (
        text.returncode,
        text.stdout,
        text.stderr,
    )
    assert text.returncode == status, text.stderr
    assert text.stdout == ""
    assert re.fullmatch(r"error: [a-z_]+: [^\n]+\n", text.stderr), text.stderr


def test_a_conflict_is_the_same_line_with_json_or_without(hub: HubProcess) -> None:
    ok(hub.cli("memory", "upsert", "topics/taken.md", "--expected-revision", "absent", input="a\n"))
    stale = ["memory", "upsert", "topics/taken.md", "--expected-revision", "absent"]
    text = hub.cli(*stale, input="b\n")
    as_json = hub.cli(*stale, "--json", input="b\n")
    assert text.returncode == as_json.returncode == 3
    assert text.stderr == as_json.stderr
    assert text.stderr.startswith("error: conflict: ") and revision("a\n") in text.stderr


def test_serve_on_a_port_in_use_is_one_unavailable_line_naming_the_fix(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMUX_")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        expected = (
            f"error: unavailable: cannot listen on 127.0.0.1:{port}: the port is in use (another "
            "amux serve?); stop what listens there, or choose another port with --port or "
            "AMUX_PORT"
        )
        for how, extra in (("--port", {}), ("AMUX_PORT", {"AMUX_PORT": str(port)})):
            argv = [AMUX, "serve", *(["--port", str(port)] if how == "--port" else [])]
            done = subprocess.run(
                argv,
                env={**env, "AMUX_HOME": str(tmp_path / how), **extra},
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 6, (how, done.stderr)
            errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
            assert errors == [expected], done.stderr
            assert "Traceback" not in done.stderr
