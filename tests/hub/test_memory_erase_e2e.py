"""`amux principal erase` through a real `amux serve`: the owner removes everything one Principal
wrote, and no copy of its text is left under AMUX_HOME."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import HubProcess, running_hub

pytestmark = pytest.mark.e2e

TEXT = "bob-private-phrase-41c9: my standing preferences\n"


@pytest.fixture
def isolated_hub(tmp_path: Path) -> Iterator[HubProcess]:
    settings = {"memory.enabled": True, "memory.isolation": "on"}
    with running_hub(tmp_path / "amux-home", settings) as hub:
        yield hub


def containing(root: Path, needle: bytes) -> list[Path]:
    return [
        Path(directory, name)
        for directory, _dirs, names in os.walk(root)
        for name in names
        if needle in Path(directory, name).read_bytes()
    ]


def test_the_owner_erases_a_principals_memory_and_no_copy_of_its_text_remains(
    isolated_hub: HubProcess,
) -> None:
    hub = isolated_hub
    assert hub.cli("principal", "add", "bob").returncode == 0
    issued = hub.cli("token", "issue", "bob")
    assert issued.returncode == 0, issued.stderr
    bob = {"AMUX_TOKEN": issued.stdout.strip()}
    first = hub.cli(
        "memory", "upsert", "prefs.md", "--expected-revision", "absent", input=TEXT, env=bob
    )
    assert first.returncode == 0, first.stderr
    revision = hashlib.sha256(TEXT.encode()).hexdigest()
    second = hub.cli(
        "memory", "upsert", "prefs.md", "--expected-revision", revision, input="short\n", env=bob
    )
    assert second.returncode == 0, second.stderr
    assert containing(hub.home, b"bob-private-phrase-41c9")

    refused = hub.cli("principal", "erase", "owner", "--yes", env=bob)
    assert refused.returncode != 0
    assert refused.stderr.startswith("error: forbidden:"), refused.stderr

    erased = hub.cli("principal", "erase", "--json", "bob", "--yes")
    assert erased.returncode == 0, erased.stderr
    receipt = json.loads(erased.stdout)
    assert receipt["documents_removed"] == 1
    assert receipt["history_copies_removed"] == 1
    assert receipt["log_entries_redacted"] == 2
    assert "not erased" in erased.stderr
    assert containing(hub.home, b"bob-private-phrase-41c9") == []
    shown = json.loads(hub.cli("memory", "show", "--json", "prefs.md", env=bob).stdout)
    assert shown["exists"] is False
