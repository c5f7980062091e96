"""Bounded reads: pages fit the 8 KiB response budget and concatenate to exactly the document."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hub import paging
from hub.errors import InvalidArgument
from hub.store import Document, MemoryStore, revision_of

SCOPE = "global"
RESPONSE_BUDGET = 8192


def wire_size(response: dict[str, object]) -> int:
    """Bytes of the response body exactly as the Hub RPC serialises it."""
    return len(json.dumps(response, ensure_ascii=False, separators=(",", ":")).encode())


def read_pages(
    store: MemoryStore, path: str, start_line: int = 0, end_line: int = 0
) -> tuple[str, list[Document]]:
    """Follow next_offset from a first read to the end, as a client would."""
    pages = [asyncio.run(store.get(SCOPE, path, start_line or None, end_line or None))]
    while pages[-1].truncated:
        offset = pages[-1].next_offset
        assert isinstance(offset, int)
        pages.append(asyncio.run(store.get(SCOPE, path, None, end_line or None, offset)))
        assert len(pages) < 10_000, "paging made no progress"
    return "".join(p.content for p in pages), pages


def new_store(root: Path) -> MemoryStore:
    store = MemoryStore(root / "memory")
    store.open()
    return store


# Characters JSON escapes (quotes, backslashes, control characters) cost more than their bytes.
_awkward = st.sampled_from(['"', "\\", "\x00", "\x01", "\x1f", "\t", "\r", "\n", "\u2028", "/"])
_chars = st.one_of(
    st.characters(blacklist_categories=("Cs",)),
    _awkward,
    st.sampled_from(["发", "布", "流", "程", "🚀", "\u200d", "é", "a", " "]),
)
_documents = st.one_of(
    st.text(_chars, max_size=4000),
    st.builds(lambda c, n: c * n, _chars, st.integers(1, 30_000)),
    st.builds(
        lambda lines: "\n".join(lines),
        st.lists(st.text(_chars, max_size=300), max_size=200),
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_documents)
@example("\x01" * 20_000)
@example('"' * 9000 + "\n" + "\\" * 9000)
@example("🚀" * 5000)
@example("a\n" * 6000)
@example("")
def test_pages_concatenate_to_the_document_and_each_fits_the_budget(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = new_store(Path(tmp))
        data = text.encode()
        store.files.write_atomic(("global", "doc.md"), data)
        content, pages = read_pages(store, "doc.md")
        assert content == text
        for page in pages:
            assert wire_size(page.to_wire()) <= RESPONSE_BUDGET
            assert page.revision == revision_of(data)
        assert pages[-1].next_offset is None


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.text(_chars, max_size=3000).map(lambda s: s.replace("\n", " ")), max_size=30),
    st.integers(0, 35),
    st.integers(0, 35),
)
def test_line_ranges_are_one_based_and_inclusive_across_pages(
    lines: list[str], start: int, end: int
) -> None:
    if start and end and end < start:
        return
    text = "".join(line + "\n" for line in lines)
    with tempfile.TemporaryDirectory() as tmp:
        store = new_store(Path(tmp))
        store.files.write_atomic(("global", "doc.md"), text.encode())
        content, pages = read_pages(store, "doc.md", start, end)
        first = max(start, 1) - 1
        last = end if end else len(lines)
        assert content == "".join(line + "\n" for line in lines[first:last])
        assert all(wire_size(page.to_wire()) <= RESPONSE_BUDGET for page in pages)


async def test_line_ranges_on_a_small_document(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    await store.upsert(SCOPE, "n.md", "one\ntwo\nthree\nfour", "absent")
    get = store.get
    assert (await get(SCOPE, "n.md", 2, 3)).content == "two\nthree\n"
    assert (await get(SCOPE, "n.md", 3, 3)).content == "three\n"
    assert (await get(SCOPE, "n.md", 0, 1)).content == "one\n"
    assert (await get(SCOPE, "n.md", 4)).content == "four"
    assert (await get(SCOPE, "n.md", 3, 99)).content == "three\nfour"
    beyond = await get(SCOPE, "n.md", 9)
    assert (beyond.content, beyond.truncated, beyond.exists) == ("", False, True)
    whole = await get(SCOPE, "n.md")
    assert whole.content == "one\ntwo\nthree\nfour"
    assert (whole.truncated, whole.next_offset) == (False, None)


async def test_a_missing_document_reads_as_absent(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    assert (await store.get(SCOPE, "nope/none.md")).to_wire() == {
        "path": "nope/none.md",
        "exists": False,
        "revision": "absent",
        "content": "",
        "truncated": False,
        "next_offset": None,
    }


@pytest.mark.parametrize(
    ("start", "end", "offset"),
    [
        (2, None, 5),
        (-1, None, None),
        (None, -2, None),
        (None, None, -3),
        (5, 2, None),
        ("1", None, None),
        (None, 2.5, None),
        (True, None, None),
    ],
)
async def test_bad_ranges_are_invalid_argument(
    tmp_path: Path, start: object, end: object, offset: object
) -> None:
    store = new_store(tmp_path)
    await store.upsert(SCOPE, "n.md", "a\nb\nc\nd\ne\nf\n", "absent")
    with pytest.raises(InvalidArgument) as caught:
        await store.get(SCOPE, "n.md", start, end, offset)
    assert caught.value.code == "invalid_argument"


async def test_an_offset_inside_a_utf8_character_or_past_the_end_is_rejected(
    tmp_path: Path,
) -> None:
    store = new_store(tmp_path)
    await store.upsert(SCOPE, "n.md", "发布流程", "absent")
    assert (await store.get(SCOPE, "n.md", offset=3)).content == "布流程"
    for inside in (1, 2, 4, 11):
        with pytest.raises(InvalidArgument, match="UTF-8"):
            await store.get(SCOPE, "n.md", offset=inside)
    assert (await store.get(SCOPE, "n.md", offset=12)).content == ""
    with pytest.raises(InvalidArgument):
        await store.get(SCOPE, "n.md", offset=13)


def test_select_prefers_whole_lines_and_cuts_a_long_line_at_a_character_boundary() -> None:
    data = b"short\n" + ("长" * 100).encode() + b"\n"
    first = paging.select(data, 0, 0, 0, budget=50)
    assert (first.content, first.truncated, first.next_offset) == ("short\n", True, 6)
    second = paging.select(data, 0, 0, 6, budget=50)
    assert second.content == "长" * 16
    assert second.next_offset == 6 + 48


def test_escaped_size_counts_json_escapes() -> None:
    assert paging.escaped_size('a"b\\c') == 7
    assert paging.escaped_size("\x01") == 6
    assert paging.escaped_size("发") == 3


async def test_pages_on_the_wire_fit_8_kib_and_rebuild_the_document(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    from bot.service.app import create_app
    from hub.config import OWNER_TOKEN_FILE, HubSettings
    from hub.state import State

    settings = HubSettings(home=tmp_path / "home")
    settings.home.mkdir()
    state = State(settings.state_path)
    state.save_setting("memory.enabled", True)
    state.close()
    client = await aiohttp_client(create_app(settings))
    token = (settings.home / OWNER_TOKEN_FILE).read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    text = "".join(f'{i}: "发布" \\ \x01 🚀 {"x" * (i % 200)}\n' for i in range(400))
    assert len(text.encode()) < 64 * 1024
    created = await client.post(
        "/rpc/v1/memory.upsert",
        json={"path": "big.md", "content": text, "expected_revision": "absent"},
        headers=headers,
    )
    assert created.status == 200, await created.text()
    pieces: list[str] = []
    params: dict[str, Any] = {"path": "big.md"}
    while True:
        response = await client.post("/rpc/v1/memory.get", json=params, headers=headers)
        raw = await response.read()
        assert response.status == 200, raw
        assert len(raw) <= RESPONSE_BUDGET
        page = json.loads(raw)
        pieces.append(page["content"])
        if not page["truncated"]:
            break
        params = {"path": "big.md", "offset": page["next_offset"]}
    assert len(pieces) > 3
    assert "".join(pieces) == text
