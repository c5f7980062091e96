"""The outbox: what the bot owes Feishu survives a new process, goes out once, in order, and is
given up (and counted) only when refused or too old. Real SQLite files, the real lark-oapi
client against the fake Feishu."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.client import FeishuClient
from bot.outbox import Followed, Outbox, Owed
from cards.notices import warning_card
from hub.metrics import Metrics
from tests.conftest import until
from tests.fakes.feishu import FakeFeishu

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu(app_id="cli_outbox") as fake:
        yield fake


@pytest.fixture
async def client(feishu: FakeFeishu) -> AsyncIterator[FeishuClient]:
    settings = FeishuSettings(
        app_id="cli_outbox", app_secret=SecretStr(feishu.app_secret), domain=feishu.url
    )
    made = FeishuClient(settings, attempts=2, backoff=lambda state: 0.01)
    yield made
    await made.close()


def outbox_of(path: Path, client: FeishuClient, **kw: object) -> Outbox:
    return Outbox(
        path,
        client.update_card,
        lambda reply_to, card, key: client.reply(reply_to, card=card, idempotency_key=key),
        client.finish_card_entity,
        max_wait=0.05,
        **kw,  # type: ignore[arg-type]
    )


def texts(feishu: FakeFeishu, root: str) -> list[str]:
    return [
        json.dumps(m.card, ensure_ascii=False)
        for m in feishu.messages.values()
        if m.root_id == root and m.msg_type == "interactive"
    ]


async def test_what_one_process_owed_the_next_delivers_once_and_in_order(
    feishu: FakeFeishu, client: FeishuClient, tmp_path: Path
) -> None:
    question = feishu.add_message("oc_chat", "question")
    followed = Followed("run1", "", question.message_id, "question", 0.0)
    first = outbox_of(tmp_path / "outbox.sqlite3", client)
    first.follow(followed)
    assert first.followed() == [followed]
    await feishu.go_down()
    first.start()
    first.owe(followed, [Owed("card", warning_card(f"part {n}", "en_us")) for n in range(3)])
    assert first.followed() == []
    await first.stop(0.2)  # Feishu is down: everything stays owed on disk
    first.close()
    assert texts(feishu, question.message_id) == []

    await feishu.come_back()
    # The first post is answered 503: it is tried again under the same idempotency key.
    feishu.fail_next(1, status=503, code=0, path_contains="/reply")
    second = outbox_of(tmp_path / "outbox.sqlite3", client)
    second.start()
    try:
        await until(lambda: second.pending() == 0)
    finally:
        await second.stop(0)
        second.close()
    shown = texts(feishu, question.message_id)
    assert [n for n in range(3) for text in shown if f"part {n}" in text] == [0, 1, 2]
    keys = [call.body["uuid"] for call in feishu.calls("POST", "/reply")]
    assert len(keys) == 4 and keys[0] == keys[1] and len(set(keys)) == 3


async def test_a_final_card_not_shown_in_place_is_replied_and_only_refused_or_stale_ones_drop(
    feishu: FakeFeishu, client: FeishuClient, tmp_path: Path
) -> None:
    question = feishu.add_message("oc_chat", "question")
    clock = Clock()
    dropped: list[str] = []
    metrics = Metrics()

    def gave_up(reason: str) -> None:
        dropped.append(reason)
        metrics.feishu_gave_up(reason)

    outbox = outbox_of(tmp_path / "outbox.sqlite3", client, clock=clock, dropped=gave_up)
    followed = Followed("run1", "om_gone", question.message_id, "q", 0.0)
    await feishu.go_down()
    outbox.start()
    try:
        outbox.owe(followed, [Owed("reply", warning_card("stale", "en_us"))])
        await until(lambda: feishu.calls("POST", "/reply") == [] and outbox.pending() == 1)
        clock.now += 24 * 3600 + 1
        await until(lambda: dropped == ["too_old"])
        assert outbox.pending() == 0

        await feishu.come_back()
        # The progress card no longer exists: the final card goes out as a reply instead.
        outbox.owe(
            followed,
            [
                Owed("card", warning_card("final", "en_us")),
                Owed("reply", warning_card("w", "en_us")),
            ],
        )
        await until(lambda: outbox.pending() == 0)
        assert dropped == ["too_old"]
        scraped = metrics.render().decode()
        assert 'amux_feishu_replies_undelivered_total{reason="too_old"} 1.0' in scraped
        shown = texts(feishu, question.message_id)
        assert len(shown) == 2 and "final" in shown[0] and "stale" not in "".join(shown)

        # A reply Feishu refuses for good (its message is gone) is dropped and counted.
        gone = Followed("run2", "", "om_missing", "q", 0.0)
        outbox.owe(gone, [Owed("reply", warning_card("lost", "en_us"))])
        await until(lambda: outbox.pending() == 0)
        assert dropped == ["too_old", "refused"]
    finally:
        await outbox.stop(0)
        outbox.close()


async def test_an_owed_file_is_stored_as_before_and_posted_by_its_path(
    feishu: FakeFeishu, client: FeishuClient, tmp_path: Path
) -> None:
    question = feishu.add_message("oc_chat", "question")
    followed = Followed("run1", "", question.message_id, "question", 0.0)
    posted: list[tuple[str, str]] = []

    async def post_file(reply_to: str, path: str, key: str) -> None:
        posted.append((reply_to, path))

    outbox = outbox_of(tmp_path / "outbox.sqlite3", client, post_file=post_file)
    outbox.owe(followed, [Owed.file("/work/outbox/report.txt")])
    # The file's path is kept where every earlier version kept it, so either reads the other's.
    with contextlib.closing(sqlite3.connect(tmp_path / "outbox.sqlite3")) as db:
        stored = db.execute("SELECT kind, card FROM owed").fetchall()
    assert [(kind, json.loads(card)) for kind, card in stored] == [
        ("file", {"path": "/work/outbox/report.txt"})
    ]
    outbox.start()
    try:
        await until(lambda: outbox.pending() == 0)
    finally:
        await outbox.stop(0)
        outbox.close()
    assert posted == [(question.message_id, "/work/outbox/report.txt")]


async def test_a_card_feishu_refuses_for_its_size_is_replaced_by_a_notice_in_the_topic(
    feishu: FakeFeishu, client: FeishuClient, tmp_path: Path
) -> None:
    question = feishu.add_message("oc_chat", "question")
    progress = await client.reply(question.message_id, card=warning_card("working", "en_us"))
    dropped: list[str] = []
    outbox = outbox_of(
        tmp_path / "outbox.sqlite3",
        client,
        dropped=dropped.append,
        reply_text=lambda reply_to, text, key: client.reply(
            reply_to, text=text, idempotency_key=key
        ),
        refused_notice=lambda reason: "The answer could not be shown; ask again.",
    )
    followed = Followed("run1", progress.message_id, question.message_id, "q", 0.0)
    outbox.start()
    try:
        # Over Feishu's limit: refused in place, and again as a reply.
        huge = warning_card("x", "en_us")
        huge["body"]["elements"].append({"tag": "markdown", "content": "y" * 40_000})
        outbox.owe(followed, [Owed("card", huge), Owed("reply", warning_card("after", "en_us"))])
        await until(lambda: outbox.pending() == 0)
        told = [
            json.loads(m.content)["text"]
            for m in feishu.messages.values()
            if m.root_id == question.message_id and m.msg_type == "text"
        ]
        assert told == ["The answer could not be shown; ask again."]
        assert dropped == []
        # What was owed after it still went out, after the notice.
        assert "after" in texts(feishu, question.message_id)[-1]
    finally:
        await outbox.stop(0)
        outbox.close()
