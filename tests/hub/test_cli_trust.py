"""Through the real CLI against a real `amux serve`: a whole scope is erased only once asked, a
command that did nothing says so, names that look alike are one name, and a setting that hides
memory warns first."""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import HubProcess, running_hub

pytestmark = pytest.mark.e2e

TEXT = "# Notes\nkeep this\n"


def revision(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def shared_hub(tmp_path: Path) -> Iterator[HubProcess]:
    settings = {"memory.enabled": True, "memory.isolation": "off"}
    with running_hub(tmp_path / "amux-home", settings) as hub:
        yield hub


def upsert(hub: HubProcess, path: str, text: str, expected: str = "absent") -> None:
    done = hub.cli("memory", "upsert", path, "--expected-revision", expected, input=text)
    assert done.returncode == 0, done.stderr


def exists(hub: HubProcess, path: str) -> bool:
    shown = hub.cli("memory", "show", "--json", path)
    assert shown.returncode == 0, shown.stderr
    return bool(shown.json()["exists"])


def test_erasing_a_whole_scope_asks_first(shared_hub: HubProcess) -> None:
    hub = shared_hub
    upsert(hub, "notes.md", TEXT)
    assert hub.cli("principal", "add", "bob").returncode == 0

    # Off a terminal: one line naming --yes, and nothing removed.
    for args in (["memory", "erase", "--all"], ["principal", "erase", "bob"]):
        refused = hub.cli(*args, input="")
        assert refused.returncode != 0
        assert refused.stderr.startswith("error: invalid_argument: "), refused.stderr
        assert "--yes" in refused.stderr
        assert refused.stderr.count("\n") == 1
        assert refused.stdout == ""
    assert exists(hub, "notes.md")

    # On a terminal it asks; no (or just Enter) keeps everything.
    for answer in ("n\n", "\n"):
        declined = hub.on_a_terminal(answer, "memory", "erase", "--all")
        assert declined.returncode != 0, declined.stderr
        assert "[y/N]" in declined.stderr
        assert declined.stderr.endswith("error: invalid_argument: nothing erased\n")
    declined = hub.on_a_terminal("n\n", "principal", "erase", "bob")
    assert "everything 'bob' wrote" in declined.stderr and "[y/N]" in declined.stderr
    assert declined.stderr.endswith("error: invalid_argument: nothing erased\n")
    assert exists(hub, "notes.md")

    # Yes erases.
    erased = hub.on_a_terminal("y\n", "memory", "erase", "--all", "--json")
    assert erased.returncode == 0, erased.stderr
    assert '"documents_removed": 1' in erased.stdout
    assert not exists(hub, "notes.md")
    by_principal = hub.on_a_terminal("y\n", "principal", "erase", "bob")
    assert by_principal.returncode == 0, by_principal.stderr


def test_forgetting_or_erasing_nothing_is_not_a_silent_success(shared_hub: HubProcess) -> None:
    hub = shared_hub
    forgot = hub.cli("memory", "forget", "--json", "nosuch.md", "--expected-revision", "absent")
    assert forgot.returncode == 0, forgot.stderr
    assert forgot.json()["already_absent"] is True
    assert forgot.stderr == "nosuch.md did not exist: nothing was forgotten\n"

    missing = hub.cli("memory", "erase", "nosuch.md")
    assert missing.returncode != 0
    assert missing.stderr.startswith("error: not_found: nothing to erase at 'nosuch.md'")
    assert missing.stdout == ""

    # A document forgotten earlier still has its kept copy: erasing it is not an error.
    upsert(hub, "gone.md", TEXT)
    done = hub.cli("memory", "forget", "gone.md", "--expected-revision", revision(TEXT))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    erased = hub.cli("memory", "erase", "--json", "gone.md")
    assert erased.returncode == 0, erased.stderr
    assert erased.json()["documents_removed"] == 0
    assert erased.json()["history_copies_removed"] == 1
    again = hub.cli("memory", "erase", "gone.md")
    assert again.stderr.startswith("error: not_found:"), again.stderr


def test_principal_names_that_look_alike_are_one_name(shared_hub: HubProcess) -> None:
    hub = shared_hub
    assert hub.cli("principal", "add", "alice").returncode == 0
    twin = hub.cli("principal", "add", "Alice")
    assert twin.returncode != 0
    assert twin.stderr == "error: conflict: a principal named 'alice' already exists\n"

    composed = unicodedata.normalize("NFC", "josé")
    decomposed = unicodedata.normalize("NFD", "josé")
    assert composed != decomposed
    added = hub.cli("principal", "add", "--json", decomposed)
    assert added.returncode == 0, added.stderr
    assert added.json()["name"] == composed
    again = hub.cli("principal", "add", composed.upper())
    assert again.stderr.startswith("error: conflict: a principal named 'josé'"), again.stderr
    # Either spelling finds it.
    assert hub.cli("principal", "show", "--json", decomposed).json()["name"] == composed

    for name in ("zero\u200bwidth", "esc\x1b[31mred", "rtl\u202eevil"):
        refused = hub.cli("principal", "add", name)
        assert refused.returncode != 0
        assert refused.stderr.startswith("error: invalid_argument: "), refused.stderr
        assert "invisible" in refused.stderr
    names = [p["name"] for p in hub.cli("principal", "list", "--json").json()]
    assert [n for n in names if n.casefold() in ("alice", "josé")] == ["alice", composed]
    assert not [n for n in names if not n.isprintable()]


def test_memory_paths_refuse_padded_names_and_case_twins(shared_hub: HubProcess) -> None:
    hub = shared_hub
    for path in (" lead.md", "dir /a.md", " dir/a.md", "a/trail\u00a0/b.md"):
        refused = hub.cli("memory", "upsert", path, "--expected-revision", "absent", input=TEXT)
        assert refused.returncode != 0
        assert refused.stderr.startswith("error: invalid_path: "), refused.stderr
        assert "space" in refused.stderr

    upsert(hub, "MEMORY.md", TEXT)
    upsert(hub, "Topics/release.md", TEXT)
    for path, existing in (("memory.md", "MEMORY.md"), ("topics/other.md", "Topics")):
        twin = hub.cli("memory", "upsert", path, "--expected-revision", "absent", input=TEXT)
        assert twin.returncode != 0
        assert twin.stderr.startswith(f"error: conflict: '{existing}' already exists"), twin.stderr
        assert not exists(hub, path)
    # The existing ones are written as before.
    upsert(hub, "MEMORY.md", "# Changed\n", revision(TEXT))
    upsert(hub, "Topics/other.md", TEXT)


def test_turning_isolation_on_warns_that_global_memory_goes_out_of_sight(
    shared_hub: HubProcess,
) -> None:
    hub = shared_hub
    upsert(hub, "one.md", TEXT)
    upsert(hub, "two.md", TEXT)
    done = hub.cli("system", "config", "set", "--json", "memory.isolation", "on")
    assert done.returncode == 0, done.stderr
    assert "warning: the global memory scope holds 2 document(s)" in done.stderr
    assert "will not be visible" in done.stderr
    assert "amux memory export" in done.stderr and "amux memory upsert" in done.stderr
    assert done.json()["memory.isolation"]["global_documents"] == 2

    # Turning it off, or another setting, warns of nothing.
    off = hub.cli("system", "config", "set", "--json", "memory.isolation", "off")
    assert off.returncode == 0, off.stderr
    assert "warning" not in off.stderr
    assert "global_documents" not in off.json()["memory.isolation"]
