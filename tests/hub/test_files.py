"""Confined file access: links are refused or skipped, never followed; writes are atomic."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

import pytest

from hub.errors import InvalidPath
from hub.files import TEMP_PREFIX, MemoryFiles
from hub.store import MemoryStore

SCOPE = "global"
SECRET = "outside-secret-kiwi"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the memory root that nothing may read or write through a link."""
    place = tmp_path / "outside"
    place.mkdir()
    (place / "a.md").write_text(f"{SECRET}\n")
    (place / "MEMORY.md").write_text(f"{SECRET}\n")
    return place


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    memory = MemoryStore(tmp_path / "memory")
    memory.open()
    (memory.files.root / "global").mkdir()
    return memory


def scope_dir(store: MemoryStore) -> Path:
    return store.files.root / "global"


def snapshot(place: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(place)): p.read_bytes() for p in sorted(place.rglob("*")) if p.is_file()
    }


def revision(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("link", "target_name", "logical"),
    [
        ("linked", "", "linked/a.md"),  # a linked directory at the top of the scope
        ("deep/er/linked", "", "deep/er/linked/a.md"),  # a linked directory further down
        ("note.md", "a.md", "note.md"),  # a linked document
        ("deep/note.md", "a.md", "deep/note.md"),
        ("MEMORY.md", "MEMORY.md", "MEMORY.md"),  # even the entry document
    ],
)
async def test_every_call_refuses_a_path_through_a_link_and_touches_nothing_outside(
    store: MemoryStore, outside: Path, link: str, target_name: str, logical: str
) -> None:
    place = scope_dir(store) / link
    place.parent.mkdir(parents=True, exist_ok=True)
    place.symlink_to(outside / target_name if target_name else outside)
    before = snapshot(outside)
    content_revision = revision(f"{SECRET}\n".encode())

    with pytest.raises(InvalidPath, match="symbolic link"):
        await store.get(SCOPE, logical)
    for expected in ("absent", content_revision):
        with pytest.raises(InvalidPath):
            await store.upsert(SCOPE, logical, "overwritten", expected)
        with pytest.raises(InvalidPath):
            await store.forget(SCOPE, logical, expected)
    if not target_name:
        with pytest.raises(InvalidPath):
            await store.upsert(SCOPE, f"{link}/new.md", "x", "absent")

    assert snapshot(outside) == before
    assert place.is_symlink()
    found = await store.search(SCOPE, SECRET, limit=20)
    assert found.matches == ()
    assert found.scanned_files == 0


async def test_search_skips_links_but_still_finds_real_documents_beside_them(
    store: MemoryStore, outside: Path
) -> None:
    (scope_dir(store) / "real.md").write_text(f"{SECRET} but real\n")
    (scope_dir(store) / "dir-link").symlink_to(outside)
    (scope_dir(store) / "file-link.md").symlink_to(outside / "a.md")
    (scope_dir(store) / "loop").symlink_to(scope_dir(store))
    (scope_dir(store) / "dangling.md").symlink_to(outside / "missing.md")
    result = await store.search(SCOPE, SECRET, limit=20)
    assert [m.path for m in result.matches] == ["real.md"]
    assert result.scanned_files == 1


@pytest.mark.parametrize("prefix", ["dir-link", "dir-link/a.md", "file-link.md"])
async def test_a_path_prefix_through_a_link_finds_nothing_and_reads_nothing(
    store: MemoryStore, outside: Path, prefix: str
) -> None:
    (scope_dir(store) / "dir-link").symlink_to(outside)
    (scope_dir(store) / "file-link.md").symlink_to(outside / "a.md")
    result = await store.search(SCOPE, SECRET, path_prefix=prefix)
    assert (result.matches, result.scanned_files) == ((), 0)


async def test_a_linked_scope_directory_is_never_followed(tmp_path: Path, outside: Path) -> None:
    store = MemoryStore(tmp_path / "memory")
    store.open()
    (store.files.root / "global").symlink_to(outside)
    with pytest.raises(InvalidPath):
        await store.get(SCOPE, "a.md")
    with pytest.raises(InvalidPath):
        await store.upsert(SCOPE, "new.md", "x", "absent")
    with pytest.raises(InvalidPath, match="'global' is a symbolic link"):
        await store.search(SCOPE, SECRET)
    assert snapshot(outside) == {
        "MEMORY.md": f"{SECRET}\n".encode(),
        "a.md": f"{SECRET}\n".encode(),
    }


async def test_a_document_where_a_directory_should_be_is_invalid_path(store: MemoryStore) -> None:
    (scope_dir(store) / "a.md").write_text("plain\n")
    with pytest.raises(InvalidPath):
        await store.get(SCOPE, "a.md/b.md")
    with pytest.raises(InvalidPath):
        await store.upsert(SCOPE, "a.md/b.md", "x", "absent")
    (scope_dir(store) / "dir.md").mkdir()
    with pytest.raises(InvalidPath, match="not a regular document"):
        await store.get(SCOPE, "dir.md")


async def test_a_fifo_named_like_a_document_is_refused_without_blocking(
    store: MemoryStore,
) -> None:
    os.mkfifo(scope_dir(store) / "pipe.md")
    with pytest.raises(InvalidPath, match="regular"):
        await store.get(SCOPE, "pipe.md")
    result = await store.search(SCOPE, "pipe")
    assert (result.matches, result.scanned_files) == ((), 0)


async def test_writes_create_private_directories_and_files_and_leave_no_temp_file(
    store: MemoryStore,
) -> None:
    await store.upsert(SCOPE, "projects/amux/decisions.md", "decided\n", "absent")
    target = scope_dir(store) / "projects/amux/decisions.md"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    leftovers = [p for p in store.files.root.rglob("*") if p.name.startswith(TEMP_PREFIX)]
    assert leftovers == []


def test_a_failed_write_leaves_the_old_document_and_no_temp_file(tmp_path: Path) -> None:
    files = MemoryFiles(tmp_path / "memory")
    files.ensure_root()
    files.write_atomic(("global", "a.md"), b"old\n")
    # A directory in the way makes the final rename fail after the temp file was written.
    (tmp_path / "memory" / "global" / "b.md").mkdir()
    (tmp_path / "memory" / "global" / "b.md" / "child").write_text("x")
    with pytest.raises(OSError):
        files.write_atomic(("global", "b.md"), b"new\n")
    names = os.listdir(tmp_path / "memory" / "global")
    assert sorted(names) == ["a.md", "b.md"]
    assert files.read(("global", "a.md")) == b"old\n"


def test_start_up_sweeps_temp_files_left_by_a_crash_at_any_depth(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    (root / "global" / "deep" / "er").mkdir(parents=True)
    (root / "global" / "keep.md").write_text("kept\n")
    for where in ["global", "global/deep/er", "users"]:
        (root / where).mkdir(parents=True, exist_ok=True)
        (root / where / f"{TEMP_PREFIX}deadbeef").write_text("half a docu")
    store = MemoryStore(root)
    store.open()
    assert list(root.rglob(f"{TEMP_PREFIX}*")) == []
    assert (root / "global" / "keep.md").read_text() == "kept\n"


def test_the_memory_root_must_not_be_a_link(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "memory").symlink_to(outside)
    with pytest.raises(InvalidPath):
        MemoryFiles(tmp_path / "memory").ensure_root()


def test_a_scan_never_returns_stale_content_after_edits(tmp_path: Path) -> None:
    files = MemoryFiles(tmp_path / "memory")
    files.ensure_root()
    scope = ("global",)
    files.write_atomic(scope + ("a.md",), b"first version\n")
    target = tmp_path / "memory" / "global" / "a.md"
    # Age the file so the scan may cache it, as it would a document not touched for a while.
    old = time.time_ns() - 10_000_000_000
    os.utime(target, ns=(old, old))
    assert [d.data for d in files.walk(scope)] == [b"first version\n"]
    assert [d.data for d in files.walk(scope)] == [b"first version\n"]

    files.write_atomic(scope + ("a.md",), b"second version\n")
    assert [d.data for d in files.walk(scope)] == [b"second version\n"]

    # An edit in place by another tool, same size, same inode.
    os.utime(target, ns=(old, old))
    assert [d.data for d in files.walk(scope)] == [b"second version\n"]
    with open(target, "r+b") as handle:
        handle.write(b"SECOND")
    assert [d.data for d in files.walk(scope)] == [b"SECOND version\n"]
