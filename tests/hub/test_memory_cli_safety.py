"""Through the real CLI against a real `amux serve` in the one shared scope (isolation off):
nothing is destroyed by accident, and what a change replaced can be brought back."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import HubProcess, running_hub

pytestmark = pytest.mark.e2e

PATH = "topics/shared.md"
OWNERS = "# Shared\nthe owner's text\n"
ALICES = "# Shared\nalice's edit\n"


def revision(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def shared_hub(tmp_path: Path) -> Iterator[HubProcess]:
    settings = {"memory.enabled": True, "memory.isolation": "off"}
    with running_hub(tmp_path / "amux-home", settings) as hub:
        yield hub


def token_for(hub: HubProcess, name: str) -> dict[str, str]:
    assert hub.cli("principal", "add", name).returncode == 0
    issued = hub.cli("token", "issue", name)
    assert issued.returncode == 0, issued.stderr
    return {"AMUX_TOKEN": issued.stdout.strip()}


def upsert(
    hub: HubProcess, path: str, text: str, expected: str, env: dict[str, str] | None = None
) -> None:
    done = hub.cli("memory", "upsert", path, "--expected-revision", expected, input=text, env=env)
    assert done.returncode == 0, done.stderr


def content(hub: HubProcess, path: str) -> str | None:
    shown = hub.cli("memory", "show", "--json", path)
    assert shown.returncode == 0, shown.stderr
    got = shown.json()
    return str(got["content"]) if got["exists"] else None


def test_an_empty_input_is_refused_unless_allowed(shared_hub: HubProcess) -> None:
    hub = shared_hub
    upsert(hub, PATH, OWNERS, "absent")
    for extra in ([], ["--file", "-"]):
        refused = hub.cli(
            "memory", "upsert", PATH, "--expected-revision", revision(OWNERS), *extra, input=b""
        )
        assert refused.returncode != 0
        assert refused.stderr.startswith("error: invalid_argument:"), refused.stderr
        assert "--allow-empty" in refused.stderr
        assert refused.stderr.count("\n") == 1
        assert content(hub, PATH) == OWNERS

    allowed = hub.cli(
        "memory",
        "upsert",
        PATH,
        "--expected-revision",
        revision(OWNERS),
        "--allow-empty",
        input=b"",
    )
    assert allowed.returncode == 0, allowed.stderr
    assert content(hub, PATH) == ""


@pytest.mark.parametrize("who", ["owner", "alice"])
def test_a_body_someone_else_replaced_can_be_restored_by_anyone_in_the_scope(
    shared_hub: HubProcess, who: str
) -> None:
    hub = shared_hub
    alice = token_for(hub, "alice")
    upsert(hub, PATH, OWNERS, "absent")
    upsert(hub, PATH, ALICES, revision(OWNERS), env=alice)
    assert list((hub.home / "memory-history" / "global").rglob(revision(OWNERS)))

    restorer = alice if who == "alice" else None
    restored = hub.cli(
        "memory",
        "restore",
        "--json",
        PATH,
        "--revision",
        revision(OWNERS),
        "--expected-revision",
        revision(ALICES),
        env=restorer,
    )
    assert restored.returncode == 0, restored.stderr
    assert restored.json()["revision"] == revision(OWNERS)
    assert content(hub, PATH) == OWNERS

    # Forgotten by the owner, alice's body comes back too.
    forgot = hub.cli("memory", "forget", PATH, "--expected-revision", revision(OWNERS))
    assert forgot.returncode == 0, forgot.stderr
    back = hub.cli(
        "memory",
        "restore",
        PATH,
        "--revision",
        revision(ALICES),
        "--expected-revision",
        "absent",
        env=restorer,
    )
    assert back.returncode == 0, back.stderr
    assert content(hub, PATH) == ALICES


def test_restore_takes_the_revision_as_history_prints_it(shared_hub: HubProcess) -> None:
    hub = shared_hub
    upsert(hub, PATH, OWNERS, "absent")
    upsert(hub, PATH, ALICES, revision(OWNERS))
    history = hub.cli("memory", "history", PATH)
    assert history.returncode == 0, history.stderr
    # Whole revisions, to paste into --revision or --expected-revision; a prefix restores too.
    assert f"{revision(OWNERS)} -> {revision(ALICES)}" in history.stdout
    short = revision(OWNERS)[:12]

    def restore(prefix: str) -> tuple[int, str]:
        done = hub.cli(
            "memory",
            "restore",
            PATH,
            "--revision",
            prefix,
            "--expected-revision",
            revision(ALICES),
        )
        return done.returncode, done.stderr

    code, err = restore(short[:11])
    assert code != 0 and err.startswith("error: invalid_argument:"), err
    assert "12" in err and err.count("\n") == 1
    code, err = restore("0" * 12)
    assert code != 0 and err.startswith("error: not_found: no kept copy of revision"), err
    # The revision the document is at now is no kept copy either.
    code, err = restore(revision(ALICES)[:12])
    assert code != 0 and err.startswith("error: not_found:"), err
    assert content(hub, PATH) == ALICES

    code, err = restore(short)
    assert code == 0, err
    assert content(hub, PATH) == OWNERS


def test_a_shared_erase_keeps_what_someone_else_changed_too(shared_hub: HubProcess) -> None:
    hub = shared_hub
    alice = token_for(hub, "alice")
    upsert(hub, PATH, OWNERS, "absent")
    upsert(hub, PATH, ALICES, revision(OWNERS), env=alice)
    mine = "# Alice's own\nnobody else touched this\n"
    upsert(hub, "topics/alice.md", mine, "absent", env=alice)
    owners_own = "# The owner's own\n"
    upsert(hub, "topics/owner.md", owners_own, "absent")

    one = hub.cli("memory", "erase", "--json", PATH, env=alice)
    assert one.returncode == 0, one.stderr
    assert one.json()["documents_removed"] == 0
    assert [k["path"] for k in one.json()["kept"]] == [PATH]

    erased = hub.cli("memory", "erase", "--json", "--all", "--yes", env=alice)
    assert erased.returncode == 0, erased.stderr
    receipt = erased.json()
    assert receipt["documents_removed"] == 1
    assert receipt["log_entries_redacted"] == 1
    assert receipt["kept"] == [{"path": PATH, "reason": receipt["kept"][0]["reason"]}]
    assert "someone else changed it too" in receipt["kept"][0]["reason"]
    assert f"kept: {PATH} (someone else changed it too" in erased.stderr
    assert content(hub, "topics/alice.md") is None
    assert content(hub, "topics/owner.md") == owners_own
    # The kept document, its history and alice's entry on it are untouched: the owner's body
    # is still restorable, and alice still sees her change.
    assert content(hub, PATH) == ALICES
    history = hub.cli("memory", "history", PATH, "--json", env=alice).json()
    assert [e["path"] for e in history["entries"]] == [PATH]
    restored = hub.cli(
        "memory",
        "restore",
        PATH,
        "--revision",
        revision(OWNERS)[:12],
        "--expected-revision",
        revision(ALICES),
    )
    assert restored.returncode == 0, restored.stderr

    # The owner's own erase follows the same rule.
    by_owner = hub.cli("memory", "erase", "--json", "--all", "--yes")
    assert by_owner.returncode == 0, by_owner.stderr
    assert by_owner.json()["documents_removed"] == 1
    assert [k["path"] for k in by_owner.json()["kept"]] == [PATH]
    assert content(hub, "topics/owner.md") is None
    assert content(hub, PATH) == OWNERS
