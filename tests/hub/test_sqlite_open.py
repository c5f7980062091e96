"""Opening one SQLite file from many hands at once, as the Hub, the bot, the worker and a local
command do when a registry or database is first made."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hub.sqlite import connect


def test_many_openers_of_a_new_file_all_get_it_in_wal_mode(tmp_path: Path) -> None:
    # A new file switched to WAL by several openers at once used to fail one of them with
    # "database is locked" in a few rounds of a hundred; each opener must wait its turn instead.
    def open_and_write(path: Path, n: int) -> str:
        db = connect(path, durable=False, timeout=30)
        try:
            db.execute("CREATE TABLE IF NOT EXISTS seen(n INTEGER)")
            db.execute("INSERT INTO seen VALUES (?)", (n,))
            return str(db.execute("PRAGMA journal_mode").fetchone()[0])
        finally:
            db.close()

    with ThreadPoolExecutor(8) as pool:
        for round_ in range(150):
            path = tmp_path / f"round-{round_}.sqlite3"
            modes = list(pool.map(lambda n, p=path: open_and_write(p, n), range(8)))
            assert modes == ["wal"] * 8
            db = connect(path, durable=False)
            assert db.execute("SELECT count(*) FROM seen").fetchone()[0] == 8
            db.close()
