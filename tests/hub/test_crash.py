"""Crash safety: SIGKILL the Hub during heavy upserts, restart it, and find only whole documents.

Every document states its own sequence number and ends with the SHA-256 of everything above that
line, so a torn or mixed write is visible in the content itself, independent of the Hub's answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hub.cli import export_document
from hub.client import HubClient
from hub.errors import Unavailable
from hub.files import TEMP_PREFIX
from tests.conftest import HubProcess

pytestmark = pytest.mark.e2e

WRITERS = 6
DOCS_PER_WRITER = 3
ROUNDS = 5
ACKS_BEFORE_KILL = 12
CHECK_LINE = "sha256-of-above: "


def compose(path: str, seq: int, rng: random.Random) -> str:
    lines = [f"# {path}", f"seq: {seq}"]
    size = rng.randrange(1_000, 60_000)
    word = f"payload-{seq}-"
    lines.append((word * (size // len(word) + 1))[:size])
    body = "\n".join(lines) + "\n"
    return body + CHECK_LINE + hashlib.sha256(body.encode()).hexdigest() + "\n"


def self_consistent(content: str) -> bool:
    body, sep, check = content.rpartition(CHECK_LINE)
    return bool(sep) and check == hashlib.sha256(body.encode()).hexdigest() + "\n"


@dataclass
class History:
    """What was sent for one document, and the newest version the Hub acknowledged."""

    attempted: list[str] = field(default_factory=list)
    acknowledged: int = -1


@dataclass
class Run:
    histories: dict[str, History]
    acks: int = 0
    enough: asyncio.Event = field(default_factory=asyncio.Event)


async def writer(hub: HubClient, paths: list[str], run: Run, rng: random.Random) -> None:
    """Rewrite its own documents until the Hub disappears."""
    try:
        while True:
            for path in paths:
                current = await hub.memory_get(path, end_line=1)
                history = run.histories[path]
                content = compose(path, len(history.attempted), rng)
                history.attempted.append(content)
                await hub.memory_upsert(path, content, current["revision"])
                history.acknowledged = len(history.attempted) - 1
                run.acks += 1
                if run.acks >= ACKS_BEFORE_KILL:
                    run.enough.set()
    except Unavailable:
        return


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(TEMP_PREFIX)]


def kill_mid_write(hub: HubProcess, root: Path, patience: float = 2.0) -> None:
    """SIGKILL the Hub the moment a temp file shows (a write between create and rename).

    The writers keep writing, so one usually shows within milliseconds; after ``patience``
    seconds the Hub is killed anyway, wherever it is.
    """
    assert hub.proc is not None
    directories = [root / "global" / "docs" / f"w{w}" for w in range(WRITERS)]
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        if any(
            name.startswith(TEMP_PREFIX)
            for directory in directories
            if directory.is_dir()
            for name in os.listdir(directory)
        ):
            break
    hub.proc.kill()


async def test_sigkill_during_heavy_upserts_leaves_only_complete_documents(
    hub_process: HubProcess,
) -> None:
    await asyncio.to_thread(hub_process.enable_memory)
    memory_root = hub_process.home / "memory"
    paths = [f"docs/w{w}/d{d}.md" for w in range(WRITERS) for d in range(DOCS_PER_WRITER)]
    histories = {path: History() for path in paths}
    rng = random.Random(2)
    temps_seen_after_kill = 0

    for round_number in range(ROUNDS):
        run = Run(histories)
        clients = [HubClient(hub_process.url, hub_process.owner_token) for _ in range(WRITERS)]
        tasks = [
            asyncio.create_task(
                writer(client, paths[w * DOCS_PER_WRITER : (w + 1) * DOCS_PER_WRITER], run, rng)
            )
            for w, client in enumerate(clients)
        ]
        try:
            await asyncio.wait_for(run.enough.wait(), timeout=60)
            assert hub_process.proc is not None
            await asyncio.to_thread(kill_mid_write, hub_process, memory_root)
            await asyncio.to_thread(hub_process.proc.wait)
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*(client.close() for client in clients))
        temps_seen_after_kill += len(temp_files(memory_root))
        if round_number == 0:
            # Make sure the start-up sweep has something to do at least once.
            (memory_root / "global" / "docs" / f"{TEMP_PREFIX}planted").write_bytes(b"# half")
        await asyncio.to_thread(hub_process.start)

    assert temp_files(memory_root) == []
    async with HubClient(hub_process.url, hub_process.owner_token) as hub:
        for path, history in histories.items():
            page = await hub.memory_get(path, end_line=1)
            if not page["exists"]:
                assert history.acknowledged == -1, f"{path}: an acknowledged write was lost"
                continue
            content = await export_document(hub, path)
            data = content.encode()
            assert page["revision"] == hashlib.sha256(data).hexdigest(), path
            assert self_consistent(content), f"{path} is torn"
            assert content in history.attempted, f"{path} holds a version never sent"
            index = history.attempted.index(content)
            assert index >= history.acknowledged, f"{path}: an acknowledged write was lost"
        found = await hub.memory_search(CHECK_LINE.strip(), limit=20)
        assert not found["incomplete"]
        assert {m["path"] for m in found["matches"]} <= set(paths)
        assert all(not m["path"].rsplit("/", 1)[-1].startswith(".") for m in found["matches"])
    assert sum(h.acknowledged + 1 for h in histories.values()) >= ROUNDS * ACKS_BEFORE_KILL
    print(f"temp files found right after the kills: {temps_seen_after_kill}")
