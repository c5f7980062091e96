"""Local administration on the Hub host through the `amux` CLI: principals, aliases and tokens, and
a state database it cannot read refused in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hub.migrations import SCHEMA_VERSION
from hub.state import State
from tests.conftest import AMUX, HubProcess, free_port
from tests.hub.test_migrations import raw

pytestmark = pytest.mark.e2e


def admin(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AMUX, *args],
        env={"AMUX_HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def data(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_aliases_map_outside_identities_to_one_principal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    State(home / "state.sqlite3").close()  # The state a Hub made here.
    data(admin(home, "principal", "add", "--json", "alice"))
    data(admin(home, "principal", "add", "--json", "bob"))
    shown = data(
        admin(
            home,
            "principal",
            "alias",
            "alice",
            "--json",
            "--feishu-union-id",
            "on_1",
            "--feishu-open-id",
            "ou_1",
        )
    )
    assert {"kind": "feishu_union_id", "value": "on_1"} in shown["aliases"]
    # Until the bot has learned its app's tenant, an open_id waits for it (see hub.aliases).
    assert {"kind": "feishu:*:open_id", "value": "ou_1"} in shown["aliases"]

    taken = admin(home, "principal", "alias", "bob", "--feishu-union-id", "on_1")
    assert taken.returncode == 3
    assert taken.stderr.startswith("error: conflict:")
    assert data(admin(home, "principal", "show", "--json", "bob"))["aliases"] == []

    missing = admin(home, "principal", "show", "carol")
    assert missing.returncode == 4 and missing.stderr.startswith("error: not_found:")
    assert "Traceback" not in missing.stderr


def test_admin_commands_never_make_a_state_database_no_hub_reads(tmp_path: Path) -> None:
    home = tmp_path / "elsewhere"
    for command in (
        ["principal", "list"],
        ["principal", "add", "alice"],
        ["token", "issue", "owner"],
        ["token", "list"],
    ):
        done = admin(home, *command)
        assert done.returncode == 4
        assert done.stderr == (
            f"error: not_found: no Hub state in AMUX_HOME {home} (no state.sqlite3); run this "
            "on the Hub's host with AMUX_HOME set to the home `amux serve` uses\n"
        )
    assert not home.exists()

    # Without AMUX_HOME the default is .amux under the current directory: said so, and not made.
    done = subprocess.run(
        [AMUX, "principal", "list"],
        env={"PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 4 and done.stdout == ""
    assert done.stderr.startswith(
        f"error: not_found: no Hub state in AMUX_HOME {tmp_path / '.amux'} (no state.sqlite3, "
        "the default: AMUX_HOME is unset); "
    )
    assert not (tmp_path / ".amux").exists()


def test_issued_token_works_once_shown_and_stops_when_revoked(hub_process: HubProcess) -> None:
    home = hub_process.home
    data(hub_process.cli("principal", "add", "--json", "carol"))
    issued = hub_process.cli("token", "issue", "carol", "--label", "laptop")
    assert issued.returncode == 0, issued.stderr
    token = issued.stdout.strip()
    assert token.startswith("amux_")
    # Only the hash is stored: the token text appears nowhere in the state database.
    assert token.encode() not in (home / "state.sqlite3").read_bytes()
    listed = data(hub_process.cli("token", "list", "--json", "carol"))
    assert [t["label"] for t in listed] == ["laptop"]
    assert token not in json.dumps(listed)

    whoami = hub_process.cli("system", "whoami", "--json", env={"AMUX_TOKEN": token})
    assert data(whoami)["principal"]["name"] == "carol"
    # A non-owner cannot change settings or restart the Hub.
    refused = hub_process.cli(
        "system", "config", "set", "memory.enabled", "true", env={"AMUX_TOKEN": token}
    )
    assert refused.returncode == 5 and refused.stderr.startswith("error: forbidden:")
    restart = hub_process.cli("system", "restart", env={"AMUX_TOKEN": token})
    assert restart.returncode == 5 and restart.stderr.startswith("error: forbidden:")

    data(hub_process.cli("token", "revoke", "--json", listed[0]["id"]))
    after = hub_process.cli("system", "whoami", env={"AMUX_TOKEN": token})
    assert after.returncode == 5 and after.stderr.startswith("error: unauthenticated:")


def test_revoking_the_token_in_use_asks_first_and_a_lost_owner_token_is_reissued(
    hub_process: HubProcess,
) -> None:
    home = hub_process.home
    (owner,) = data(hub_process.cli("token", "list", "--json", "owner"))
    old_token = hub_process.owner_token

    # Not on a terminal: refused in one line naming --yes, and the token keeps working.
    refused = hub_process.cli("token", "revoke", owner["id"], input="")
    assert refused.returncode == 1
    assert refused.stderr == (
        f"error: invalid_argument: token {owner['id']} is the one this CLI is using; once "
        "revoked it is refused: pass --yes to revoke it anyway\n"
    )
    # On a terminal it asks; no keeps it.
    declined = hub_process.on_a_terminal("n\n", "token", "revoke", owner["id"])
    assert declined.returncode == 1, declined.stderr
    assert "Revoke it? [y/N]" in declined.stderr
    assert declined.stderr.endswith("error: invalid_argument: not revoked\n")
    assert data(hub_process.cli("system", "whoami", "--json"))["principal"]["name"] == "owner"

    revoked = hub_process.cli("token", "revoke", "--json", owner["id"], "--yes")
    assert revoked.returncode == 0, revoked.stderr
    assert revoked.json()["revoked"] is True
    assert "`amux token issue --owner-file`" in revoked.stderr
    after = hub_process.cli("system", "whoami")
    assert after.returncode == 5 and after.stderr.startswith("error: unauthenticated:")

    # Again: nothing to do, said so, and not an error.
    again = hub_process.cli("token", "revoke", "--json", owner["id"], input="")
    assert again.returncode == 0
    assert again.stderr == f"token {owner['id']} is already revoked\n"
    assert again.json()["revoked"] is True

    # A restart makes no new owner token: the Hub already has its principals.
    hub_process.stop()
    hub_process.start()
    assert hub_process.owner_token == old_token

    # The recovery, on the Hub's host: a fresh owner token in owner.token, mode 0600.
    not_owner = hub_process.cli("principal", "add", "erin")
    assert not_owner.returncode == 0, not_owner.stderr
    wrong = hub_process.cli("token", "issue", "erin", "--owner-file")
    assert wrong.returncode == 1
    assert wrong.stderr.startswith("error: invalid_argument: 'erin' is not an owner")
    assert hub_process.owner_token == old_token
    issued = hub_process.cli("token", "issue", "--owner-file")
    assert issued.returncode == 0, issued.stderr
    assert issued.stdout == ""
    assert issued.stderr.endswith(f"written to {home / 'owner.token'}\n")
    assert (home / "owner.token").stat().st_mode & 0o777 == 0o600
    assert hub_process.owner_token != old_token
    assert hub_process.owner_token not in issued.stderr
    assert data(hub_process.cli("system", "whoami", "--json"))["principal"]["name"] == "owner"
    labels = [t["label"] for t in data(hub_process.cli("token", "list", "--json", "owner"))]
    assert labels == ["local owner", "local owner"]


def test_a_bad_setting_is_one_line_naming_the_variable_not_its_value(tmp_path: Path) -> None:
    done = subprocess.run(
        [AMUX, "memory", "search", "x"],
        env={"AMUX_HOME": str(tmp_path), "AMUX_TIMEOUT": "soon-secretish", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: invalid_argument: bad setting: AMUX_TIMEOUT:")
    assert done.stderr.count("\n") == 1
    assert "soon-secretish" not in done.stderr and "Traceback" not in done.stderr


def test_the_owner_token_under_amux_home_is_never_used_inside_an_agent_launch(
    hub_process: HubProcess,
) -> None:
    # The CLI run beside the Hub finds the owner token by itself...
    assert data(hub_process.cli("system", "whoami", "--json"))["principal"]["owner"] is True
    # ...an Agent launch's environment switches that fallback off.
    inside = hub_process.cli("system", "whoami", env={"AMUX_OWNER_TOKEN_FALLBACK": "false"})
    assert inside.returncode != 0
    assert inside.stderr.startswith("error: unauthenticated:")


def test_only_the_owner_may_choose_an_agents_working_directory(
    hub_process: HubProcess, tmp_path: Path
) -> None:
    data(hub_process.cli("principal", "add", "--json", "dora"))
    token = hub_process.cli("token", "issue", "dora").stdout.strip()
    status, body = hub_process.rpc(
        "executions.submit", token=token, provider="claude", prompt="hi", cwd=str(tmp_path)
    )
    assert status == 403 and body["error"]["code"] == "forbidden"
    assert "working directory" in body["error"]["message"]
    status, body = hub_process.rpc("executions.submit", token=token, provider="claude", prompt="hi")
    assert status == 200 and body["session"]["cwd"] is None
    status, body = hub_process.rpc(
        "executions.submit", provider="claude", prompt="hi", cwd=str(tmp_path)
    )
    assert status == 200 and body["session"]["cwd"] == str(tmp_path)


def test_the_admin_cli_and_the_hub_refuse_a_newer_database_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    path = home / "state.sqlite3"
    State(path).close()
    with raw(path) as db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    env = {"AMUX_HOME": str(home), "PATH": "/usr/bin:/bin"}

    for command in (["principal", "list"], ["serve", "--port", str(free_port())]):
        done = subprocess.run(
            [AMUX, *command], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 6, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert errors == [
            f"error: unavailable: the state database {path} has schema version "
            f"{SCHEMA_VERSION + 1}, but this amux knows versions up to {SCHEMA_VERSION}: a newer "
            "amux wrote it; run that version, or restore the backup taken before the upgrade"
        ], done.stderr
        assert "Traceback" not in done.stderr
