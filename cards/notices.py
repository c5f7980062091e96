"""Readable error and warning cards: what happened, and what the user can do next."""

from __future__ import annotations

from typing import Literal

from cards import actions
from cards.catalogue import about_error, text
from cards.elements import Card, Element, button, card, code, escape, markdown, row
from cards.models import BudgetView, Lang

MESSAGE_CHARS = 1_000


def error_card(code_: str, message: str, lang: Lang) -> Card:
    """A typed error (``code_`` is the stable error code) shown without any traceback: what the
    code means in the card's language first, then the error's own words (which name the path,
    the limit, the revision), then the code."""
    detail = escape(message[:MESSAGE_CHARS])
    about = about_error(lang, code_)
    elements: list[Element] = [
        markdown(detail if about is None else about),
        *([] if about is None else [markdown(text(lang, "error.detail", message=detail))]),
        markdown(f"*{text(lang, 'error.code', code=code(code_))}*"),
    ]
    return card(text(lang, "error.title"), "red", elements)


def budget_line(key: str, view: BudgetView, lang: Lang) -> str:
    """``key`` (``budget.reached``, ``budget.warning``) for the day's or the turn's budget, with
    its figures."""
    share = view.used * 100 // view.allowance if view.allowance > 0 else 100
    return text(
        lang,
        f"{key}.{view.scope}",
        used=f"{view.used:,}",
        allowance=f"{view.allowance:,}",
        share=share,
    )


def budget_reached_card(view: BudgetView, asked: bool, lang: Lang, refused: bool = False) -> Card:
    """In the turn's topic: a budget is spent (``refused``: before the turn could start), and
    whether the owner was asked to extend it."""
    elements: list[Element] = []
    if refused:
        elements.append(markdown(text(lang, "budget.refused")))
    elements.append(markdown(budget_line("budget.reached", view, lang)))
    elements.append(markdown(text(lang, "budget.asked" if asked else "budget.ask_owner")))
    return card(text(lang, "budget.title"), "yellow", elements)


def budget_request_card(view: BudgetView, name: str, request: str, tokens: int, lang: Lang) -> Card:
    """In the owner's private chat: whose budget is spent, with the button granting the
    request (``tokens`` more for its day, once; the action table refuses anyone else)."""
    extend = button(
        text(lang, "budget.extend", tokens=f"{tokens:,}"), actions.BUDGET_EXTEND, request=request
    )
    elements: list[Element] = [
        markdown(text(lang, "budget.request", name=escape(name))),
        markdown(budget_line("budget.reached", view, lang)),
        row(extend),
    ]
    return card(text(lang, "budget.title"), "yellow", elements)


def warning_card(message: str, lang: Lang, title: str = "") -> Card:
    """A plain notice; ``message`` is shown literally."""
    return card(
        title or text(lang, "warning.title"), "yellow", [markdown(escape(message[:MESSAGE_CHARS]))]
    )


def _notice(key: str, lang: Lang, extra: list[Element] | None = None) -> Card:
    elements = [markdown(text(lang, key))] + (extra or [])
    return card(text(lang, f"{key}.title"), "yellow", elements)


def memory_disabled_card(lang: Lang) -> Card:
    """Memory is off: nothing can be read or changed, but the caller can still erase theirs."""
    erase = button(
        text(lang, "notice.memory_disabled.erase"), actions.MEMORY_ERASE_ASK, kind="danger"
    )
    extra = [markdown(text(lang, "notice.memory_disabled.erase_hint")), row(erase)]
    return _notice("notice.memory_disabled", lang, extra)


def enrollment_closed_card(lang: Lang) -> Card:
    return _notice("notice.enrollment_closed", lang)


def own_topic_card(lang: Lang) -> Card:
    """For a member who writes in another member's topic while memory is isolated."""
    return _notice("notice.own_topic", lang)


TryLater = Literal["messages", "queued"]


def try_later_card(why: TryLater, limit: int, seconds: int, code_: str, lang: Lang) -> Card:
    """A refusal that waiting cures: which per-person limit was reached, and when to try again."""
    elements: list[Element] = [
        markdown(text(lang, f"notice.try_later.{why}", limit=limit, seconds=max(1, seconds))),
        markdown(f"*{text(lang, 'error.code', code=code(code_))}*"),
    ]
    return card(text(lang, "notice.try_later.title"), "yellow", elements)


def owner_only_card(lang: Lang) -> Card:
    return _notice("notice.owner_only", lang)


def project_memory_owner_only_card(project: str, lang: Lang) -> Card:
    """A member's change of a bound group's project memory from a card, refused."""
    body = text(lang, "notice.project_memory", project=escape(project))
    return card(text(lang, "notice.owner_only.title"), "yellow", [markdown(body)])


def stale_card(lang: Lang) -> Card:
    """Replaces a card whose callback no longer matches the Hub's state."""
    return card(
        text(lang, "warning.title"),
        "grey",
        [
            markdown(text(lang, "notice.stale_card")),
            row(button(text(lang, "manage.title"), actions.MANAGE_OPEN)),
        ],
    )


def late_message_card(minutes: int, lang: Lang) -> Card:
    """The answer to a message found long after it was sent (the bot was away): not run, with
    the button its sender may press to run it."""
    run = button(text(lang, "catchup.run"), actions.CATCH_UP_RUN)
    return card(
        text(lang, "catchup.title"),
        "yellow",
        [markdown(text(lang, "catchup.body", minutes=minutes)), row(run)],
    )


def late_message_started_card(lang: Lang) -> Card:
    """The note once its message was run: the button is gone."""
    return card(text(lang, "catchup.title"), "green", [markdown(text(lang, "catchup.started"))])
