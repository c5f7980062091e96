"""The line at the foot of a finished turn's first card: the model, the time taken, the tokens in
and out, how full the model's context window is and, for a project turn, its branch.

Rules: each part is shown only when known. The context's fill is the tokens the model's last
request held (``usage["context_tokens"]``, the Provider's own report) of its window: the one the
Provider reports (``usage["context_window"]``), else the window of a model this table knows;
unknown, the fill is left out. Past ``COMPACT_AT`` percent the card suggests ``/compact``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cards.catalogue import text
from cards.controls import INPUT_KEYS, OUTPUT_KEYS, short_count, token_count
from cards.elements import Element, escape, markdown
from cards.models import Lang

COMPACT_AT = 80
MODEL_CHARS = 60
BRANCH_CHARS = 100
# Context windows (tokens) by model name prefix, longest prefix first; a name marked ``[1m]``
# runs with the one-million-token window.
WINDOWS: tuple[tuple[str, int], ...] = (
    ("claude-", 200_000),
    ("gpt-5", 400_000),
    ("gpt-4.1", 1_047_576),
    ("o3", 200_000),
    ("o4-mini", 200_000),
)
LONG_WINDOW = ("[1m]", 1_000_000)


FOOTER_ID = "footer"


def context_window(model: str) -> int | None:
    """The context window of ``model`` by name; None when this table does not know it."""
    name = model.lower()
    if name.endswith(LONG_WINDOW[0]):
        return LONG_WINDOW[1]
    for prefix, window in WINDOWS:
        if name.startswith(prefix):
            return window
    return None


def context_percent(usage: Mapping[str, Any]) -> int | None:
    """How full the model's context is, in percent; None when that is not known."""
    held = token_count(usage, ("context_tokens",))
    window = token_count(usage, ("context_window",))
    model = usage.get("model")
    if window is None and isinstance(model, str):
        window = context_window(model)
    if held is None or not window or window <= 0:
        return None
    return min(100, round(held * 100 / window))


def footer(
    usage: Mapping[str, Any], elapsed_seconds: float, branch: str, lang: Lang
) -> list[Element]:
    """The footer's elements: one line of what is known, and the /compact hint when due."""
    own = usage
    counted = usage.get("gateway")
    totals = counted if isinstance(counted, Mapping) else usage
    parts: list[str] = []
    model = own.get("model")
    if isinstance(model, str) and model:
        parts.append(escape(model[:MODEL_CHARS]))
    parts.append(text(lang, "usage.elapsed", seconds=f"{elapsed_seconds:.0f}"))
    spent_in, spent_out = token_count(totals, INPUT_KEYS), token_count(totals, OUTPUT_KEYS)
    if spent_in is not None and spent_out is not None:
        parts.append(
            text(lang, "usage.tokens", input=short_count(spent_in), output=short_count(spent_out))
        )
    percent = context_percent(own)
    if percent is not None:
        parts.append(text(lang, "footer.context", percent=percent))
    if branch:
        parts.append(escape(branch[:BRANCH_CHARS]))
    # Named, so a reader of the card (or its tests) can tell the footer from the answer.
    elements = [
        {**markdown(f"<font color='grey'>{' · '.join(parts)}</font>"), "element_id": FOOTER_ID}
    ]
    if percent is not None and percent > COMPACT_AT:
        hint = markdown(text(lang, "footer.compact", percent=percent))
        elements.append({**hint, "element_id": f"{FOOTER_ID}_hint"})
    return elements
