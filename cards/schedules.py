"""Cards and chat lines of schedules and triggers: a run's own card (its topic's first
message), and what a chat is told of a schedule (added, missed, paused, listed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from cards import actions
from cards.catalogue import plain_text, text
from cards.elements import Card, Element, button, card, code, escape, hr, markdown, row
from cards.models import Lang, SchedulesView, ScheduleView
from cards.times import date_time

CHANGES = ("pause", "resume", "run", "remove")

RunKind = Literal["clock", "manual", "trigger"]


def schedule_run_card(
    name: str, kind: RunKind, at: float, creator: str, zone: str, lang: Lang
) -> Card:
    """The first message of a run's topic: which schedule, for when, as whom."""
    line = text(lang, f"schedule.run.{kind}", time=date_time(at, zone), creator=escape(creator))
    return card(text(lang, "schedule.run.title", name=name), "wathet", [markdown(line)])


def schedule_list_text(lines: Sequence[ScheduleView], zone: str, lang: Lang) -> str:
    if not lines:
        return plain_text(lang, "schedule.none")
    rows = [plain_text(lang, "schedule.list.title")]
    for line in lines:
        upcoming = (
            date_time(line.next_run_at, zone)
            if line.active and line.next_run_at is not None
            else plain_text(
                lang, "schedule.list.paused" if not line.active else "schedule.list.no_next"
            )
        )
        rows.append(
            plain_text(
                lang,
                "schedule.list.line",
                id=line.id,
                name=line.name,
                when=line.when,
                next=upcoming,
                last=line.last_result or "-",
            )
        )
    return "\n".join(rows)


def schedules_section(view: SchedulesView, lang: Lang, draft: dict[str, Any]) -> list[Element]:
    """The `/amux` card's Schedules: each with its next run and last result, and the buttons
    its creator or the owner may use (the Hub decides again on each click)."""
    elements: list[Element] = [hr(), markdown(text(lang, "manage.schedules"))]
    if not view.schedules:
        elements.append(markdown(text(lang, "manage.schedules.none")))
    for schedule in view.schedules:
        upcoming = (
            date_time(schedule.next_run_at, view.zone)
            if schedule.active and schedule.next_run_at is not None
            else text(lang, "schedule.list.no_next" if schedule.active else "schedule.list.paused")
        )
        elements.append(
            markdown(
                text(
                    lang,
                    "manage.schedules.line",
                    name=escape(schedule.name),
                    when=code(schedule.when),
                    next=upcoming,
                    last=escape(schedule.last_result or "-"),
                    creator=escape(schedule.creator or "-"),
                )
            )
        )
        toggle = "pause" if schedule.active else "resume"
        elements.append(
            row(
                *(
                    button(
                        text(lang, f"schedule.button.{change}"),
                        actions.SCHEDULE_CHANGE,
                        kind="danger" if change == "remove" else "default",
                        **{**draft, "schedule": schedule.id, "change": change},
                    )
                    for change in (toggle, "run", "remove")
                )
            )
        )
    if view.more:
        elements.append(markdown(text(lang, "manage.schedules.more", more=view.more)))
    return elements
