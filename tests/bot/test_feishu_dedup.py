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
