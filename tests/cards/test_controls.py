"""The finished turn's card: usage totals and elapsed time in the title, and its controls."""

from __future__ import annotations

import json

from cards.controls import finished_card, usage_summary
from cards.progress import result_cards


def test_usage_reads_claude_and_codex_token_totals_and_always_shows_the_elapsed_time() -> None:
    claude = {"input_tokens": 12_345, "output_tokens": 456, "cache_read_input_tokens": 9}
    assert usage_summary(claude, 41.6, "en_us") == "12.3k in / 456 out · 42 s"
    codex = {"inputTokens": 800, "cachedInputTokens": 100, "outputTokens": 2_000}
    assert usage_summary(codex, 3, "zh_cn") == "输入 800 / 输出 2.0k · 3 秒"
    assert usage_summary({}, 5, "en_us") == "5 s"


def test_the_finished_card_keeps_the_answer_and_adds_usage_and_a_new_conversation_button() -> None:
    (card,) = result_cards("the answer", "en_us", title="question")
    before = json.dumps(card)
    done = finished_card(
        card,
        usage={"input_tokens": 10, "output_tokens": 2},
        elapsed_seconds=7,
        origin="feishu:oc_1:om_1",
        lang="en_us",
    )
    assert json.dumps(card) == before
    assert done["header"]["title"]["content"] == "Result · 10 in / 2 out · 7 s"
    assert "the answer" in json.dumps(done)
    values = [
        behavior["value"]
        for element in done["body"]["elements"]
        if element.get("tag") == "column_set"
        for column in element["columns"]
        for inner in column["elements"]
        for behavior in inner.get("behaviors", [])
    ]
    assert values == [{"action": "conversation.new", "origin": "feishu:oc_1:om_1"}]
