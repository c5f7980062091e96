"""The streaming progress card: a CardKit card entity whose one markdown element shows the
Agent's text as it arrives, under its plan when it reported one.

Rules: the streamed element (``STREAM_ELEMENT``) holds at most ``STREAM_CHARS`` characters, the
newest kept behind a leading ellipsis; mentions are defused. The card is in streaming mode while
the turn runs and is replaced by the first result card at the end (``cards.progress.result_cards``),
so the streamed text never has to hold the complete answer.
"""

from __future__ import annotations

from cards.catalogue import text
from cards.elements import Card, Element, card, defuse_mentions
from cards.models import Lang, ProgressView
from cards.progress import cancel_row, plan_lines, project_line, steps_section

STREAM_ELEMENT = "stream"
STREAM_CHARS = 8_000


def stream_text(
    lines: tuple[str, ...] | list[str],
    plan: tuple[tuple[str, str], ...] = (),
    lang: Lang = "en_us",
    steps: tuple[tuple[str, str], ...] = (),
) -> str:
    """What the streamed element shows: the Agent's plan and its steps (each within its own
    budget) above the progress so far, whose newest part is kept when it is long."""
    joined = "\n\n".join(line for line in lines if line)
    if len(joined) > STREAM_CHARS:
        joined = "…" + joined[-(STREAM_CHARS - 1) :]
    checklist = "\n".join(plan_lines(plan, lang))
    used = "\n\n".join(str(element["content"]) for element in steps_section(steps, lang))
    shown = defuse_mentions(joined)
    return "\n\n".join(part for part in (checklist, used, shown) if part) or "…"


def streaming_card(view: ProgressView, lang: Lang) -> Card:
    """The card entity a turn starts with; ``streaming_mode`` makes Feishu type updates out."""
    elements: list[Element] = [
        *project_line(view, lang),
        {
            "tag": "markdown",
            "element_id": STREAM_ELEMENT,
            "content": stream_text(view.lines, view.plan, lang, view.steps),
        },
    ]
    if view.run_id:
        elements.append(cancel_row(view.run_id, lang))
    built = card(text(lang, "progress.title.running"), "blue", elements, subtitle=view.title[:120])
    built["config"]["streaming_mode"] = True
    built["config"]["streaming_config"] = {
        "print_frequency_ms": {"default": 40},
        "print_step": {"default": 4},
        "print_strategy": "fast",
    }
    return built
