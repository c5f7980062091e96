"""Searches keep a scope between calls while the watch saw no change, and never miss an edit
made outside the Hub: in place, renamed over, deleted, in a new directory, or in a directory
moved in. When the watch cannot be had or its queue overflowed, searches check every file."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.limits import DEFAULT_LIMITS
from hub.store import MemoryStore
from hub.watch import WATCH, Listener, TreeWatch

SCOPE = "global"
SCOPE_PARTS = ("global",)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    memory = MemoryStore(tmp_path / "memory")
    memory.open()
    yield memory
    memory.close()


def scope_dir(store: MemoryStore) -> Path:
    return store.files.root / "global"


async def fill(store: MemoryStore) -> None:
    documents = {
        "notes/deploy.md": "# Deploy\nwe deploy on fridays\n",
        "notes/review.md": "# Review\nevery change is reviewed\n",
        "decisions/cache.md": "# Cache\nthe cache stays in memory\n",
    }
    for path, text in documents.items():
        await store.upsert(SCOPE, path, text, "absent")


async def paths_found(store: MemoryStore, query: str, prefix: str | None = None) -> list[str]:
    found = await store.search(SCOPE, query, prefix, 20)
    return sorted(match.path for match in found.matches)


async def kept_after_a_search(store: MemoryStore) -> None:
    await fill(store)
    assert await paths_found(store, "fridays") == ["notes/deploy.md"]
    # The walk just made is what the next search uses.
    assert store.corpora.kept(SCOPE_PARTS)


def edit_in_place(root: Path) -> None:
    with (root / "notes" / "deploy.md").open("r+b") as file:
        # Same size, so only the watch (not the file's size) can tell.
        file.write(b"# Deploy\nwe deploy on mondays\n")


def rename_over(root: Path) -> None:
    temp = root / "notes" / "incoming.tmp"
    temp.write_bytes(b"# Deploy\nwe deploy on mondays now\n")
    os.rename(temp, root / "notes" / "deploy.md")


def delete_and_add(root: Path) -> None:
    (root / "notes" / "deploy.md").unlink()
    (root / "notes" / "mondays.md").write_bytes(b"# Mondays\nthe new deploy day\n")


def new_directory(root: Path) -> None:
    (root / "notes" / "deploy.md").unlink()
    (root / "weekly").mkdir()
    (root / "weekly" / "plan.md").write_bytes(b"# Plan\nwe deploy on mondays\n")


def directory_moved_in(root: Path) -> None:
    (root / "notes" / "deploy.md").unlink()
    outside = root.parent.parent / "elsewhere"
    outside.mkdir()
    (outside / "plan.md").write_bytes(b"# Plan\nwe deploy on mondays\n")
    os.rename(outside, root / "weekly")


EDITS: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "in place": (edit_in_place, ["notes/deploy.md"]),
    "renamed over": (rename_over, ["notes/deploy.md"]),
    "deleted and added": (delete_and_add, ["notes/mondays.md"]),
    "new directory": (new_directory, ["weekly/plan.md"]),
    "directory moved in": (directory_moved_in, ["weekly/plan.md"]),
}


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
async def test_an_edit_outside_the_hub_shows_in_the_next_search(
    store: MemoryStore, edit: str
) -> None:
    await kept_after_a_search(store)
    change, expected = EDITS[edit]
    change(scope_dir(store))
    assert await paths_found(store, "mondays") == expected
    assert await paths_found(store, "fridays") == []
    # Walked again, the scope is kept again and stays right.
    assert store.corpora.kept(SCOPE_PARTS)
    assert await paths_found(store, "mondays") == expected


async def test_a_directory_renamed_inside_the_scope_is_found_under_its_new_name(
    store: MemoryStore,
) -> None:
    await kept_after_a_search(store)
    root = scope_dir(store)
    os.rename(root / "notes", root / "archive")
    assert await paths_found(store, "fridays") == ["archive/deploy.md"]
    # The moved directory is still watched, under its new name.
    edit_in_place_at = root / "archive" / "deploy.md"
    edit_in_place_at.write_bytes(b"# Deploy\nwe deploy on mondays\n")
    assert await paths_found(store, "mondays") == ["archive/deploy.md"]


async def test_the_hubs_own_writes_show_in_the_next_search(store: MemoryStore) -> None:
    await kept_after_a_search(store)
    current = await store.get(SCOPE, "notes/deploy.md")
    await store.upsert(SCOPE, "notes/deploy.md", "# Deploy\nmondays now\n", current.revision)
    assert await paths_found(store, "mondays") == ["notes/deploy.md"]
    current = await store.get(SCOPE, "notes/deploy.md")
    await store.forget(SCOPE, "notes/deploy.md", current.revision)
    assert await paths_found(store, "mondays") == []


async def test_a_narrowed_search_of_a_kept_scope_sees_only_its_prefix(store: MemoryStore) -> None:
    await kept_after_a_search(store)
    assert await paths_found(store, "the every", "decisions") == ["decisions/cache.md"]
    assert await paths_found(store, "deploy", "notes/deploy.md") == ["notes/deploy.md"]
    assert await paths_found(store, "deploy", "nothing-here") == []
    found = await store.search(SCOPE, "the", "notes", 20)
    assert found.scanned_files == 2 and not found.incomplete


async def test_the_scope_directory_made_after_a_search_is_seen(store: MemoryStore) -> None:
    assert await paths_found(store, "fridays") == []
    scope_dir(store).mkdir()
    (scope_dir(store) / "deploy.md").write_bytes(b"we deploy on fridays\n")
    assert await paths_found(store, "fridays") == ["deploy.md"]


async def test_past_the_watch_limit_every_search_checks_every_file(tmp_path: Path) -> None:
    # The root, the scope and its two directories are four; one fewer can be watched.
    store = MemoryStore(tmp_path / "memory", max_watches=3)
    store.open()
    try:
        await fill(store)
        assert await paths_found(store, "fridays") == ["notes/deploy.md"]
        assert not store.corpora.kept(SCOPE_PARTS)
        edit_in_place(scope_dir(store))
        assert await paths_found(store, "mondays") == ["notes/deploy.md"]
        new_directory(scope_dir(store))
        assert await paths_found(store, "mondays") == ["weekly/plan.md"]
    finally:
        store.close()


def queue_limit() -> int:
    return int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())


async def test_an_overflowed_watch_falls_back_to_checking_every_file(store: MemoryStore) -> None:
    await kept_after_a_search(store)
    root = scope_dir(store)
    overflows = WATCH.overflows
    # Alternating between two files, so the kernel cannot merge the events into one.
    first = os.open(root / "notes" / "churn-a.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    second = os.open(root / "notes" / "churn-b.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(queue_limit() // 2 + 8):
            os.write(first, b"x")
            os.write(second, b"x")
    finally:
        os.close(first)
        os.close(second)
    edit_in_place(root)
    assert await paths_found(store, "mondays") == ["notes/deploy.md"]
    assert WATCH.overflows > overflows
    # After the walk that followed, the scope is kept again.
    assert store.corpora.kept(SCOPE_PARTS)
    rename_over(root)
    assert await paths_found(store, "now") == ["notes/deploy.md"]


async def test_a_document_with_a_second_name_is_never_trusted_unchecked(
    store: MemoryStore, tmp_path: Path
) -> None:
    await fill(store)
    elsewhere = tmp_path / "elsewhere.md"
    os.link(scope_dir(store) / "notes" / "deploy.md", elsewhere)
    assert await paths_found(store, "fridays") == ["notes/deploy.md"]
    assert not store.corpora.kept(SCOPE_PARTS)
    with elsewhere.open("r+b") as file:
        file.write(b"# Deploy\nwe deploy on mondays\n")
    assert await paths_found(store, "mondays") == ["notes/deploy.md"]


_WORDS = ["alpha", "Beta", "GAMMA", "发布", "流程", "ÜBER", "über", "delta", "#", "# alpha"]


@settings(max_examples=60, deadline=None)
@given(
    docs=st.dictionaries(
        st.tuples(
            st.lists(st.sampled_from(["a", "beta", "流程"]), max_size=2),
            st.sampled_from(["x.md", "alpha.md", "notes.md", "y.txt"]),
        ).map(lambda path: "/".join((*path[0], path[1]))),
        st.lists(st.lists(st.sampled_from(_WORDS), max_size=6), max_size=6),
        max_size=10,
    ),
    query=st.lists(st.sampled_from(_WORDS), min_size=1, max_size=3),
    prefix=st.sampled_from([None, "a", "beta/x.md", "流程"]),
    scan_files=st.sampled_from([3, 1024]),
)
async def test_a_kept_scope_answers_exactly_as_the_walk_does(
    docs: dict[str, list[list[str]]], query: list[str], prefix: str | None, scan_files: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        limits = dataclasses.replace(DEFAULT_LIMITS, scan_files=scan_files)
        store = MemoryStore(Path(tmp) / "memory", limits)
        store.open()
        try:
            for path, lines in docs.items():
                file = store.files.root / "global" / path
                file.parent.mkdir(parents=True, exist_ok=True)
                file.write_text("\n".join(" ".join(words) for words in lines) + "\n")
            text = " ".join(query)
            walked = (await store.search(SCOPE, text, None, 20)).to_wire()
            assert store.corpora.kept(SCOPE_PARTS)
            assert (await store.search(SCOPE, text, None, 20)).to_wire() == walked
            if prefix is not None:
                kept = (await store.search(SCOPE, text, prefix, 20)).to_wire()
                store.corpora.close()
                assert (await store.search(SCOPE, text, prefix, 20)).to_wire() == kept
        finally:
            store.close()


def test_a_refused_watch_is_logged_once_not_on_every_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    watch = TreeWatch()
    listener = Listener()
    # The kernel refuses a watch on what is not a directory, as it refuses one past its limit.
    not_a_directory = tmp_path / "plain.md"
    not_a_directory.write_text("x")
    fd = os.open(not_a_directory, os.O_RDONLY)
    try:
        with caplog.at_level("WARNING", logger="amux.hub.watch"):
            assert [watch.add(listener, fd, ("plain.md",)) for _ in range(5)] == [False] * 5
    finally:
        os.close(fd)
    told = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(told) == 1 and "memory watch refused (Not a directory)" in told[0]
