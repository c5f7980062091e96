"""What a turn asked for in a document comment reads of its thread (``bot.comments``)."""

from __future__ import annotations

from typing import Any

from bot.comments import MAX_QUOTE_BYTES, comment_origin, reply_text, thread_of
from bot.feishu.events import CommentEvent, parse_event
from tests.fakes.feishu_events import FeishuSigner

signer = FeishuSigner()
BOT = "ou_bot"


def reply(reply_id: str, who: str, *elements: dict[str, Any]) -> dict[str, Any]:
    return {"reply_id": reply_id, "user_id": who, "content": {"elements": list(elements)}}


def words(text: str) -> dict[str, Any]:
    return {"type": "text_run", "text_run": {"text": text}}


def person(open_id: str) -> dict[str, Any]:
    return {"type": "person", "person": {"user_id": open_id}}


def event(reply_id: str, author: str = "ou_dave") -> CommentEvent:
    parsed = parse_event(signer.comment("DocPlan0001", "cm_1", reply_id, author_open_id=author))
    assert isinstance(parsed, CommentEvent)
    return parsed


THREAD = [
    reply("rp_1", "ou_carol", words("Friday is too early")),
    reply("rp_2", "ou_dave", person(BOT), words(" is it? ask "), person("ou_carol")),
    reply("rp_3", BOT, words("It depends on the freeze.")),
    reply("rp_4", "ou_carol", words("freeze is Thursday")),
    reply("rp_5", "ou_erin", words("see "), {"type": "docs_link", "docs_link": {"url": "u"}}),
    reply("rp_6", "ou_dave", person(BOT), words(" and now?")),
    reply("rp_7", "ou_carol", words("written after the question")),
]


def test_the_request_drops_the_bots_mention_and_names_other_people() -> None:
    said = reply_text(THREAD[1], BOT, {"ou_carol": "Carol Chen"})
    assert said == "is it? ask @Carol Chen"
    assert reply_text(THREAD[4], BOT, {}) == "see u"
    assert reply_text({"content": "not elements"}, BOT, {}) == ""


def test_the_agent_gets_the_peoples_replies_since_its_last_answer_and_nothing_after() -> None:
    comment = {"quote": "We ship on Friday."}
    names = {"ou_carol": "Carol Chen"}
    thread = thread_of(comment, THREAD, event("rp_6"), BOT, names)
    assert thread is not None
    assert thread.quote == "We ship on Friday."
    assert thread.request == "and now?"
    assert [(m.sender_open_id, m.text) for m in thread.earlier] == [
        ("ou_carol", "freeze is Thursday"),
        ("ou_erin", "see u"),
    ]
    assert thread.names == (("ou_carol", "Carol Chen"),)

    # The first question, before any answer: every earlier reply of people.
    first = thread_of(comment, THREAD, event("rp_2"), BOT, names)
    assert first is not None
    assert [m.text for m in first.earlier] == ["Friday is too early"]


def test_a_reply_that_is_gone_asks_nothing_and_a_missing_id_means_the_authors_latest() -> None:
    assert thread_of({}, THREAD, event("rp_gone"), BOT, {}) is None
    latest = thread_of({}, THREAD, event(""), BOT, {})
    assert latest is not None and latest.request == "and now?"
    assert thread_of({}, THREAD, event("", author="ou_nobody"), BOT, {}) is None


def test_one_conversation_per_document_thread() -> None:
    assert comment_origin(event("rp_2")) == comment_origin(event("rp_6"))
    other = parse_event(signer.comment("DocOther001", "cm_1", "rp_2"))
    assert isinstance(other, CommentEvent)
    assert comment_origin(other) != comment_origin(event("rp_2"))


def test_a_long_passage_is_cut_to_its_bound_on_whole_characters() -> None:
    passage = "发布计划" * MAX_QUOTE_BYTES
    thread = thread_of({"quote": passage}, THREAD, event("rp_2"), BOT, {})
    assert thread is not None
    assert len(thread.quote.encode()) <= MAX_QUOTE_BYTES
    assert passage.startswith(thread.quote) and len(thread.quote) > MAX_QUOTE_BYTES // 4
