"""A document read once is answered from memory while the watch saw no change, and never after
one: an edit outside the Hub, a component swapped for a link, a directory renamed or removed,
or the Hub's own write. Confinement stays as strict as the walk: a link is refused, not
followed, however the path was read before."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.errors import Conflict, InvalidPath
from hub.store import MemoryStore

SCOPE = "global"
PATH = "notes/deploy.md"
KEY = ("global", "notes", "deploy.md")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    memory = MemoryStore(tmp_path / "memory")
    memory.open()
    yield memory
    memory.close()


def on_disk(store: MemoryStore, path: str = PATH) -> Path:
    return store.files.root / "global" / path


async def read_once(store: MemoryStore) -> str:
    await store.upsert(SCOPE, PATH, "we deploy on fridays\n", "absent")
    first = await store.get(SCOPE, PATH)
    assert first.content == "we deploy on fridays\n"
    assert store.reads.kept(KEY)
    return first.revision


async def test_an_edit_outside_the_hub_is_read_at_once(store: MemoryStore) -> None:
    before = await read_once(store)
    with on_disk(store).open("r+b") as file:
        file.write(b"we deploy on mondays\n")
    after = await store.get(SCOPE, PATH)
    assert after.content == "we deploy on mondays\n"
    assert after.revision != before
    # The write that follows is checked against what is there now, not what was read first.
    with pytest.raises(Conflict):
        await store.upsert(SCOPE, PATH, "fridays again\n", before)
    assert (await store.upsert(SCOPE, PATH, "fridays again\n", after.revision)).changed


async def test_the_hubs_own_write_is_read_at_once(store: MemoryStore) -> None:
    revision = await read_once(store)
    await store.upsert(SCOPE, PATH, "we deploy on mondays\n", revision)
    assert (await store.get(SCOPE, PATH)).content == "we deploy on mondays\n"
    await store.forget(SCOPE, PATH, (await store.get(SCOPE, PATH)).revision)
    assert not (await store.get(SCOPE, PATH)).exists


async def test_a_directory_swapped_for_a_link_is_refused_after_a_read(
    store: MemoryStore, tmp_path: Path
) -> None:
    await read_once(store)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "deploy.md").write_text("outside the scope\n")
    notes = on_disk(store, "notes")
    shutil.rmtree(notes)
    os.symlink(elsewhere, notes)
    with pytest.raises(InvalidPath, match="symbolic link"):
        await store.get(SCOPE, PATH)


async def test_the_document_swapped_for_a_link_is_refused_after_a_read(
    store: MemoryStore, tmp_path: Path
) -> None:
    await read_once(store)
    outside = tmp_path / "outside.md"
    outside.write_text("outside the scope\n")
    os.unlink(on_disk(store))
    os.symlink(outside, on_disk(store))
    with pytest.raises(InvalidPath, match="symbolic link"):
        await store.get(SCOPE, PATH)


async def test_a_renamed_or_removed_directory_is_seen(store: MemoryStore) -> None:
    await read_once(store)
    os.rename(on_disk(store, "notes"), on_disk(store, "archive"))
    assert not (await store.get(SCOPE, PATH)).exists
    assert (await store.get(SCOPE, "archive/deploy.md")).content == "we deploy on fridays\n"
    shutil.rmtree(on_disk(store, "archive"))
    assert not (await store.get(SCOPE, "archive/deploy.md")).exists


async def test_a_scope_directory_renamed_over_is_seen(store: MemoryStore) -> None:
    await read_once(store)
    replacement = store.files.root / "replacement"
    (replacement / "notes").mkdir(parents=True)
    (replacement / "notes" / "deploy.md").write_text("a whole new scope\n")
    shutil.rmtree(store.files.root / "global")
    os.rename(replacement, store.files.root / "global")
    assert (await store.get(SCOPE, PATH)).content == "a whole new scope\n"


async def test_pages_of_a_kept_document_are_each_right(store: MemoryStore) -> None:
    text = "".join(f"line {n}\n" for n in range(1, 41))
    await store.upsert(SCOPE, PATH, text, "absent")
    whole = await store.get(SCOPE, PATH)
    assert whole.content == text
    middle = await store.get(SCOPE, PATH, start_line=3, end_line=4)
    assert middle.content == "line 3\nline 4\n"
    assert middle.revision == whole.revision
    assert (await store.get(SCOPE, PATH)).content == text


async def test_past_the_watch_limit_every_read_walks_the_path(tmp_path: Path) -> None:
    # The root, the scope and its directory are three; one fewer can be watched.
    store = MemoryStore(tmp_path / "memory", max_watches=2)
    store.open()
    try:
        await store.upsert(SCOPE, PATH, "we deploy on fridays\n", "absent")
        assert (await store.get(SCOPE, PATH)).content == "we deploy on fridays\n"
        assert not store.reads.kept(KEY)
        on_disk(store).write_text("we deploy on mondays\n")
        assert (await store.get(SCOPE, PATH)).content == "we deploy on mondays\n"
    finally:
        store.close()
