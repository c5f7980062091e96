"""A full or read-only disk under the Hub: a typed answer naming the cause, nothing torn, reads on.

The memory root is a real tmpfs of 64 KiB (or a read-only bind mount) under a real Hub served
over loopback; the state database is a real SQLite file on a full tmpfs.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.service.app import create_app
from hub.config import OWNER_TOKEN_FILE, HubSettings
from hub.errors import StorageFull, StorageUnavailable
from hub.files import TEMP_PREFIX
from hub.state import State
from tests.conftest import running_hub, save_settings
from tests.hub.test_memory_history import Caller
from tests.tmpfs import fill, read_only, tmpfs

Client = TestClient[Any, Any]
FULL = "the memory disk is full (No space left on device)"
READ_ONLY = "the memory disk is read-only (Read-only file system)"


class Memory(Caller):
    async def upsert(self, path: str, content: str, expected: str) -> tuple[int, dict[str, Any]]:
        return await self.call(
            "memory.upsert", path=path, content=content, expected_revision=expected
        )

    async def get(self, path: str) -> dict[str, Any]:
        status, body = await self.call("memory.get", path=path)
        assert status == 200, body
        return body

    async def storage_errors(self) -> dict[tuple[str, str], float]:
        text = await (await self.client.get("/metrics")).text()
        found = re.findall(
            r'^amux_storage_errors_total\{cause="(\w+)",disk="(\w+)"\} ([0-9.]+)$', text, re.M
        )
        return {(disk, cause): float(value) for cause, disk, value in found}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "amux-home"
    save_settings(home, {"memory.enabled": True})
    return home


@pytest.fixture
def small_memory_disk(home: Path) -> Iterator[Path]:
    with tmpfs(home / "memory", "64k") as root:
        yield root


async def served(home: Path) -> AsyncIterator[Memory]:
    app = create_app(HubSettings(home=home))
    async with TestClient(TestServer(app)) as client:
        yield Memory(client, (home / OWNER_TOKEN_FILE).read_text().strip())


def temp_files(root: Path) -> list[str]:
    return [
        os.path.join(directory, name)
        for directory, _dirs, names in os.walk(root)
        for name in names
        if name.startswith(TEMP_PREFIX)
    ]


async def test_a_full_memory_disk_answers_storage_unavailable_and_keeps_every_document(
    home: Path, small_memory_disk: Path
) -> None:
    async for memory in served(home):
        status, kept = await memory.upsert("notes/keep.md", "kept\n", "absent")
        assert status == 200, kept
        refusal: dict[str, Any] = {}
        for n in range(64):
            status, refusal = await memory.upsert(f"fill/{n}.md", "x" * 8192 + "\n", "absent")
            if status != 200:
                break
        assert status == 507, refusal
        assert refusal == {
            "error": {
                "code": "storage_unavailable",
                "message": FULL,
                "cause": "no_space",
                "disk": "memory",
            }
        }
        # An overwrite that does not fit leaves the old document as it was.
        status, again = await memory.upsert("notes/keep.md", "y" * 16384, kept["revision"])
        assert status == 507 and again["error"]["message"] == FULL
        got = await memory.get("notes/keep.md")
        assert (got["content"], got["revision"]) == ("kept\n", kept["revision"])
        assert temp_files(small_memory_disk) == []
        assert await memory.storage_errors() == {("memory", "no_space"): 2.0}
        # The change log shows the writes that were made, not the two that were refused.
        status, log = await memory.call("memory.history")
        assert status == 200, log
        logged = [(e["path"], e["new_revision"]) for e in log["entries"]]
        assert ("notes/keep.md", kept["revision"]) in logged
        assert len(logged) == n + 1, logged
        assert not any(path == f"fill/{n}.md" for path, _ in logged)
        assert [path for path, _ in logged].count("notes/keep.md") == 1
        status, found = await memory.call("memory.search", query="kept")
        assert status == 200 and [m["path"] for m in found["matches"]] == ["notes/keep.md"]

        # Once there is room again, writes succeed.
        first = await memory.get("fill/0.md")
        status, _ = await memory.call(
            "memory.forget", path="fill/0.md", expected_revision=first["revision"]
        )
        assert status == 200
        status, saved = await memory.upsert("notes/keep.md", "kept, then more\n", kept["revision"])
        assert status == 200, saved
        assert (await memory.get("notes/keep.md"))["content"] == "kept, then more\n"


async def test_a_read_only_memory_disk_answers_storage_unavailable_and_reads_go_on(
    home: Path, small_memory_disk: Path
) -> None:
    async for memory in served(home):
        status, kept = await memory.upsert("notes/keep.md", "kept\n", "absent")
        assert status == 200, kept
        with read_only(small_memory_disk / "global"):
            for status, body in (
                await memory.upsert("notes/new.md", "new\n", "absent"),
                await memory.upsert("notes/keep.md", "changed\n", kept["revision"]),
                await memory.call(
                    "memory.forget", path="notes/keep.md", expected_revision=kept["revision"]
                ),
            ):
                assert status == 503, body
                assert body["error"] == {
                    "code": "storage_unavailable",
                    "message": READ_ONLY,
                    "cause": "read_only",
                    "disk": "memory",
                }
            got = await memory.get("notes/keep.md")
            assert (got["content"], got["revision"]) == ("kept\n", kept["revision"])
            assert (await memory.get("notes/new.md"))["exists"] is False
            assert await memory.storage_errors() == {("memory", "read_only"): 3.0}
        assert temp_files(small_memory_disk) == []


def test_a_full_state_database_disk_refuses_the_write_whole_and_then_recovers(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "state", "1m") as disk:
        state = State(disk / "state.sqlite3")
        try:
            state.save_setting("memory.enabled", True)
            filler = fill(disk)
            with pytest.raises(StorageUnavailable) as refused:
                state.save_setting("feishu.note", "z" * 65536)
            assert type(refused.value) is StorageFull
            assert refused.value.cause == "no_space" and refused.value.disk == "state"
            assert refused.value.message.startswith("the state database's disk is full (")
            assert str(disk) not in refused.value.message
            assert not state.db.in_transaction
            assert state.saved_settings() == {"memory.enabled": True}
            filler.unlink()
            state.save_setting("feishu.note", "z" * 65536)
            assert state.saved_settings()["feishu.note"] == "z" * 65536
        finally:
            state.close()


@pytest.mark.e2e
def test_the_cli_says_in_one_line_that_the_memory_disk_is_full(home: Path) -> None:
    with tmpfs(home / "memory", "64k"), running_hub(home) as hub:
        big = "x" * 63000 + "\n"
        done = hub.cli("memory", "upsert", "big.md", "--expected-revision", "absent", input=big)
        assert done.returncode == 6
        assert done.stderr == f"error: storage_unavailable: {FULL}\n"
        assert "the memory disk is full" in hub.log()
