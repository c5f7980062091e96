"""Memory end to end for an operator: `amux serve` as a process, separate `amux` CLI invocations."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hub.cli import CliEnv, export_document, memory_app
from hub.client import HubClient
from hub.config import ClientSettings, HubSettings
from hub.errors import Conflict
from tests.conftest import AMUX, CliResult, HubProcess, free_port, running_hub

pytestmark = pytest.mark.e2e

BIG = (
    "# Release runbook\n"
    + "".join(
        f'{i:04}: 发布流程 step with "quotes", back\\slashes, tabs\t, emoji 🚀 and \x01 control\n'
        for i in range(300)
    )
    + "x" * 20_000
    + "\nlast line without newline"
)


@pytest.fixture(scope="module")
def memory_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """One Hub process with memory enabled, shared by the tests that only read and write."""
    home = tmp_path_factory.mktemp("e2e") / "amux-home"
    with running_hub(home, {"memory.enabled": True}) as hub:
        yield hub


def ok(result: CliResult) -> Any:
    assert result.returncode == 0, result.stderr
    return result.json()


def one_line_error(result: CliResult, code: str) -> str:
    assert result.returncode != 0
    assert result.stderr.startswith(f"error: {code}:"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def rpc_ok(hub: HubProcess, method: str, token: str | None = None, **params: Any) -> Any:
    """A setup or check step over raw RPC: each CLI start costs seconds, so keep those for
    what the CLI itself must show."""
    status, body = hub.rpc(method, token, **params)
    assert status == 200, body
    return body


def put(hub: HubProcess, path: str, content: str) -> str:
    current = rpc_ok(hub, "memory.get", path=path, end_line=1)["revision"]
    return str(
        rpc_ok(hub, "memory.upsert", path=path, content=content, expected_revision=current)[
            "revision"
        ]
    )


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_crud_search_and_forget_through_separate_cli_calls(
    memory_hub: HubProcess, tmp_path: Path
) -> None:
    cli = memory_hub.cli
    path = "projects/amux/decisions.md"
    created = ok(
        cli(
            "memory",
            "upsert",
            "--json",
            path,
            "--expected-revision",
            "absent",
            input="# Decisions\n",
        )
    )
    assert created == {"path": path, "revision": sha("# Decisions\n")}

    replacement = "# Decisions\n- 发布流程 needs two reviews\n- Deploy on Tuesdays\n"
    source = tmp_path / "decisions.md"
    source.write_text(replacement)
    replaced = ok(
        cli(
            "memory",
            "upsert",
            "--json",
            path,
            "--expected-revision",
            created["revision"],
            "--file",
            str(source),
        )
    )
    assert replaced["revision"] == sha(replacement)

    shown = ok(cli("memory", "show", "--json", path))
    assert shown == {
        "path": path,
        "exists": True,
        "revision": replaced["revision"],
        "content": replacement,
        "truncated": False,
        "next_offset": None,
    }
    lines = ok(cli("memory", "show", "--json", path, "--start-line", "2", "--end-line", "3"))
    assert lines["content"] == "- 发布流程 needs two reviews\n- Deploy on Tuesdays\n"

    found = ok(cli("memory", "search", "--json", "发布流程 tuesdays", "--path-prefix", "projects"))
    assert found["incomplete"] is False
    assert found["truncated"] is False
    assert [(m["path"], m["line"], m["revision"]) for m in found["matches"]] == [
        (path, 2, replaced["revision"])
    ]

    forgotten = ok(
        cli("memory", "forget", "--json", path, "--expected-revision", replaced["revision"])
    )
    assert forgotten == {"path": path, "already_absent": False}
    gone = rpc_ok(memory_hub, "memory.get", path=path)
    assert (gone["exists"], gone["revision"], gone["content"]) == (False, "absent", "")
    again = ok(cli("memory", "forget", "--json", path, "--expected-revision", replaced["revision"]))
    assert again == {"path": path, "already_absent": True}


def test_a_document_over_8_kib_exports_byte_identical_page_by_page(memory_hub: HubProcess) -> None:
    path = "runbooks/release.md"
    assert len(BIG.encode()) > 4 * 8 * 1024
    put(memory_hub, path, BIG)
    first = rpc_ok(memory_hub, "memory.get", path=path)
    assert first["truncated"] is True
    exported = subprocess.run(
        [AMUX, "memory", "export", path],
        env=memory_hub.env(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout == BIG.encode()


def test_exporting_a_missing_document_prints_nothing_and_fails(memory_hub: HubProcess) -> None:
    result = memory_hub.cli("memory", "export", "no/such.md")
    one_line_error(result, "not_found")
    assert result.stdout == ""


class ChangingClient(HubClient):
    """A client that, like a concurrent writer, changes the document between export pages."""

    def __init__(self, *args: Any, new_content: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.new_content = new_content
        self.gets = 0
        self.written: str | None = None

    async def memory_get(
        self,
        path: str,
        start_line: int | None = None,
        end_line: int | None = None,
        offset: int | None = None,
    ) -> dict[str, Any]:
        self.gets += 1
        if self.gets == 2:
            current = await super().memory_get(path, end_line=1)
            written = await self.memory_upsert(path, self.new_content, current["revision"])
            self.written = written["revision"]
        return await super().memory_get(path, start_line, end_line, offset)


def test_export_that_meets_a_concurrent_change_raises_conflict(memory_hub: HubProcess) -> None:
    path = "runbooks/changing.md"
    put(memory_hub, path, BIG)

    async def attempt() -> tuple[ChangingClient, Conflict]:
        client = ChangingClient(memory_hub.url, memory_hub.owner_token, new_content=BIG + "!")
        async with client:
            with pytest.raises(Conflict) as caught:
                await export_document(client, path)
        return client, caught.value

    client, conflict = asyncio.run(attempt())
    assert client.written is not None
    assert conflict.observed_revision == client.written


class ChangingEnv(CliEnv):
    def client(self) -> HubClient:
        settings = self.client_settings()
        return ChangingClient(
            settings.hub_url, settings.resolved_token(), new_content=f"changed {id(self)}\n" * 999
        )


def test_the_export_command_emits_nothing_when_the_document_changes_midway(
    memory_hub: HubProcess,
) -> None:
    path = "runbooks/changing-cli.md"
    put(memory_hub, path, BIG)
    env = ChangingEnv(
        client_settings=lambda: ClientSettings(
            home=memory_hub.home, hub_url=memory_hub.url, token=None
        ),
        hub_settings=lambda: HubSettings(home=memory_hub.home),
    )
    result = CliRunner().invoke(memory_app, ["export", path], obj=env)
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr.startswith("error: conflict:")
    now = rpc_ok(memory_hub, "memory.get", path=path, end_line=1)
    assert f"observed revision: {now['revision']}" in result.stderr


def test_a_stale_revision_is_refused_with_the_observed_revision(memory_hub: HubProcess) -> None:
    path = "topics/stale.md"
    first = put(memory_hub, path, "v1\n")
    second = put(memory_hub, path, "v2\n")
    cli = memory_hub.cli
    stale = cli("memory", "upsert", path, "--expected-revision", first, input="v3\n")
    assert f"(observed revision: {second})" in one_line_error(stale, "conflict")
    assert stale.stdout == ""
    stale_forget = cli("memory", "forget", path, "--expected-revision", first)
    assert second in one_line_error(stale_forget, "conflict")
    assert rpc_ok(memory_hub, "memory.get", path=path)["content"] == "v2\n"


def test_upsert_without_the_expected_revision_flag_is_refused(memory_hub: HubProcess) -> None:
    result = memory_hub.cli("memory", "upsert", "topics/flagless.md", input="x\n")
    assert result.returncode != 0
    assert "--expected-revision" in result.stderr
    assert rpc_ok(memory_hub, "memory.get", path="topics/flagless.md")["exists"] is False


def test_invalid_utf8_input_is_refused_and_nothing_is_written(
    memory_hub: HubProcess, tmp_path: Path
) -> None:
    path = "topics/binary.md"
    bad = b"# Notes\n\xff\xfe not text \xc3\x28\n"
    upsert = ("memory", "upsert", path, "--expected-revision", "absent")
    from_stdin = memory_hub.cli(*upsert, input=bad)
    assert "UTF-8" in one_line_error(from_stdin, "invalid_argument")
    source = tmp_path / "bad.md"
    source.write_bytes(bad)
    from_file = memory_hub.cli(*upsert, "--file", str(source))
    assert "UTF-8" in one_line_error(from_file, "invalid_argument")
    assert rpc_ok(memory_hub, "memory.get", path=path)["exists"] is False
    assert not (memory_hub.home / "memory" / "global" / "topics" / "binary.md").exists()


def test_bad_paths_quotas_and_queries_are_one_line_errors(memory_hub: HubProcess) -> None:
    cli = memory_hub.cli
    one_line_error(cli("memory", "show", "../escape.md"), "invalid_path")
    hidden = cli("memory", "upsert", ".hidden/x.md", "--expected-revision", "absent", input="x")
    one_line_error(hidden, "invalid_path")
    big_entry = cli(
        "memory", "upsert", "MEMORY.md", "--expected-revision", "absent", input="x" * 3000
    )
    one_line_error(big_entry, "quota_exceeded")
    assert rpc_ok(memory_hub, "memory.get", path="MEMORY.md")["exists"] is False
    one_line_error(cli("memory", "search", " ".join(["k"] * 17)), "invalid_argument")
    assert not list((memory_hub.home / "memory").rglob(".hidden"))


def test_a_non_owner_can_use_memory_but_not_change_settings_or_restart(
    memory_hub: HubProcess,
) -> None:
    ok(memory_hub.cli("principal", "add", "--json", "bob"))
    issued = memory_hub.cli("token", "issue", "bob")
    assert issued.returncode == 0, issued.stderr
    token = issued.stdout.strip()
    bob = {"AMUX_TOKEN": token}
    created = rpc_ok(
        memory_hub,
        "memory.upsert",
        token,
        path="topics/bob.md",
        content="bob\n",
        expected_revision="absent",
    )
    assert created["path"] == "topics/bob.md"
    refused = memory_hub.cli("system", "config", "set", "memory.enabled", "false", env=bob)
    one_line_error(refused, "forbidden")
    one_line_error(memory_hub.cli("system", "restart", env=bob), "forbidden")
    config = rpc_ok(memory_hub, "system.config.get")["memory.enabled"]
    assert (config["saved"], config["restart_pending"]) == (True, False)

    token_id = issued.stderr.split()[2]
    ok(memory_hub.cli("token", "revoke", "--json", token_id))
    revoked = memory_hub.cli("memory", "show", "topics/bob.md", env=bob)
    one_line_error(revoked, "unauthenticated")


def test_a_second_hub_on_the_same_home_fails_fast_and_says_why(memory_hub: HubProcess) -> None:
    assert memory_hub.proc is not None
    second = subprocess.run(
        [AMUX, "serve", "--port", str(free_port())],
        env=memory_hub.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode != 0
    assert "another amux Hub" in second.stderr
    assert f"pid {memory_hub.proc.pid}" in second.stderr
    assert "Traceback" not in second.stderr
    assert memory_hub.healthy()


def test_disabling_memory_refuses_data_calls_and_keeps_the_files(
    tmp_path: Path,
) -> None:
    home = tmp_path / "amux-home"
    with running_hub(home, {"memory.enabled": True}) as hub:
        kept = put(hub, "MEMORY.md", "keep me\n")
        ok(hub.cli("system", "config", "set", "--json", "memory.enabled", "false"))
        hub.restart()
        one_line_error(hub.cli("memory", "search", "keep"), "memory_disabled")
        refused = hub.cli("memory", "upsert", "x.md", "--expected-revision", "absent", input="x")
        one_line_error(refused, "memory_disabled")
        for method, params in [
            ("memory.get", {"path": "MEMORY.md"}),
            ("memory.forget", {"path": "MEMORY.md", "expected_revision": kept}),
        ]:
            status, body = hub.rpc(method, **params)
            assert (status, body["error"]["code"]) == (403, "memory_disabled")
        assert (home / "memory" / "global" / "MEMORY.md").read_text() == "keep me\n"
        assert not (home / "memory" / "global" / "x.md").exists()
