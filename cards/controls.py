"""What a finished turn's first card adds: usage in its title, and the conversation controls.

Rules: the title keeps the card's own title and appends the turn's token totals (input and
output; other counters are left out) and the elapsed time. The totals are the worker's model
gateway's count (``usage["gateway"]``) when it has one, else the Provider's own report. The
controls row holds "New conversation", which makes the topic's next message start a new Session;
the handler checks who may press it. Pure: a new card is returned, the given one is not changed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from cards import actions
from cards.catalogue import text
from cards.elements import Card, button, row
from cards.models import Lang

INPUT_KEYS = ("input_tokens", "inputTokens", "input")
OUTPUT_KEYS = ("output_tokens", "outputTokens", "output")


def token_count(usage: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def short_count(count: int) -> str:
    return f"{count / 1000:.1f}k" if count >= 1000 else str(count)


def usage_summary(usage: Mapping[str, Any], elapsed_seconds: float, lang: Lang) -> str:
    """``12.3k in / 456 out · 42 s``; without reported tokens just the elapsed time."""
    parts: list[str] = []
    counted = usage.get("gateway")
    if isinstance(counted, Mapping):
        usage = counted
    spent_in, spent_out = token_count(usage, INPUT_KEYS), token_count(usage, OUTPUT_KEYS)
    if spent_in is not None and spent_out is not None:
        parts.append(
            text(lang, "usage.tokens", input=short_count(spent_in), output=short_count(spent_out))
        )
    parts.append(text(lang, "usage.elapsed", seconds=f"{elapsed_seconds:.0f}"))
    return " · ".join(parts)


def finished_card(
    card: Card, *, usage: Mapping[str, Any], elapsed_seconds: float, origin: str, lang: Lang
) -> Card:
    """``card`` with the usage summary in its title and the conversation controls appended."""
    done = copy.deepcopy(card)
    title = done["header"]["title"]
    title["content"] = f"{title['content']} · {usage_summary(usage, elapsed_seconds, lang)}"
    control = button(text(lang, "conversation.new"), actions.CONVERSATION_NEW, origin=origin)
    done["body"]["elements"].append(row(control))
    return done
