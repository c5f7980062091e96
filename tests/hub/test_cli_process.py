"""The operator's path end to end: `amux serve` as a process, separate `amux` CLI invocations."""

from __future__ import annotations

import pytest

from tests.conftest import HubProcess

pytestmark = pytest.mark.e2e


def test_fresh_hub_has_memory_off_and_refuses_data_calls(hub_process: HubProcess) -> None:
    config = hub_process.cli("system", "config", "get", "--json")
    assert config.returncode == 0, config.stderr
    assert config.json()["memory.enabled"] == {
        "saved": False,
        "running": False,
        "restart_pending": False,
    }
    refused = hub_process.cli("memory", "search", "anything")
    assert refused.returncode != 0
    assert refused.stderr.startswith("error: memory_disabled:")
    assert refused.stderr.count("\n") == 1
    assert "Traceback" not in refused.stderr


def test_enabling_memory_takes_effect_after_restart_and_crud_works(
    hub_process: HubProcess,
) -> None:
    saved = hub_process.cli("system", "config", "set", "--json", "memory.enabled", "true")
    assert saved.json()["memory.enabled"]["restart_pending"] is True
    hub_process.restart()

    created = hub_process.cli(
        "memory",
        "upsert",
        "--json",
        "topics/review-format.md",
        "--expected-revision",
        "absent",
        input="# Review format\nconclusion, evidence, unresolved questions\n",
    )
    assert created.returncode == 0, created.stderr
    revision = created.json()["revision"]

    shown = hub_process.cli("memory", "show", "--json", "topics/review-format.md").json()
    assert shown["revision"] == revision
    assert shown["content"].startswith("# Review format")

    found = hub_process.cli("memory", "search", "--json", "unresolved").json()
    assert [m["path"] for m in found["matches"]] == ["topics/review-format.md"]

    stale = hub_process.cli(
        "memory",
        "upsert",
        "topics/review-format.md",
        "--expected-revision",
        "absent",
        input="overwrite",
    )
    assert stale.returncode != 0
    assert stale.stderr.startswith("error: conflict:")
    assert revision in stale.stderr
