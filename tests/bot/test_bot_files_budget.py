"""The 20 MiB a message's files may bring in counts bytes downloaded, not bytes kept.

Real lark-oapi (its tenant token) against the fake Feishu, which streams large files and counts
what it sent: a file over what is left is cut off as it arrives (never held whole), and once the
budget is spent nothing more is requested.
"""

from __future__ import annotations

import itertools
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.feishu.events import Attachment
from bot.files import MAX_IN_BYTES, TurnFiles
from tests.bot.test_bot_files import event_with, session_in
from tests.fakes.feishu import FakeFeishu, LargeResource

pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024
OVER = "over the 20 MiB per message limit"
# What loopback socket buffers may hold between the fake's writes and the client's reads.
IN_FLIGHT = 16 * MIB
APPS = itertools.count(1)


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    # An app of its own per test: lark-oapi caches tenant tokens per app id, process-wide, and
    # an earlier fake's token would cost a refused request first.
    async with FakeFeishu(app_id=f"cli_budget_{next(APPS)}") as fake:
        yield fake


def requested(feishu: FakeFeishu) -> list[str]:
    """The resource keys the bot asked Feishu for, in order."""
    return [call.path.rsplit("/", 1)[1] for call in feishu.calls("GET", "/resources/")]


async def test_a_file_over_the_budget_is_cut_off_as_it_streams_and_spends_what_was_read(
    feishu: FakeFeishu, files: TurnFiles, tmp_path: Path
) -> None:
    message = feishu.add_message("oc_chat", "")
    # Chunked: nothing says how large it is until it has all been sent.
    huge = LargeResource(200 * MIB)
    feishu.large_resources[(message.message_id, "file_huge")] = huge
    feishu.resources[(message.message_id, "file_small")] = b"small"
    event = event_with(
        message.message_id,
        Attachment("file", "file_huge", "huge.bin"),
        Attachment("file", "file_small", "small.txt"),
    )
    tracemalloc.start()
    try:
        saved, refused = await files.bring_in(event, session_in(tmp_path / "workspace"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert saved == []
    assert [(r.name, r.reason) for r in refused] == [("huge.bin", OVER), ("small.txt", OVER)]
    # The download was abandoned just past the budget, and no more than that was ever held.
    assert huge.sent < MAX_IN_BYTES + IN_FLIGHT, huge.sent
    assert peak < MAX_IN_BYTES + 4 * MIB, peak
    # The budget was spent on it, so the next file was never asked for.
    assert requested(feishu) == ["file_huge"]
    assert not (tmp_path / "workspace" / "inbox").exists()


async def test_a_file_that_says_it_is_over_the_budget_is_not_read_and_spends_nothing(
    feishu: FakeFeishu, files: TurnFiles, tmp_path: Path
) -> None:
    message = feishu.add_message("oc_chat", "")
    huge = LargeResource(200 * MIB, declare_length=True)
    feishu.large_resources[(message.message_id, "file_huge")] = huge
    feishu.resources[(message.message_id, "file_small")] = b"small"
    event = event_with(
        message.message_id,
        Attachment("file", "file_huge", "huge.bin"),
        Attachment("file", "file_small", "small.txt"),
    )
    saved, refused = await files.bring_in(event, session_in(tmp_path / "workspace"))

    assert [(r.name, r.reason) for r in refused] == [("huge.bin", OVER)]
    assert huge.sent < IN_FLIGHT, huge.sent
    assert [s.path for s in saved] == [f"inbox/{message.message_id}/small.txt"]
    assert requested(feishu) == ["file_huge", "file_small"]


async def test_once_the_budget_is_spent_later_images_are_never_requested(
    feishu: FakeFeishu, files: TurnFiles, tmp_path: Path
) -> None:
    message = feishu.add_message("oc_chat", "")
    image = b"\x89PNG\r\n\x1a\n" + bytes(MIB // 2 - 8)
    keys = [f"img_{n}" for n in range(1, 42)]
    for key in keys:
        feishu.resources[(message.message_id, key)] = image
    event = event_with(message.message_id, *(Attachment("image", key) for key in keys))
    saved, refused = await files.bring_in(event, session_in(tmp_path / "workspace"))

    # Forty half-MiB images are the whole budget; the forty-first is refused unasked.
    assert len(saved) == 40 and sum(s.size for s in saved) == MAX_IN_BYTES
    assert [(r.name, r.reason) for r in refused] == [("image 41", OVER)]
    assert requested(feishu) == keys[:40]
