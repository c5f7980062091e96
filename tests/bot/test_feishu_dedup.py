import contextlib
import sqlite3
import time
from pathlib import Path

from bot.feishu.dedup import SqliteEventDedup


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_an_event_id_is_new_only_once(tmp_path: Path) -> None:
    dedup = SqliteEventDedup(tmp_path / "state.sqlite3")
    try:
        assert await dedup.first_time("ev1") is True
        assert await dedup.first_time("ev1") is False
        assert await dedup.first_time("ev2") is True
    finally:
        dedup.close()


async def test_ids_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    first = SqliteEventDedup(path)
    await first.first_time("ev1")
    first.close()
    second = SqliteEventDedup(path)
    try:
        assert await second.first_time("ev1") is False
    finally:
        second.close()


async def test_ids_are_kept_beyond_feishus_retry_window_then_pruned(tmp_path: Path) -> None:
    clock = Clock()
    dedup = SqliteEventDedup(
        tmp_path / "d.sqlite3", retention_seconds=24 * 3600, prune_every_seconds=60, clock=clock
    )
    try:
        await dedup.first_time("old")
        clock.now += 7 * 3600 + 60  # Feishu's last retry comes about 7 h later
        assert await dedup.first_time("old") is False
        clock.now += 18 * 3600  # past 24 h since first seen: pruned lazily on the next insert
        assert await dedup.first_time("new") is True
        assert await dedup.count() == 1
        assert await dedup.first_time("old") is True
    finally:
        dedup.close()


async def test_a_message_id_is_new_once_across_restarts_and_apart_from_event_ids(
    tmp_path: Path,
) -> None:
    path = tmp_path / "d.sqlite3"
    first = SqliteEventDedup(path)
    assert await first.first_message("om_1") is True
    assert await first.first_message("om_1") is False
    # An event id that happens to equal a message id is another record.
    assert await first.first_time("om_1") is True
    first.close()
    second = SqliteEventDedup(path)
    try:
        assert await second.first_message("om_1") is False
        assert await second.first_message("om_2") is True
    finally:
        second.close()


async def test_a_file_of_the_first_version_keeps_its_event_ids_and_learns_message_ids(
    tmp_path: Path,
) -> None:
    path = tmp_path / "d.sqlite3"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.executescript(
            "CREATE TABLE feishu_events (event_id TEXT PRIMARY KEY, seen_at REAL NOT NULL);"
            "PRAGMA user_version = 1;"
        )
        db.execute("INSERT INTO feishu_events VALUES ('ev_before', ?)", (time.time(),))
    dedup = SqliteEventDedup(path)
    try:
        assert await dedup.first_time("ev_before") is False
        assert await dedup.first_message("om_1") is True
        assert await dedup.first_message("om_1") is False
    finally:
        dedup.close()
