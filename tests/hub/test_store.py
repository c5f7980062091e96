"""The memory store: revisions, conditional writes, quotas and the search scan budget."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from hub.errors import Conflict, InvalidArgument, InvalidPath, QuotaExceeded
from hub.limits import KIB, MIB, Limits
from hub.paths import principal_scope
from hub.store import MemoryStore

SCOPE = "global"


def make_store(root: Path, limits: Limits | None = None, **kwargs: object) -> MemoryStore:
    store = MemoryStore(root / "memory", limits or Limits(), **kwargs)  # type: ignore[arg-type]
    store.open()
    return store


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    return make_store(tmp_path)


def on_disk(store: MemoryStore, path: str, scope_dir: str = "global") -> Path:
    return store.files.root / scope_dir / path


def plant(store: MemoryStore, path: str, data: bytes | str, scope_dir: str = "global") -> None:
    """Put a file in place the way an offline editor would, bypassing the store."""
    target = on_disk(store, path, scope_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data.encode() if isinstance(data, str) else data)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- revisions and conditional writes -------------------------------------------------------------


async def test_revision_is_the_sha256_of_the_file_bytes(store: MemoryStore) -> None:
    created = await store.upsert(SCOPE, "topics/a.md", "# A\n发布流程\n", "absent")
    data = on_disk(store, "topics/a.md").read_bytes()
    assert data == "# A\n发布流程\n".encode()
    assert created.to_wire() == {"path": "topics/a.md", "revision": sha(data)}
    assert (await store.get(SCOPE, "topics/a.md")).revision == sha(data)
    plant(store, "topics/a.md", b"edited offline\n")
    assert (await store.get(SCOPE, "topics/a.md")).revision == sha(b"edited offline\n")


async def test_replace_needs_the_current_revision(store: MemoryStore) -> None:
    first = await store.upsert(SCOPE, "a.md", "one", "absent")
    second = await store.upsert(SCOPE, "a.md", "two", first.revision)
    assert on_disk(store, "a.md").read_text() == "two"
    with pytest.raises(Conflict) as caught:
        await store.upsert(SCOPE, "a.md", "three", first.revision)
    assert caught.value.observed_revision == second.revision
    assert caught.value.to_wire()["error"]["observed_revision"] == second.revision
    assert on_disk(store, "a.md").read_text() == "two"


async def test_creating_an_existing_document_conflicts_with_its_revision(
    store: MemoryStore,
) -> None:
    created = await store.upsert(SCOPE, "a.md", "one", "absent")
    with pytest.raises(Conflict) as caught:
        await store.upsert(SCOPE, "a.md", "other", "absent")
    assert caught.value.observed_revision == created.revision


async def test_replacing_a_missing_document_conflicts_with_absent(store: MemoryStore) -> None:
    with pytest.raises(Conflict) as caught:
        await store.upsert(SCOPE, "a.md", "x", sha(b"whatever"))
    assert caught.value.observed_revision == "absent"
    assert not on_disk(store, "a.md").exists()


async def test_writing_the_same_content_again_keeps_the_revision(store: MemoryStore) -> None:
    created = await store.upsert(SCOPE, "a.md", "same", "absent")
    again = await store.upsert(SCOPE, "a.md", "same", created.revision)
    assert again.to_wire() == created.to_wire()


@pytest.mark.parametrize("expected", ["ABSENT", "", "abc", "A" * 64, "g" * 64, None, 1])
async def test_malformed_expected_revisions_are_invalid_argument(
    store: MemoryStore, expected: object
) -> None:
    with pytest.raises(InvalidArgument):
        await store.upsert(SCOPE, "a.md", "x", expected)
    assert not on_disk(store, "a.md").exists()


@pytest.mark.parametrize("content", ["bad \udcff surrogate", "\ud800", b"bytes", None, 5])
async def test_content_that_is_not_utf8_text_is_rejected_and_nothing_written(
    store: MemoryStore, content: object
) -> None:
    with pytest.raises(InvalidArgument):
        await store.upsert(SCOPE, "a.md", content, "absent")
    assert not on_disk(store, "a.md").exists()
    assert not any(store.files.root.rglob("*.md"))


async def test_forget_deletes_only_at_the_expected_revision(store: MemoryStore) -> None:
    created = await store.upsert(SCOPE, "a.md", "one", "absent")
    with pytest.raises(Conflict) as caught:
        await store.forget(SCOPE, "a.md", sha(b"stale"))
    assert caught.value.observed_revision == created.revision
    assert on_disk(store, "a.md").exists()
    assert (await store.forget(SCOPE, "a.md", created.revision)).to_wire() == {
        "path": "a.md",
        "already_absent": False,
    }
    assert not on_disk(store, "a.md").exists()
    assert (await store.get(SCOPE, "a.md")).exists is False


async def test_forgetting_a_missing_document_reports_already_absent(store: MemoryStore) -> None:
    result = await store.forget(SCOPE, "gone/never.md", sha(b"x"))
    assert result.to_wire() == {"path": "gone/never.md", "already_absent": True}


async def test_forget_removes_the_directories_it_empties_but_keeps_the_scope(
    store: MemoryStore,
) -> None:
    deep = await store.upsert(SCOPE, "a/b/c/deep.md", "deep", "absent")
    await store.upsert(SCOPE, "a/kept.md", "kept", "absent")
    await store.forget(SCOPE, "a/b/c/deep.md", deep.revision)
    assert not (store.files.root / "global" / "a" / "b").exists()
    assert on_disk(store, "a/kept.md").exists()
    kept = await store.get(SCOPE, "a/kept.md")
    await store.forget(SCOPE, "a/kept.md", kept.revision)
    assert not (store.files.root / "global" / "a").exists()
    assert list((store.files.root / "global").iterdir()) == []


async def test_a_create_racing_a_forget_in_the_same_directory_always_lands(
    store: MemoryStore,
) -> None:
    for round_ in range(20):
        old = await store.upsert(SCOPE, f"team/{round_}/old.md", "old", "absent")
        await asyncio.gather(
            store.forget(SCOPE, f"team/{round_}/old.md", old.revision),
            store.upsert(SCOPE, f"team/{round_}/new.md", "new", "absent"),
        )
        assert (await store.get(SCOPE, f"team/{round_}/new.md")).content == "new"


async def test_forget_keeps_a_directory_holding_anything_else(store: MemoryStore) -> None:
    created = await store.upsert(SCOPE, "notes/topic/a.md", "a", "absent")
    plant(store, "notes/topic/attachment.txt", "not a document")
    await store.forget(SCOPE, "notes/topic/a.md", created.revision)
    assert on_disk(store, "notes/topic/attachment.txt").exists()


async def test_forget_in_a_principal_scope_keeps_that_scope_directory(store: MemoryStore) -> None:
    alice = principal_scope("alice-id")
    created = await store.upsert(alice, "x/y/only.md", "only", "absent")
    await store.forget(alice, "x/y/only.md", created.revision)
    digest = hashlib.sha256(b"alice-id").hexdigest()
    assert list((store.files.root / "users" / digest).iterdir()) == []


async def test_forgotten_directories_do_not_spend_the_search_entry_budget(tmp_path: Path) -> None:
    store = make_store(tmp_path, Limits(scan_entries=8))
    revisions = [
        (await store.upsert(SCOPE, f"old/{n}/note.md", "old", "absent")).revision for n in range(12)
    ]
    for n, revision in enumerate(revisions):
        await store.forget(SCOPE, f"old/{n}/note.md", revision)
    await store.upsert(SCOPE, "live.md", "live needle", "absent")
    result = await store.search(SCOPE, "needle")
    assert result.incomplete is False
    assert [match.path for match in result.matches] == ["live.md"]


async def test_scopes_are_separate_directories(store: MemoryStore) -> None:
    alice = principal_scope("alice-id")
    await store.upsert(alice, "MEMORY.md", "alice only", "absent")
    assert (await store.get(SCOPE, "MEMORY.md")).exists is False
    assert (await store.search(SCOPE, "alice")).matches == ()
    digest = hashlib.sha256(b"alice-id").hexdigest()
    assert (store.files.root / "users" / digest / "MEMORY.md").read_text() == "alice only"
    assert (await store.search(alice, "alice")).matches[0].path == "MEMORY.md"


# -- quotas ---------------------------------------------------------------------------------------


async def test_memory_entry_is_limited_to_2_kib(store: MemoryStore) -> None:
    await store.upsert(SCOPE, "MEMORY.md", "x" * (2 * KIB), "absent")
    current = (await store.get(SCOPE, "MEMORY.md")).revision
    with pytest.raises(QuotaExceeded) as caught:
        await store.upsert(SCOPE, "MEMORY.md", "x" * (2 * KIB + 1), current)
    assert caught.value.code == "quota_exceeded"
    assert "topic" in caught.value.message
    assert len(on_disk(store, "MEMORY.md").read_bytes()) == 2 * KIB


async def test_memory_entry_counts_bytes_not_characters(store: MemoryStore) -> None:
    with pytest.raises(QuotaExceeded):
        await store.upsert(SCOPE, "MEMORY.md", "发" * 700, "absent")  # 2,100 bytes
    assert not on_disk(store, "MEMORY.md").exists()


async def test_memory_entry_is_limited_to_64_lines(store: MemoryStore) -> None:
    await store.upsert(SCOPE, "MEMORY.md", "- x\n" * 64, "absent")
    current = (await store.get(SCOPE, "MEMORY.md")).revision
    with pytest.raises(QuotaExceeded):
        await store.upsert(SCOPE, "MEMORY.md", "- x\n" * 64 + "- one more", current)
    with pytest.raises(QuotaExceeded):
        await store.upsert(SCOPE, "MEMORY.md", "\n" * 65, current)
    assert on_disk(store, "MEMORY.md").read_text() == "- x\n" * 64


async def test_a_memory_md_below_a_directory_is_an_ordinary_topic(store: MemoryStore) -> None:
    big = "line\n" * 2000
    await store.upsert(SCOPE, "topics/MEMORY.md", big, "absent")
    assert on_disk(store, "topics/MEMORY.md").read_text() == big


async def test_a_topic_is_limited_to_64_kib(store: MemoryStore) -> None:
    await store.upsert(SCOPE, "topics/big.md", "x" * (64 * KIB), "absent")
    with pytest.raises(QuotaExceeded):
        await store.upsert(SCOPE, "topics/bigger.md", "x" * (64 * KIB + 1), "absent")
    assert not on_disk(store, "topics/bigger.md").exists()


async def test_a_scope_holds_at_most_its_document_count(tmp_path: Path) -> None:
    store = make_store(tmp_path, Limits(scope_documents=3))
    plant(store, "offline.md", "written by hand before the Hub started")
    revisions = [(await store.upsert(SCOPE, f"d{i}.md", f"{i}", "absent")).revision for i in (1, 2)]
    with pytest.raises(QuotaExceeded) as caught:
        await store.upsert(SCOPE, "d3.md", "3", "absent")
    assert caught.value.details["limit"] == "scope_documents"
    assert not on_disk(store, "d3.md").exists()
    # Replacing an existing document does not add one.
    await store.upsert(SCOPE, "d1.md", "replaced", revisions[0])
    await store.forget(SCOPE, "d2.md", revisions[1])
    await store.upsert(SCOPE, "d3.md", "3", "absent")


async def test_a_scope_holds_at_most_its_byte_total(tmp_path: Path) -> None:
    store = make_store(tmp_path, Limits(scope_bytes=100))
    first = await store.upsert(SCOPE, "a.md", "a" * 60, "absent")
    with pytest.raises(QuotaExceeded) as caught:
        await store.upsert(SCOPE, "b.md", "b" * 41, "absent")
    assert caught.value.details["limit"] == "scope_bytes"
    assert not on_disk(store, "b.md").exists()
    await store.upsert(SCOPE, "b.md", "b" * 40, "absent")
    # A replacement counts the difference, so shrinking one document makes room.
    shrunk = await store.upsert(SCOPE, "a.md", "a" * 10, first.revision)
    await store.upsert(SCOPE, "c.md", "c" * 50, "absent")
    with pytest.raises(QuotaExceeded):
        await store.upsert(SCOPE, "a.md", "a" * 11, shrunk.revision)
    assert on_disk(store, "a.md").read_text() == "a" * 10


async def test_scope_quotas_are_1024_documents_and_16_mib_by_default() -> None:
    limits = Limits()
    assert (limits.scope_documents, limits.scope_bytes) == (1024, 16 * MIB)
    assert (limits.entry_bytes, limits.entry_lines, limits.document_bytes) == (
        2 * KIB,
        64,
        64 * KIB,
    )


# -- search through the store ---------------------------------------------------------------------


async def test_search_returns_five_by_default_and_flags_omitted_matches(store: MemoryStore) -> None:
    for i in range(8):
        plant(store, f"n{i}.md", f"common word {i}\n")
    result = await store.search(SCOPE, "common")
    assert len(result.matches) == 5
    assert result.truncated is True
    assert result.incomplete is False
    assert result.scanned_files == 8
    everything = await store.search(SCOPE, "common", limit=20)
    assert len(everything.matches) == 8
    assert everything.truncated is False


async def test_search_rejects_a_limit_of_21(store: MemoryStore) -> None:
    with pytest.raises(InvalidArgument):
        await store.search(SCOPE, "x", limit=21)


async def test_a_match_carries_path_line_snippet_revision_and_its_own_truncated(
    store: MemoryStore,
) -> None:
    long_line = "前" * 200 + " needle " + "后" * 200
    plant(store, "topics/long.md", "# Long\n" + long_line + "\n")
    plant(store, "topics/short.md", "a needle here\n")
    matches = (await store.search(SCOPE, "needle")).matches
    by_path = {m.path: m for m in matches}
    assert set(by_path) == {"topics/long.md", "topics/short.md"}
    long_match = by_path["topics/long.md"]
    assert long_match.line == 2
    assert long_match.truncated is True
    assert "needle" in long_match.snippet
    assert long_match.revision == sha(on_disk(store, "topics/long.md").read_bytes())
    assert by_path["topics/short.md"].truncated is False
    assert by_path["topics/short.md"].snippet == "a needle here"


async def test_search_output_stays_within_8_kib_and_says_so_when_it_drops_matches(
    store: MemoryStore,
) -> None:
    deep = "/".join(["长长的目录名字" * 2] * 5)
    for i in range(25):
        plant(store, f"{deep}/n{i:02}.md", "关键词 " + "内容" * 200 + "\n")
    result = await store.search(SCOPE, "关键词", limit=20)
    size = len(json.dumps(result.to_wire(), ensure_ascii=False, separators=(",", ":")).encode())
    assert size <= 8192
    assert 0 < len(result.matches) < 20
    assert result.truncated is True


async def test_search_narrows_to_a_path_prefix(store: MemoryStore) -> None:
    plant(store, "projects/amux/a.md", "kiwi\n")
    plant(store, "projects/amuxiliary/b.md", "kiwi\n")
    plant(store, "other/c.md", "kiwi\n")
    result = await store.search(SCOPE, "kiwi", path_prefix="projects/amux")
    assert [m.path for m in result.matches] == ["projects/amux/a.md"]
    assert result.scanned_files == 1
    one = await store.search(SCOPE, "kiwi", path_prefix="other/c.md")
    assert [m.path for m in one.matches] == ["other/c.md"]
    none = await store.search(SCOPE, "kiwi", path_prefix="nowhere")
    assert (none.matches, none.incomplete, none.scanned_files) == ((), False, 0)


async def test_search_skips_non_markdown_hidden_and_temp_files(store: MemoryStore) -> None:
    plant(store, "visible.md", "kiwi\n")
    plant(store, "notes.txt", "kiwi\n")
    plant(store, ".hidden.md", "kiwi\n")
    plant(store, ".git/config.md", "kiwi\n")
    plant(store, ".amux-tmp-0123.md", "kiwi\n")
    result = await store.search(SCOPE, "kiwi", limit=20)
    assert [m.path for m in result.matches] == ["visible.md"]
    assert result.scanned_files == 1


async def test_more_than_1024_files_make_the_scan_incomplete(tmp_path: Path) -> None:
    # A clock standing still keeps a slow machine from hitting the time budget first.
    store = make_store(tmp_path, clock=lambda: 0.0)
    for i in range(1030):
        plant(store, f"d{i // 100}/n{i:04}.md", "x\n")
    plant(store, "zz/last.md", "needle\n")
    result = await store.search(SCOPE, "needle")
    assert result.incomplete is True
    assert result.scanned_files == 1024
    # An incomplete empty answer is not proof of absence: the document exists past the budget.
    assert result.matches == ()
    narrowed = await store.search(SCOPE, "needle", path_prefix="zz")
    assert narrowed.incomplete is False
    assert [m.path for m in narrowed.matches] == ["zz/last.md"]


async def test_exactly_1024_files_are_scanned_completely(tmp_path: Path) -> None:
    # A clock standing still keeps a slow machine from hitting the time budget first.
    store = make_store(tmp_path, clock=lambda: 0.0)
    for i in range(1024):
        plant(store, f"d{i // 128}/n{i:04}.md", "x\n")
    result = await store.search(SCOPE, "x")
    assert (result.incomplete, result.scanned_files) == (False, 1024)


async def test_more_than_8_mib_makes_the_scan_incomplete(tmp_path: Path) -> None:
    # A clock standing still keeps a slow machine from hitting the time budget first.
    store = make_store(tmp_path, clock=lambda: 0.0)
    chunk = b"filler line\n" * (64 * KIB // 12)
    for i in range(140):
        plant(store, f"n{i:03}.md", chunk)
    fits = (8 * MIB) // len(chunk)
    result = await store.search(SCOPE, "filler")
    assert result.incomplete is True
    assert result.scanned_files == fits


def stepping_clock(step: float) -> Callable[[], float]:
    ticks = itertools.count()
    return lambda: next(ticks) * step


async def test_the_250_ms_budget_stops_the_scan_by_the_injected_clock(tmp_path: Path) -> None:
    store = make_store(tmp_path, clock=stepping_clock(0.1))
    for i in range(10):
        plant(store, f"n{i}.md", "kiwi\n")
    result = await store.search(SCOPE, "kiwi", limit=20)
    # The deadline is read at 0.0; files are admitted at 0.1 and 0.2; 0.3 is past 0.25.
    assert result.incomplete is True
    assert result.scanned_files == 2
    assert [m.path for m in result.matches] == ["n0.md", "n1.md"]


async def test_a_clock_that_stands_still_never_stops_a_scan(tmp_path: Path) -> None:
    store = make_store(tmp_path, clock=lambda: 42.0)
    for i in range(10):
        plant(store, f"n{i}.md", "kiwi\n")
    result = await store.search(SCOPE, "kiwi", limit=20)
    assert (result.incomplete, result.scanned_files, len(result.matches)) == (
        False,
        10,
        10,
    )


async def test_invalid_prefixes_are_rejected(store: MemoryStore) -> None:
    for bad in ["/abs", "../up", ".hidden"]:
        with pytest.raises(InvalidPath):
            await store.search(SCOPE, "x", path_prefix=bad)


async def test_a_directory_flooded_with_junk_entries_ends_the_scan_as_incomplete(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path, Limits(scan_entries=50), clock=lambda: 0.0)
    plant(store, "a/kiwi.md", "kiwi\n")
    for i in range(60):
        plant(store, f"junk/{i:03}.txt", "")
    result = await store.search(SCOPE, "kiwi")
    assert result.incomplete is True
    assert [m.path for m in result.matches] == ["a/kiwi.md"]


async def test_concurrent_creates_of_one_path_let_exactly_one_win(tmp_path: Path) -> None:
    store = make_store(tmp_path)

    async def create(n: int) -> str | None:
        try:
            return (await store.upsert("global", "once.md", f"writer {n}\n", "absent")).revision
        except Conflict:
            return None

    results = await asyncio.gather(*(create(n) for n in range(32)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    page = await store.get("global", "once.md")
    assert page.revision == winners[0]
    assert page.content.startswith("writer ")
