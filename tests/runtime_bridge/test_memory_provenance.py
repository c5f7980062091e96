"""Memory people can trust, end to end through `amux serve`: every change is logged with its
author and route, old bodies stay restorable for the window, and erase leaves no copy.

The Agent is the real Claude Code against the scripted model; its save goes through the real
`amux mcp` with the turn's delegated credential.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MEMORY_ON, CliResult, HubProcess
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.test_worker import agent_run, cli, start_hub

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

NOTE = "# Review format\nconclusion, evidence, unresolved questions\n"
OPERATOR_TEXT = "operator-secret-phrase-7d1f: the deploy window is Thursday\n"


def ok(result: CliResult) -> Any:
    assert result.returncode == 0, result.stderr
    return result.json()


def revision(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def files_containing(root: Path, needle: bytes) -> list[Path]:
    found = []
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = Path(directory, name)
            try:
                if needle in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


async def history(hub: HubProcess, *args: str) -> list[dict[str, Any]]:
    answer = ok(await cli(hub, "memory", "history", "--json", *args))
    return list(answer["entries"])


async def test_an_agent_save_an_operator_overwrite_restore_forget_and_erase_are_all_accounted_for(
    tmp_path: Path,
) -> None:
    path = "topics/review-format.md"
    script: list[Step] = [
        CallTool(
            "mcp__memory__amux_memory_upsert",
            {"path": path, "content": NOTE, "expected_revision": "absent"},
        ),
        Answer("Saved."),
    ]
    async with FakeModelServer(script) as model:
        hub = start_hub(tmp_path, model.base_url, settings=MEMORY_ON)
        try:
            turn = await agent_run(hub, "--provider", "claude", "Remember our review format")
            assert turn["state"] == "succeeded", turn
            # The turn shows what it saved.
            assert turn["memory"] == [
                {"op": "saved", "path": path, "revision": revision(NOTE), "previous_revision": None}
            ]

            [saved] = await history(hub, path)
            assert saved["action"] == "upsert"
            assert saved["via"] == "mcp"
            assert saved["session_id"] == turn["session_id"]
            assert saved["execution_id"] == turn["execution_id"]
            assert saved["new_revision"] == revision(NOTE)
            assert saved["previous_revision"] is None
            text = (await cli(hub, "memory", "history", path)).stdout
            assert f"session {turn['session_id']}" in text
            assert f"execution {turn['execution_id']}" in text
            assert "by owner via mcp" in text

            # The operator overwrites it from the CLI: logged as cli, the old body kept.
            rewritten = "# Review format\nshort bullet points\n"
            ok(
                await cli(
                    hub,
                    "memory",
                    "upsert",
                    "--json",
                    path,
                    "--expected-revision",
                    revision(NOTE),
                    input=rewritten,
                )
            )
            overwrite = (await history(hub, path))[0]
            assert overwrite["via"] == "cli"
            assert overwrite["session_id"] is None
            assert overwrite["previous_revision"] == revision(NOTE)
            assert overwrite["restorable"] is True
            assert "restorable until" in (await cli(hub, "memory", "history", path)).stdout
            kept = list((hub.home / "memory-history").rglob(revision(NOTE)))
            assert len(kept) == 1
            assert kept[0].read_text() == NOTE
            assert kept[0].stat().st_mode & 0o777 == 0o600
            # History is not memory: a search finds only the current body.
            found = ok(await cli(hub, "memory", "search", "--json", "unresolved"))
            assert found["matches"] == []

            # Restore brings the agent's body back, and is itself logged.
            ok(
                await cli(
                    hub,
                    "memory",
                    "restore",
                    "--json",
                    path,
                    "--revision",
                    revision(NOTE),
                    "--expected-revision",
                    revision(rewritten),
                )
            )
            assert ok(await cli(hub, "memory", "show", "--json", path))["content"] == NOTE
            restored = (await history(hub, path))[0]
            assert restored["action"] == "restore"
            assert restored["new_revision"] == revision(NOTE)
            assert restored["via"] == "cli"

            # A restore against a stale revision is an ordinary conflict.
            stale = await cli(
                hub,
                "memory",
                "restore",
                path,
                "--revision",
                revision(NOTE),
                "--expected-revision",
                revision(rewritten),
            )
            assert stale.returncode != 0
            assert stale.stderr.startswith("error: conflict:"), stale.stderr

            # Forget leaves a restorable copy.
            ok(
                await cli(
                    hub, "memory", "forget", "--json", path, "--expected-revision", revision(NOTE)
                )
            )
            forgot = (await history(hub, path))[0]
            assert forgot["action"] == "forget"
            assert forgot["restorable"] is True
            assert ok(await cli(hub, "memory", "show", "--json", path))["exists"] is False

            # An operator note, overwritten once, then erased with everything else.
            other = "notes/deploy.md"
            ok(
                await cli(
                    hub,
                    "memory",
                    "upsert",
                    "--json",
                    other,
                    "--expected-revision",
                    "absent",
                    input=OPERATOR_TEXT,
                )
            )
            ok(
                await cli(
                    hub,
                    "memory",
                    "upsert",
                    "--json",
                    other,
                    "--expected-revision",
                    revision(OPERATOR_TEXT),
                    input=OPERATOR_TEXT + "and Friday\n",
                )
            )
            assert files_containing(hub.home, b"operator-secret-phrase-7d1f")
            entries_before = len(await history(hub, "--limit", "200"))

            erased = await cli(hub, "memory", "erase", "--json", "--all", "--yes")
            assert erased.returncode == 0, erased.stderr
            receipt = json.loads(erased.stdout)
            # The current notes/deploy.md; the review format was forgotten already.
            assert receipt["documents_removed"] == 1
            # The review format's kept copies (its agent body and the overwritten CLI body)
            # and the note's first body.
            assert receipt["history_copies_removed"] == 3
            assert receipt["log_entries_redacted"] == entries_before
            assert "not erased" in erased.stderr
            assert files_containing(hub.home, b"operator-secret-phrase-7d1f") == []
            # The turn's memory event names the path no more.
            state = sqlite3.connect(hub.home / "state.sqlite3")
            try:
                events = state.execute(
                    "SELECT text FROM execution_events WHERE kind = 'memory'"
                ).fetchall()
            finally:
                state.close()
            assert events
            assert all(json.loads(text)["path"] == "[erased]" for (text,) in events)
            after = await history(hub, "--limit", "200")
            assert {e["path"] for e in after} == {"[erased]"}
            assert after[0]["action"] == "erase"
        finally:
            hub.stop()
