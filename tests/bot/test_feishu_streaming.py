"""Streamed progress cards through CardKit: the real lark-oapi client against the fake Feishu.

A long answer is streamed while updates fail, are rate limited or arrive late, and the final
cards (owed in a real SQLite outbox) must together hold exactly the answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.client import FeishuClient
from bot.feishu.errors import FeishuApiError
from bot.outbox import Followed, Outbox, Owed
from bot.streaming import StreamingCard, open_streaming
from cards.models import ProgressView
from cards.progress import result_cards
from cards.streaming import STREAM_ELEMENT
from tests.conftest import until
from tests.fakes.feishu import SEQUENCE_STALE, FakeFeishu

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu(app_id="cli_stream") as fake:
        yield fake


@pytest.fixture
async def client(feishu: FakeFeishu) -> AsyncIterator[FeishuClient]:
    settings = FeishuSettings(
        app_id="cli_stream", app_secret=SecretStr(feishu.app_secret), domain=feishu.url
    )
    made = FeishuClient(settings, backoff=lambda state: 0.01, max_retry_after=0.05)
    yield made
    await made.close()


def long_answer() -> str:
    """About 20,000 characters: prose and fenced code blocks, every line unique."""
    parts: list[str] = []
    n = 0
    while sum(len(p) for p in parts) < 20_000:
        parts.append(f"Step {n}: explain what the next block does and why it matters here.\n")
        parts.append("```python\n")
        parts.extend(f'value_{n}_{i} = compute("{n}-{i}")  # line {i}\n' for i in range(12))
        parts.append("```\n\n")
        n += 1
    return "".join(parts)


def without_fences(text: str) -> list[str]:
    return [line for line in text.split("\n") if not line.lstrip().startswith("```")]


def markdown_of(card: dict[str, Any]) -> str:
    return "".join(e["content"] for e in card["body"]["elements"] if e.get("tag") == "markdown")


async def test_a_streamed_20000_character_answer_ends_complete_in_its_final_cards_despite_failures(
    feishu: FakeFeishu, client: FeishuClient, tmp_path: Path
) -> None:
    question = feishu.add_message("oc_chat", "write the module")
    created = time.time()
    opened = await open_streaming(
        client,
        question.message_id,
        ProgressView("write the module", "queued", run_id="r1"),
        "en_us",
    )
    assert opened is not None
    streamed = StreamingCard(client, opened.card_id, created, interval=0.0)
    answer = long_answer()
    assert len(answer) >= 20_000

    # Retried by the client: two server errors and two rate-limit answers; then refused twice.
    feishu.fail_next(2, status=500, code=0, path_contains="/elements/")
    feishu.fail_next(2, status=429, code=99991400, path_contains="/elements/")
    feishu.fail_next(2, status=400, code=230001, path_contains="/elements/")
    for end in range(1_000, len(answer), 1_000):
        streamed.push(answer[:end])
        await streamed.flush()
    assert feishu.failures_left() == 0
    entity = feishu.entities[opened.card_id]
    assert entity.card["config"]["streaming_mode"] is True
    shown = entity.card["body"]["elements"][0]["content"]
    assert answer.startswith(shown) and len(shown) >= len(answer) - 1_000

    # An update that arrives after a newer one is refused, and changes nothing.
    with pytest.raises(FeishuApiError) as late:
        await client.stream_card_text(opened.card_id, STREAM_ELEMENT, "stale", 1)
    assert late.value.feishu_code == SEQUENCE_STALE
    assert entity.card["body"]["elements"][0]["content"] == shown

    parts = result_cards(answer, "en_us", title="write the module")
    assert len(parts) >= 2
    outbox = Outbox(
        tmp_path / "outbox.sqlite3",
        lambda message_id, card: client.update_card(message_id, card),
        lambda reply_to, card, key: client.reply(reply_to, card=card, idempotency_key=key),
        client.finish_card_entity,
        max_wait=0.1,
    )
    followed = Followed("r1", opened.message_id, question.message_id, "q", created, opened.card_id)
    await streamed.close()
    feishu.fail_next(1, status=503, code=0, path_contains="/settings")
    feishu.fail_next(9, status=429, code=99991400, path_contains=f"/cards/{opened.card_id}")
    outbox.owe(
        followed,
        [Owed("card", parts[0], streamed.next_sequence())]
        + [Owed("reply", part) for part in parts[1:]],
    )
    outbox.start()
    try:
        await until(lambda: outbox.pending() == 0, seconds=60)
    finally:
        await outbox.stop(0)
        outbox.close()

    assert entity.card["config"].get("streaming_mode") is not True
    follow_ups = [m for m in feishu.messages.values() if m.root_id and not m.entity]
    cards = [entity.card, *(m.card for m in follow_ups)]
    assert len(cards) == len(parts)
    assert without_fences("".join(markdown_of(card) for card in cards)) == without_fences(answer)
    for card in cards:
        assert markdown_of(card).count("```") % 2 == 0  # every card's code blocks are closed
    assert entity.sequences == sorted(set(entity.sequences))


async def test_cardkit_refused_means_no_streaming_card(
    feishu: FakeFeishu, client: FeishuClient
) -> None:
    feishu.cardkit_refused = True
    question = feishu.add_message("oc_chat", "hello")
    view = ProgressView("hello", "queued", run_id="r2")
    assert await open_streaming(client, question.message_id, view, "en_us") is None
    assert feishu.entities == {}
    assert [m for m in feishu.messages.values() if m.root_id] == []
    assert json.loads(question.content)["text"] == "hello"
